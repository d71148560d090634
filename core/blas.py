"""Fast float32 matrix products for MLX's Linux CPU backend, with the same result for a row at any batch shape.

Why: the `mlx[cpu]` Linux wheel links the reference BLAS. Its `sgemm` runs at about 1.5 GFLOP/s here, and
a product costs in proportion to its rows, so a verify of K tokens costs K plain steps and a batch of B streams
costs B solo ones. numpy's wheel ships OpenBLAS (ILP64: symbols prefixed `scipy_`, suffixed `64_`). Through it,
a product of 8 rows costs about what one row does (the weights are read once), and a prefill runs 6-8 times
faster (measured on 1536-wide products).

How: a small C library defines `cblas_sgemm`: wide products run in its own kernel, narrow ones through numpy's
OpenBLAS. It is loaded with RTLD_GLOBAL before mlx is: `libmlx.so` leaves `cblas_sgemm` undefined, and the dynamic
linker resolves it in the global scope before libmlx's own dependencies (where the reference BLAS sits). Python
loads extensions RTLD_NOW, so the symbol binds when `mlx.core` is imported, which is why `install` must come first.
Only float32 products gain. bf16, float16 and 4-bit ones run in MLX's own CPU kernels.

Exactness: drafted greedy output must equal plain output token for token, and a batched stream must equal
the same request alone. So a row's product must not depend on how many rows share the call (a verify of K
tokens against a plain step, a batch against one stream, a prefill in chunks against a whole one), on how many
columns it has (attention scores over more keys), or on zero terms before or after its own (attention
probabilities over a longer, masked key range, a sliding window's masked start). The reference BLAS sums each
element in one fixed order and skips zeros, so it is exact in that sense. OpenBLAS is not: it picks a kernel
from the shape (gemv for one row, a "small matrix" kernel for small ones, the blocked kernel otherwise) and
splits K by its length, and each has its own order of additions. So the same row can come out a few ulps
apart: of the 34 comparisons in `tests/unit/test_blas.py`, 20 differ on plain OpenBLAS. So the forwarder does
this.
- Products with B transposed (x @ W.T for every weight, and q @ k.T) take one of two paths, chosen by K alone.
  K is a weight's width or the head size, so it does not move with the context, and a given product always
  takes the same path.
  - From K = OWN_KERNEL_MIN_K (1536, every real Gemma 4 target's width) they go through the forwarder's own kernel.
    Each element is LANES = 8 partial sums over K (lane l takes every 8th term from l, in order), combined
    in one fixed tree, then the last K mod 8 terms in order, with no FMA. That order depends on K alone,
    not on the rows, the columns or the blocking. A block of 4 rows x 4 weight rows keeps its sums in
    registers, so one row costs about a matrix-vector product (bandwidth-bound), where OpenBLAS's sgemm
    over 8 padded rows cost 3x that. It is built with AVX2 where the CPU has it; the lanes are independent
    IEEE adds and multiplies, so the vector width does not change a bit.
  - Below that K they go to OpenBLAS in calls of one shape only. Rows go ROWS at a time, and a short last
    chunk is zero-padded. Columns go in blocks of a width that depends on K alone (64 up to K = 64, else
    COLUMN_BLOCK), likewise padded. K goes in blocks of K_BLOCK counted from 0, each block adding onto C.
    Then every element goes through the same kernel with the same additions at any row or column count.
    Narrow products (the demo's, the pack's, attention's scores) are cheaper this way: the own kernel's
    per-element sums cost more than the padding there.
- Products with B as it lies (attention's probabilities @ values, whose K is the number of keys) are summed
  by the forwarder itself, one term at a time in order, skipping zero terms as the reference BLAS does. There
  is no FMA (-ffp-contract=off). They are a small share of the work.

Measured: none of the comparisons in `tests/unit/test_blas.py` differ on either path; the own kernel's bits
are those of the same order of additions written in numpy, and incremental decoding equals a fresh prefill
bit for bit on the pack's E-style and MoE targets. The engine and unit tests (1117) also passed with every
such product on the own kernel (GEMMA_CHAT_OWN_KERNEL_MIN_K=1 does that). The sizes were timed here
(SkylakeX, one thread):
- The own kernel, per product through MLX, against the padded OpenBLAS path, for 1, 4, 8 and 16 rows:
  1536 x 12288 (E2B's gate/up) 3.9 / 5.6 / 11.2 / 20.3 ms against 8.5 / 8.5 / 8.9 / 17.4; 6144 x 1536
  1.6 / 3.0 / 5.2 / 9.1 ms against 4.4 / 4.3 / 4.8 / 9.4. numpy's gemv takes 2.6 and 1.6 ms for one row.
  On 1024-wide products 8 rows cost 1.2-1.7x the padded path, which is why the threshold is 1536.
- A synthetic pairing of E2B's widths (`scripts/build_bench_pairing.py --size e2b-wide`, acceptance
  simulated at 0.8, `gemma-chat bench`, two alternations): a plain step 129 -> 67-84 ms, drafter off
  7.2 -> 13.9-15.8 tok/s, K=2 12-13 -> 20-21, K=4 19-22 -> 27-28, K=8 20-24 -> 19. The best block size went
  from K=8 at 19.7-23.8 tok/s to K=4 at 26.5-28.1. A 282-token prefill was 5-11 % slower (194-219 ->
  187-194 tok/s): many rows favour OpenBLAS's FMA kernel.
- ROWS = 8 puts a verify of up to 8 tokens in one padded call. COLUMN_BLOCK = 128 runs at about 50 GFLOP/s
  at K >= 256; 256 columns fall to about 18, because OpenBLAS's path changes there. K_BLOCK = 384 is one
  OpenBLAS K block.

It is Linux only: macOS builds link Accelerate. It needs a C compiler (MLX's CPU backend needs one for its
kernels anyway). The library is built once into gemma-chat's private kernel folder, and every process loads
it from there. GEMMA_CHAT_BLAS=reference keeps MLX's own BLAS (for A/B runs). OpenBLAS runs one thread:
decode's products are small, and its spinning pool competes with MLX's threads for the cores. Anything
missing means the reference BLAS, with the reason in `gemma-chat doctor`.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ENV = "GEMMA_CHAT_BLAS"  # "reference": keep MLX's bundled BLAS
ROWS = 8
K_BLOCK = 384
COLUMN_BLOCK = 128
OWN_KERNEL_MIN_K = 1536  # products this wide (every real Gemma 4 target's) go through the forwarder's own kernel
MIN_K_ENV = "GEMMA_CHAT_OWN_KERNEL_MIN_K"  # another threshold, for A/B runs and tests (1: every product)


def _own_kernel_min_k() -> int:
    value = os.environ.get(MIN_K_ENV, "").strip()
    return max(1, int(value)) if value.isdigit() else OWN_KERNEL_MIN_K


SOURCE = Path(__file__).with_name("blas_forwarder.c")


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


FLAGS = [
    "-O3",
    "-ffp-contract=off",
    "-shared",
    "-fPIC",
    f"-DROWS={ROWS}",
    f"-DK_BLOCK={K_BLOCK}",
    f"-DCOLUMN_BLOCK={COLUMN_BLOCK}",
]


@dataclass(frozen=True)
class BlasChoice:
    fast: bool  # True: float32 products go through numpy's OpenBLAS
    description: str  # one line for doctor and bench


_choice: BlasChoice | None = None
_forwarder: ctypes.CDLL | None = None


def _openblas_path() -> Path | None:
    spec = importlib.util.find_spec("numpy")  # finds it without importing numpy
    if spec is None or spec.origin is None:
        return None
    libs = Path(spec.origin).parent.parent / "numpy.libs"
    found = sorted(libs.glob("libscipy_openblas64_*.so*"))
    return found[0] if found else None


def _compiler() -> str | None:
    for name in (os.environ.get("CC", "").strip(), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return name
    return None


def _build(folder: Path, compiler: str, min_k: int, avx2: bool) -> Path:
    """The forwarder library in `folder`, built once per source and flags (a few hundred ms). AVX2 where the CPU
    has it: wider vectors for the same lanes, so the same bits (see blas_forwarder.c); the flags are part of the
    library's name, so a home shared with an older CPU builds that CPU its own."""
    flags = [*FLAGS, f"-DOWN_KERNEL_MIN_K={min_k}"] + (["-mavx2"] if avx2 else [])
    digest = hashlib.sha256(SOURCE.read_bytes() + " ".join(flags).encode()).hexdigest()[:16]
    library = folder / "blas" / f"gemma_chat_sgemm_{digest}.so"
    if library.is_file():
        return library
    library.parent.mkdir(mode=0o700, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=library.parent) as scratch:
        built = Path(scratch) / library.name
        subprocess.run(
            [compiler, *flags, "-x", "c", str(SOURCE), "-o", str(built)],
            check=True,
            capture_output=True,
            timeout=120,
        )
        built.replace(library)  # atomic: another process building the same file is harmless
    return library


def install(folder: Path | None) -> BlasChoice:
    """Route MLX's float32 products to numpy's OpenBLAS, building the forwarder into `folder` (the private
    kernel folder; None: it was refused, and nothing is built or loaded). Before mlx is imported; the first
    call decides."""
    global _choice
    if _choice is None:
        _choice = _install(folder)
    return _choice


def _install(folder: Path | None) -> BlasChoice:
    global _forwarder
    reference = "MLX's own reference BLAS"
    if not sys.platform.startswith("linux"):
        return BlasChoice(False, "the platform's BLAS (MLX's build)")
    if os.environ.get(ENV, "").strip().lower() == "reference":
        return BlasChoice(False, f"{reference} ({ENV}=reference)")
    if folder is None:
        return BlasChoice(False, f"{reference} (the kernel folder was refused: nothing is built or loaded)")
    if "mlx.core" in sys.modules:
        return BlasChoice(False, f"{reference} (mlx was imported before gemma-chat could choose)")
    openblas_file = _openblas_path()
    if openblas_file is None:
        return BlasChoice(False, f"{reference} (numpy's OpenBLAS was not found)")
    compiler = _compiler()
    if compiler is None:
        return BlasChoice(False, f"{reference} (no C compiler to build the OpenBLAS forwarder)")
    try:
        openblas = ctypes.CDLL(str(openblas_file))
        sgemm = openblas.scipy_cblas_sgemm64_
        if "OPENBLAS_NUM_THREADS" not in os.environ:
            openblas.scipy_openblas_set_num_threads64_(1)
        config = openblas.scipy_openblas_get_config64_
        config.restype = ctypes.c_char_p
        version = (config() or b"OpenBLAS").decode(errors="replace").split()
        core = openblas.scipy_openblas_get_corename64_
        core.restype = ctypes.c_char_p
        cpu = (core() or b"").decode(errors="replace")
        threads = int(openblas.scipy_openblas_get_num_threads64_())
        min_k, avx2 = _own_kernel_min_k(), "avx2" in _cpu_flags()
        library = _build(folder, compiler, min_k, avx2)
        forwarder = ctypes.CDLL(str(library))  # local first: its cblas_sgemm is not anyone's until it works
        forwarder.gemma_chat_sgemm_use(ctypes.cast(sgemm, ctypes.c_void_p))
        forwarder.gemma_chat_sgemm_calls.restype = ctypes.c_int64
        ctypes.CDLL(str(library), mode=ctypes.RTLD_GLOBAL)  # the same library, now in the global scope
    except (OSError, AttributeError, subprocess.SubprocessError) as e:
        detail = e.stderr.decode(errors="replace").strip() if isinstance(e, subprocess.CalledProcessError) else e
        return BlasChoice(False, f"{reference} (the OpenBLAS forwarder failed: {str(detail)[:200]})")
    _forwarder = forwarder
    name = " ".join(version[:2])
    where = ", ".join(part for part in (cpu, f"{threads} thread" + ("s" if threads != 1 else "")) if part)
    own = f"gemma-chat's kernel from {min_k} wide ({'AVX2' if avx2 else 'SSE2'})"
    return BlasChoice(True, f"{name} from numpy ({where}) and {own}, exact per row")


def active() -> BlasChoice | None:
    """What `install` decided in this process (None: it was not called)."""
    return _choice


def forwarded_calls() -> int | None:
    """How many float32 products went through the forwarder so far (None: it is not loaded)."""
    return int(_forwarder.gemma_chat_sgemm_calls()) if _forwarder is not None else None
