"""core.blas: MLX's float32 products through numpy's OpenBLAS, with the same result for a row at any shape.

The suite's own process installs the forwarder at start-up (tests/conftest.py calls
`use_private_kernel_cache`, as every entry point does), so the engine tests run on it."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from core import blas

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the forwarder is Linux only")

ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112


def _forwarder() -> ctypes.CDLL:
    if blas._forwarder is None:
        pytest.fail(f"the suite runs without the forwarder: {blas.active()}")
    return blas._forwarder


def _sgemm(fn, a: np.ndarray, w: np.ndarray, int64: bool) -> np.ndarray:
    """a (m, k) @ w.T, w (n, k) row-major, through `fn` (a cblas_sgemm with 32- or 64-bit sizes)."""
    m, k = a.shape
    n = w.shape[0]
    c = np.zeros((m, n), np.float32)
    size = ctypes.c_int64 if int64 else ctypes.c_int
    ptr = ctypes.POINTER(ctypes.c_float)
    fn.argtypes = [ctypes.c_int] * 3 + [size] * 3 + [ctypes.c_float, ptr, size, ptr, size, ctypes.c_float, ptr, size]
    fn(ROW_MAJOR, NO_TRANS, TRANS, m, n, k, 1.0, a.ctypes.data_as(ptr), k, w.ctypes.data_as(ptr), k, 0.0,
       c.ctypes.data_as(ptr), n)  # fmt: skip
    return c


def _mismatches(fn, int64: bool) -> int:
    """Rows whose product differs between a call of m rows and the same row alone, and products whose first
    columns change with more columns, over shapes where OpenBLAS would pick different kernels (one row,
    small, blocked) or split K differently."""
    rng = np.random.default_rng(0)
    bad = 0
    for k, n in [(1000, 333), (640, 262), (1536, 512), (300, 2048), (2053, 131)]:  # 1536 up: the own kernel
        w = rng.standard_normal((n, k), dtype=np.float32)
        a = rng.standard_normal((17, k), dtype=np.float32)
        for m in (2, 4, 9, 17):
            full = _sgemm(fn, a[:m], w, int64)
            bad += sum(not np.array_equal(full[i], _sgemm(fn, a[i : i + 1], w, int64)[0]) for i in (0, m - 1))
    for k, n in [(48, 100), (96, 120), (1541, 37)]:  # more columns (attention scores over more keys)
        w = rng.standard_normal((2 * n, k), dtype=np.float32)
        a = rng.standard_normal((3, k), dtype=np.float32)
        bad += not np.array_equal(_sgemm(fn, a, w[:n], int64), _sgemm(fn, a, w, int64)[:, :n])
    return bad


def test_the_forwarder_gives_a_row_the_same_product_at_any_shape_and_plain_openblas_does_not():
    openblas = ctypes.CDLL(str(blas._openblas_path()))
    assert _mismatches(openblas.scipy_cblas_sgemm64_, int64=True) > 0  # what the forwarder is for
    assert _mismatches(_forwarder().cblas_sgemm, int64=False) == 0


def _in_the_own_kernels_order(a: np.ndarray, w: np.ndarray) -> np.ndarray:
    """a @ w.T summed as core/blas_forwarder.c's `times_rows` sums it, in float32: 8 lanes over k (lane l
    takes k = l, l + 8, ...), combined ((0+1)+(2+3))+((4+5)+(6+7)), then the last k mod 8 terms in order."""
    m, k = a.shape
    whole = k // 8 * 8
    lanes = np.zeros((m, w.shape[0], 8), np.float32)
    for p in range(0, whole, 8):
        lanes = lanes + a[:, None, p : p + 8] * w[None, :, p : p + 8]
    s = lanes
    total = ((s[..., 0] + s[..., 1]) + (s[..., 2] + s[..., 3])) + ((s[..., 4] + s[..., 5]) + (s[..., 6] + s[..., 7]))
    for p in range(whole, k):
        total = total + a[:, None, p] * w[None, :, p]
    return total


def test_wide_products_are_summed_in_one_fixed_order_and_narrow_ones_are_not():
    rng = np.random.default_rng(2)
    for k, m, n in [(blas.OWN_KERNEL_MIN_K, 5, 9), (2053, 3, 6), (6144, 1, 4)]:
        a, w = rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((n, k), dtype=np.float32)
        assert np.array_equal(_sgemm(_forwarder().cblas_sgemm, a, w, int64=False), _in_the_own_kernels_order(a, w))
    a, w = rng.standard_normal((4, 1000), dtype=np.float32), rng.standard_normal((64, 1000), dtype=np.float32)
    assert not np.array_equal(_sgemm(_forwarder().cblas_sgemm, a, w, int64=False), _in_the_own_kernels_order(a, w))


def test_mlx_products_go_through_the_forwarder_and_agree_with_float64():
    import mlx.core as mx

    before = blas.forwarded_calls()
    rng = np.random.default_rng(1)
    a, w = rng.standard_normal((5, 700), dtype=np.float32), rng.standard_normal((300, 700), dtype=np.float32)
    got = np.array(mx.array(a) @ mx.array(w).T)
    assert blas.forwarded_calls() > before
    np.testing.assert_allclose(got, a.astype(np.float64) @ w.T.astype(np.float64), rtol=1e-4, atol=1e-3)
    # C = alpha A B + beta C with a short last chunk of rows and a transposed A, narrow (OpenBLAS) and wide
    for k in (700, blas.OWN_KERNEL_MIN_K + 3):
        w = rng.standard_normal((300, k), dtype=np.float32)
        c = rng.standard_normal((11, 300), dtype=np.float32)
        at = mx.array(rng.standard_normal((k, 11), dtype=np.float32))
        got = np.array(mx.addmm(mx.array(c), at.T, mx.array(w).T, alpha=0.5, beta=2.0))
        want = 0.5 * (np.array(at).T.astype(np.float64) @ w.T.astype(np.float64)) + 2.0 * c
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)


def test_attention_rows_are_unchanged_by_more_rows_more_keys_or_masked_keys_around_them():
    """A verify's query rows see the cache plus masked future keys; a plain step sees the cache alone; a
    fresh prefill's sliding layers see every key, masked outside the window, where the decode cache holds
    only the window."""
    import mlx.core as mx

    mx.random.seed(0)
    for head_dim, keys in [(256, 485), (512, 240), (64, 1300), (48, 100)]:
        q, k = mx.random.normal((1, head_dim)), mx.random.normal((2 * keys, head_dim))
        v, p = mx.random.normal((2 * keys, head_dim)), mx.random.uniform(shape=(1, keys))
        alone_scores, alone_out = np.array(q @ k[:keys].T), np.array(p @ v[:keys])
        for extra in (1, 4, 9, keys):
            rows = mx.concatenate([q, mx.random.normal((extra, head_dim))])
            assert np.array_equal(np.array(rows @ k[: keys + extra].T)[:1, :keys], alone_scores)
            weights = mx.concatenate([mx.concatenate([p, mx.zeros((1, extra))], axis=1), mx.ones((3, keys + extra))])
            assert np.array_equal(np.array(weights @ v[: keys + extra])[:1], alone_out)
            masked_start = mx.concatenate([mx.zeros((1, extra)), p], axis=1)
            assert np.array_equal(
                np.array(masked_start @ mx.concatenate([v[keys : keys + extra], v[:keys]])), alone_out
            )


def _choice_in_a_fresh_process(tmp_path: Path, mlx_first: bool = False, **env: str) -> dict:
    start = "from core.user.kernel_cache import use_private_kernel_cache; use_private_kernel_cache()"
    steps = ["import mlx.core as mx", start] if mlx_first else [start, "import mlx.core as mx"]
    code = "; ".join(
        [
            "import json",
            "from core import blas",
            *steps,
            "mx.eval(mx.ones((3, 4)) @ mx.ones((4, 2)))",
            "c = blas.active()",
            "print(json.dumps({'fast': c.fast, 'text': c.description, 'calls': blas.forwarded_calls()}))",
        ]
    )
    run_env = {**os.environ, "GEMMA_CHAT_KERNEL_DIR": str(tmp_path / "kernels"), **env}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=run_env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_a_process_builds_the_forwarder_once_and_can_be_told_to_keep_the_reference_blas(tmp_path):
    fast = _choice_in_a_fresh_process(tmp_path)
    assert fast["fast"] and "OpenBLAS" in fast["text"] and fast["calls"] >= 1
    assert len(list((tmp_path / "kernels" / "blas").glob("*.so"))) == 1
    assert _choice_in_a_fresh_process(tmp_path)["fast"]  # the second process loads the built one
    reference = _choice_in_a_fresh_process(tmp_path, GEMMA_CHAT_BLAS="reference")
    assert not reference["fast"] and "GEMMA_CHAT_BLAS=reference" in reference["text"]
    assert reference["calls"] is None
    late = _choice_in_a_fresh_process(tmp_path, mlx_first=True)
    assert not late["fast"] and "mlx was imported before" in late["text"]


def test_no_compiler_means_the_reference_blas_and_says_so(tmp_path):
    reference = _choice_in_a_fresh_process(tmp_path, PATH="/nonexistent", CC="")
    assert not reference["fast"] and "no C compiler" in reference["text"]


def test_a_refused_kernel_folder_means_the_reference_blas_and_nothing_built(tmp_path):
    (tmp_path / "kernels").mkdir(mode=0o777)
    (tmp_path / "kernels").chmod(0o777)  # others can write it: core.user.kernel_cache refuses it
    choice = _choice_in_a_fresh_process(tmp_path)
    assert not choice["fast"] and "kernel folder was refused" in choice["text"]
    assert list((tmp_path / "kernels").rglob("*.so")) == []


def test_a_pairing_marker_lists_mlx_kernels_not_the_forwarder_beside_them(tmp_path):
    """Deleting or rebuilding the forwarder must not make every pairing's kernels look unprepared."""
    from core.user.kernel_cache import KernelCache, is_prepared, marker_path, write_marker

    for name in ("blas/gemma_chat_sgemm_0.so", "mlx/0.32/cpu/kernel.so"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"")
    cache = KernelCache(tmp_path)
    write_marker(cache, "sig")
    assert json.loads(marker_path(cache, "sig").read_text())["kernels"] == ["mlx/0.32/cpu/kernel.so"]
    (tmp_path / "blas/gemma_chat_sgemm_0.so").unlink()
    assert is_prepared(cache, "sig")


def test_decoding_with_every_product_on_the_own_kernel_keeps_drafted_greedy_equal_to_plain(tmp_path):
    """The pack's targets are narrower than the threshold, so the engine tests meet the own kernel only
    here: a fresh process that sends every product through it decodes the same ids with the drafter as
    without (every verify's rows are each what a plain step computes)."""
    pack = ROOT / "tests" / "data" / "pack" / "models"
    env = {**os.environ, "GEMMA_CHAT_KERNEL_DIR": str(tmp_path / "kernels"), blas.MIN_K_ENV: "1"}
    base = [sys.executable, "-m", "app.cli", "generate", "--model", str(pack / "e-style-target"), "--json"]
    base += ["--drafter", str(pack / "e-style-assistant"), "--prompt", "Write about the sea.", "--max-tokens", "40"]
    base += ["--ignore-eos"]

    def ids(*extra: str) -> list[int]:
        out = subprocess.run([*base, *extra], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        return [e["id"] for e in map(json.loads, out.stdout.splitlines()) if "id" in e]

    plain, drafted = ids("--no-draft"), ids("--block-size", "4")
    assert len(plain) == 40 and drafted == plain
    assert "kernel from 1 wide" in _choice_in_a_fresh_process(tmp_path, **{blas.MIN_K_ENV: "1"})["text"]
