"""Fast float32 matrix products for MLX's Linux CPU backend, with the same result for a row at any batch shape.

Why: the `mlx[cpu]` Linux wheel links the reference BLAS. Its `sgemm` runs at about 1.5 GFLOP/s here, and
a product costs in proportion to its rows, so a verify of K tokens costs K plain steps and a batch of B streams
costs B solo ones. numpy's wheel ships OpenBLAS (ILP64: symbols prefixed `scipy_`, suffixed `64_`). Through it,
a product of 8 rows costs about what one row does (the weights are read once), and a prefill runs 6-8 times
faster (measured on 1536-wide products).

How: a small C library defines `cblas_sgemm` and forwards it to numpy's OpenBLAS. It is loaded with RTLD_GLOBAL
before mlx is: `libmlx.so` leaves `cblas_sgemm` undefined, and the dynamic linker resolves it in the global
scope before libmlx's own dependencies (where the reference BLAS sits). Python loads extensions RTLD_NOW, so
the symbol binds when `mlx.core` is imported, which is why `install` must come first. Only float32 products
gain. bf16, float16 and 4-bit ones run in MLX's own CPU kernels.

Exactness: drafted greedy output must equal plain output token for token, and a batched stream must equal
the same request alone. So a row's product must not depend on how many rows share the call (a verify of K
tokens against a plain step, a batch against one stream, a prefill in chunks against a whole one), on how many
columns it has (attention scores over more keys), or on zero terms before or after its own (attention
probabilities over a longer, masked key range, a sliding window's masked start). The reference BLAS sums each
element in one fixed order and skips zeros, so it is exact in that sense. OpenBLAS is not: it picks a kernel
from the shape (gemv for one row, a "small matrix" kernel for small ones, the blocked kernel otherwise) and
splits K by its length, and each has its own order of additions. So the same row can come out a few ulps
apart: of the 34 comparisons in `tests/unit/test_blas.py`, 20 differ on plain OpenBLAS. So the forwarder does two
things.
- Products with B transposed (x @ W.T for every weight, and q @ k.T) go to OpenBLAS in calls of one shape
  only. Rows go ROWS at a time, and a short last chunk is zero-padded. Columns go in blocks of a width that
  depends on K alone (64 up to K = 64, else COLUMN_BLOCK), likewise padded. K goes in blocks of K_BLOCK
  counted from 0, each block adding onto C. Then every element goes through the same kernel with the same
  additions at any row or column count. Their K is a weight's width or the head size, so it does not move
  with the context.
- Products with B as it lies (attention's probabilities @ values, whose K is the number of keys) are summed
  by the forwarder itself, one term at a time in order, skipping zero terms as the reference BLAS does. There
  is no FMA (-ffp-contract=off). They are a small share of the work.

Measured: none of those 34 differ, and incremental decoding equals a fresh prefill bit for bit on the pack's E-style
and MoE targets, as with the reference BLAS. The sizes were timed on OpenBLAS's own calls here (SkylakeX):
- ROWS = 8 puts a verify of up to 8 tokens in one call. A single row costs no more than with the reference
  BLAS: the weights are read once either way.
- COLUMN_BLOCK = 128 runs at about 50 GFLOP/s at K >= 256. 256 columns fall to about 18: OpenBLAS's path
  changes there.
- K_BLOCK = 384 is one OpenBLAS K block. A smaller block re-reads C more often.
- Narrow products (the demo's 128-wide ones, scores over a few keys) cost about what the reference BLAS
  takes for them, and every wider one costs less.

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

SOURCE = Path(__file__).with_name("blas_forwarder.c")
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


def _build(folder: Path, compiler: str) -> Path:
    """The forwarder library in `folder`, built once per source (a few hundred ms)."""
    digest = hashlib.sha256(SOURCE.read_bytes() + " ".join(FLAGS).encode()).hexdigest()[:16]
    library = folder / "blas" / f"gemma_chat_sgemm_{digest}.so"
    if library.is_file():
        return library
    library.parent.mkdir(mode=0o700, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=library.parent) as scratch:
        built = Path(scratch) / library.name
        subprocess.run(
            [compiler, *FLAGS, "-x", "c", str(SOURCE), "-o", str(built)],
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
        library = _build(folder, compiler)
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
    return BlasChoice(True, f"{name} from numpy ({where}), exact per row")


def active() -> BlasChoice | None:
    """What `install` decided in this process (None: it was not called)."""
    return _choice


def forwarded_calls() -> int | None:
    """How many float32 products went through the forwarder so far (None: it is not loaded)."""
    return int(_forwarder.gemma_chat_sgemm_calls()) if _forwarder is not None else None
