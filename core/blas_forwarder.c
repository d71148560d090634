/* MLX's cblas_sgemm, with the same result for a row at any shape (column-major calls go to numpy's OpenBLAS).
   Built and loaded by core/blas.py, which says why; ROWS, K_BLOCK, COLUMN_BLOCK and OWN_KERNEL_MIN_K come from
   there (-D). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
enum { ROW_MAJOR = 101, NO_TRANS = 111 };
typedef void (*sgemm64_fn)(int, int, int, int64_t, int64_t, int64_t, float, const float *, int64_t,
                           const float *, int64_t, float, float *, int64_t);
static sgemm64_fn impl;
static int64_t calls;

void gemma_chat_sgemm_use(void *fn) { impl = (sgemm64_fn)fn; }
int64_t gemma_chat_sgemm_calls(void) { return __atomic_load_n(&calls, __ATOMIC_RELAXED); }

/* Per-thread scratch, kept between calls: a malloc of this size per product is an mmap and page faults. */
static float *scratch(float **buffer, size_t *capacity, size_t floats) {
  if (*capacity < floats) {
    free(*buffer);
    *buffer = calloc(floats, sizeof(float));
    if (*buffer == NULL) abort();
    *capacity = floats;
  }
  return *buffer;
}

/* B as it lies in memory (k rows of n): attention's probabilities times its values, whose k is the number of
   keys. Every element is summed in order from k = 0, one term at a time (no FMA: -ffp-contract=off), so
   zero terms before or after a row's keys (a masked window) change nothing. Rows go ROWS at a time so that
   each B row is read once per group; the order of additions per element is the same in any group. */
#define COLUMNS 64
static void sgemm_in_order(int trans_a, int m, int n, int k, float alpha, const float *a, int lda,
                           const float *b, int ldb, float beta, float *c, int ldc) {
  float acc[ROWS][COLUMNS];
  for (int i0 = 0; i0 < m; i0 += ROWS) {
    int rows = m - i0 < ROWS ? m - i0 : ROWS;
    for (int j0 = 0; j0 < n; j0 += COLUMNS) {
      int cols = n - j0 < COLUMNS ? n - j0 : COLUMNS;
      memset(acc, 0, sizeof acc);
      for (int p = 0; p < k; p++) {
        const float *b_row = b + (int64_t)p * ldb + j0;
        for (int i = 0; i < rows; i++) {
          float x = trans_a == NO_TRANS ? a[(int64_t)(i0 + i) * lda + p] : a[(int64_t)p * lda + i0 + i];
          if (x == 0.0f) continue; /* a masked key (the reference BLAS skips zeros too) */
          for (int j = 0; j < cols; j++) acc[i][j] = acc[i][j] + x * b_row[j];
        }
      }
      for (int i = 0; i < rows; i++) {
        float *out = c + (int64_t)(i0 + i) * ldc + j0;
        for (int j = 0; j < cols; j++) out[j] = alpha * acc[i][j] + (beta != 0.0f ? beta * out[j] : 0.0f);
      }
    }
  }
}

/* B transposed (a weight W [n, k] row-major, or attention's keys): C[i, j] = alpha sum_p A[i, p] W[j, p] + beta C.
   Every element is summed the same way whatever the shape: LANES partial sums over p (lane l takes
   p = l, l + LANES, ... up to the last whole group of LANES, in increasing p), combined in one fixed tree,
   then the last k mod LANES terms in order. That order depends on k alone, not on how many rows (a verify
   against a plain step, a batch against one stream) or columns (scores over more keys) share the call, nor
   on where a row or column falls in the blocking. The lanes are independent IEEE adds and multiplies (no
   FMA: -ffp-contract=off), so a vectorising compiler gives the same bits at any vector width. A block of
   ROW_BLOCK rows x KERNEL_COLUMNS weight rows keeps its partial sums in registers and reads each weight row
   once per ROW_BLOCK rows: one row costs about a matrix-vector product (bandwidth-bound), several rows
   little more. */
#define LANES 8
#define ROW_BLOCK 4
#define KERNEL_COLUMNS 4
typedef float partial_sums[KERNEL_COLUMNS][LANES];

static inline float combine(const float *s) {
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

/* Each block size gets its own copy of the loop, with its bounds known to the compiler (it unrolls and keeps
   the sums in registers); `cols` short of KERNEL_COLUMNS takes the generic copy. */
#define BLOCK(R)                                                                                                 \
  static void block_##R(int cols, int whole_k, const float *a, int64_t lda, const float *w, int64_t ldw,        \
                        partial_sums *acc) {                                                                     \
    if (cols == KERNEL_COLUMNS) {                                                                                \
      for (int p = 0; p < whole_k; p += LANES)                                                                   \
        for (int r = 0; r < R; r++)                                                                              \
          for (int j = 0; j < KERNEL_COLUMNS; j++)                                                               \
            for (int l = 0; l < LANES; l++)                                                                      \
              acc[r][j][l] = acc[r][j][l] + a[(int64_t)r * lda + p + l] * w[(int64_t)j * ldw + p + l];           \
    } else {                                                                                                     \
      for (int p = 0; p < whole_k; p += LANES)                                                                   \
        for (int r = 0; r < R; r++)                                                                              \
          for (int j = 0; j < cols; j++)                                                                         \
            for (int l = 0; l < LANES; l++)                                                                      \
              acc[r][j][l] = acc[r][j][l] + a[(int64_t)r * lda + p + l] * w[(int64_t)j * ldw + p + l];           \
    }                                                                                                            \
  }
BLOCK(1)
BLOCK(2)
BLOCK(3)
BLOCK(4)

static void times_rows(int m, int n, int k, float alpha, const float *a, int64_t lda, const float *w, int64_t ldw,
                       float beta, float *c, int ldc) {
  int whole_k = k / LANES * LANES;
  for (int j0 = 0; j0 < n; j0 += KERNEL_COLUMNS) {
    int cols = n - j0 < KERNEL_COLUMNS ? n - j0 : KERNEL_COLUMNS;
    const float *wb = w + (int64_t)j0 * ldw;
    for (int i0 = 0; i0 < m; i0 += ROW_BLOCK) {
      int rows = m - i0 < ROW_BLOCK ? m - i0 : ROW_BLOCK;
      const float *ab = a + (int64_t)i0 * lda;
      partial_sums acc[ROW_BLOCK];
      memset(acc, 0, sizeof acc);
      switch (rows) {
        case 4: block_4(cols, whole_k, ab, lda, wb, ldw, acc); break;
        case 3: block_3(cols, whole_k, ab, lda, wb, ldw, acc); break;
        case 2: block_2(cols, whole_k, ab, lda, wb, ldw, acc); break;
        default: block_1(cols, whole_k, ab, lda, wb, ldw, acc); break;
      }
      for (int r = 0; r < rows; r++)
        for (int j = 0; j < cols; j++) {
          float sum = combine(acc[r][j]);
          for (int p = whole_k; p < k; p++) sum = sum + ab[(int64_t)r * lda + p] * wb[(int64_t)j * ldw + p];
          float *out = c + (int64_t)(i0 + r) * ldc + j0 + j;
          *out = alpha * sum + (beta != 0.0f ? beta * *out : 0.0f); /* beta 0: C is written, not read */
        }
    }
  }
}

/* Columns per OpenBLAS call: a function of k alone, which is fixed where a product comes from (a weight's
   width, the head size), so one product always gets one shape. Narrow products get narrow blocks: padding a
   handful of columns (attention scores over a few keys) to COLUMN_BLOCK would cost more than the product. */
static int column_block(int k) { return k <= 64 ? 64 : COLUMN_BLOCK; }

/* B transposed, in OpenBLAS calls of one shape only: ROWS x column_block(k) x K_BLOCK (see core/blas.py). For
   products whose k is under OWN_KERNEL_MIN_K (narrow weights, attention's scores): there the padded calls cost
   less than `times_rows` at several rows (the demo's 128-wide products; 1024-wide ones at 8 rows). */
static void padded_openblas(int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a, int lda,
                            const float *b, int ldb, float beta, float *c, int ldc) {
  static __thread float *rows_buffer, *columns_buffer;
  static __thread size_t rows_capacity, columns_capacity;
  int64_t k_padded = k <= 0 ? K_BLOCK : ((int64_t)k + K_BLOCK - 1) / K_BLOCK * K_BLOCK;
  /* ROWS rows of A, zero-padded; a short column block of B^T (its rows past the short block's end hold
     whatever an earlier call left: they only reach columns of C that are thrown away); a short block of C */
  float *rows_in = scratch(&rows_buffer, &rows_capacity, (size_t)ROWS * k_padded);
  int width = column_block(k);
  float *b_pad = scratch(&columns_buffer, &columns_capacity, (size_t)width * K_BLOCK);
  float c_pad[ROWS * COLUMN_BLOCK];
  for (int i0 = 0; i0 < m; i0 += ROWS) {
    int rows = m - i0 < ROWS ? m - i0 : ROWS;
    memset(rows_in, 0, sizeof(float) * ROWS * k_padded);
    for (int i = 0; i < rows; i++)
      for (int p = 0; p < k; p++)
        rows_in[i * k_padded + p] = trans_a == NO_TRANS ? a[(int64_t)(i0 + i) * lda + p] : a[(int64_t)p * lda + i0 + i];
    for (int j0 = 0; j0 < n; j0 += width) {
      int cols = n - j0 < width ? n - j0 : width;
      int whole = rows == ROWS && cols == width;
      float *out = whole ? c + (int64_t)i0 * ldc + j0 : c_pad;
      int64_t ld_out = whole ? ldc : width;
      if (!whole && beta != 0.0f) /* beta 0: OpenBLAS writes C without reading it */
        for (int i = 0; i < rows; i++) memcpy(c_pad + i * width, c + (int64_t)(i0 + i) * ldc + j0, sizeof(float) * cols);
      int64_t k0 = 0;
      do {
        int kb = k - k0 < K_BLOCK ? (int)(k - k0) : K_BLOCK;
        const float *cols_in = b + (int64_t)j0 * ldb + k0; /* B^T's rows j0.. (n x k, row-major) */
        int64_t ld_in = ldb;
        if (cols < width) {
          for (int j = 0; j < cols; j++) memcpy(b_pad + j * K_BLOCK, cols_in + (int64_t)j * ldb, sizeof(float) * kb);
          cols_in = b_pad;
          ld_in = K_BLOCK;
        }
        impl(ROW_MAJOR, NO_TRANS, trans_b, ROWS, width, kb, alpha, rows_in + k0, k_padded, cols_in, ld_in,
             k0 == 0 ? beta : 1.0f, out, ld_out);
        k0 += K_BLOCK;
      } while (k0 < k);
      if (!whole)
        for (int i = 0; i < rows; i++)
          memcpy(c + (int64_t)(i0 + i) * ldc + j0, c_pad + i * width, sizeof(float) * cols);
    }
  }
}

/* C[m, n] = alpha A[m, k] B[k, n] + beta C, row-major. B transposed (every weight, and attention's keys): by
   `times_rows` from k = OWN_KERNEL_MIN_K up, else `padded_openblas`; which one depends on k alone, fixed for a
   given weight (its width) or head size, so a row always meets the same one. B as it lies: `sgemm_in_order`.
   Column-major calls (MLX makes none) go to OpenBLAS as they are. */
void cblas_sgemm(int order, int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a,
                 int lda, const float *b, int ldb, float beta, float *c, int ldc) {
  __atomic_fetch_add(&calls, 1, __ATOMIC_RELAXED);
  if (order != ROW_MAJOR) {
    impl(order, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  if (m <= 0 || n <= 0) return;
  if (trans_b == NO_TRANS) {
    sgemm_in_order(trans_a, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  if (k < OWN_KERNEL_MIN_K) {
    padded_openblas(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  if (trans_a == NO_TRANS) {
    times_rows(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  /* A transposed: its rows gathered first (a k x m view; MLX passes these for some transposed inputs) */
  static __thread float *gathered;
  static __thread size_t gathered_capacity;
  float *rows_in = scratch(&gathered, &gathered_capacity, (size_t)m * k);
  for (int i = 0; i < m; i++)
    for (int p = 0; p < k; p++) rows_in[(int64_t)i * k + p] = a[(int64_t)p * lda + i];
  times_rows(m, n, k, alpha, rows_in, k, b, ldb, beta, c, ldc);
}
