"""core.model.layers: fused projections and compiled layer pieces compute mlx-lm's layer, float and quantized."""

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx_lm.models.cache import KVCache, RotatingKVCache

from core.model.layers import (
    COMPILED_MAX_LEN,
    FastLayer,
    FusedLinear,
    fuse,
    geglu_for,
    geglu_sigmoid,
    geglu_tanh,
)
from core.model.target import load_target

PACK = "tests/data/pack/models"


def _mlx_lm_cache(tg):
    a = tg.args
    return [
        KVCache() if t == "full_attention" else RotatingKVCache(max_size=a.sliding_window, keep=0)
        for t in tg.layer_types[: tg.first_shared]
    ]


@pytest.mark.parametrize("fam", ["e-style", "dense-style", "moe-style"])
def test_decode_and_verify_steps_match_mlx_lm(fam):
    """Short inputs run the fused, compiled pieces; each step's logits stay within float tolerance
    of mlx-lm's own model call on the same weights, and the greedy ids are the same."""
    tg = load_target(f"{PACK}/{fam}-target")
    kv_layers = [f for f in tg.layers if f.has_kv]
    assert all(isinstance(f.qkv, FusedLinear) for f in kv_layers)
    if fam != "moe-style":
        assert all(isinstance(f.gate_up, FusedLinear) for f in tg.layers)
    ids = list(range(3, 33))  # crosses the 12-token window
    ours, theirs = tg.make_cache(), _mlx_lm_cache(tg)
    tg.forward(ids, ours, logits=None)
    mx.eval(tg.model(mx.array([ids]), cache=theirs))
    tok = 40
    for L in (1, 1, 4, 1, 3, 1, COMPILED_MAX_LEN):
        block = [tok] + [(tok * 7 + i) % 2000 + 3 for i in range(L - 1)]
        got, _ = tg.forward(block, ours, logits="all")
        want = tg.model(mx.array([block]), cache=theirs)[0]
        assert float(mx.abs(got - want).max()) <= 5e-5, L  # float32 rounding: logits reach ~30
        assert mx.argmax(got, axis=-1).tolist() == mx.argmax(want, axis=-1).tolist()
        tok = int(mx.argmax(got[-1]).item())


def test_fused_quantized_projection_equals_the_parts():
    mx.random.seed(0)
    parts = [nn.Linear(64, n, bias=False) for n in (128, 32, 32)]
    x = mx.random.normal((1, 3, 64))
    for p in parts:
        p.weight = mx.random.normal(p.weight.shape)
    q = [nn.QuantizedLinear.from_linear(p, group_size=32, bits=4) for p in parts]
    separate = [p(x) for p in q]
    fused = fuse(q)
    assert fused is not None and fused.quant == (32, 4, "affine")
    got = mx.split(fused(x), [128, 160], axis=-1)
    for g, s, p in zip(got, separate, q):
        assert mx.array_equal(g, s)
        assert mx.array_equal(p(x), s)  # the originals now read slices of the fused arrays
    # mixed kinds or bits are left alone
    assert fuse([q[0], parts[1]]) is None
    assert fuse([q[0], nn.QuantizedLinear.from_linear(parts[1], group_size=32, bits=8)]) is None


def test_long_inputs_run_the_same_pieces_eagerly_and_both_paths_agree():
    tg = load_target(f"{PACK}/e-style-target")
    ids = list(range(5, 5 + COMPILED_MAX_LEN + 1))
    calls = []
    orig = FastLayer._attn_in_eager

    def spy(self, x, offset):
        calls.append(x.shape[1])
        return orig(self, x, offset)

    FastLayer._attn_in_eager = spy
    try:
        fresh = [FastLayer.__new__(FastLayer) for _ in tg.layers]
        for f, old in zip(fresh, tg.layers):
            f.__dict__.update(old.__dict__)
            f._attn_in = f._attn_in_eager.__get__(f)  # uncompiled, to see the calls
        tg.layers, saved = fresh, tg.layers
        long_logits, _ = tg.forward(ids, tg.make_cache(), logits="all")
        assert calls == [len(ids)] * len(tg.layers)  # a prefill-sized input: the pieces, uncompiled
        calls.clear()
        c = tg.make_cache()
        tg.forward(ids[:1], c, logits=None)
        short_logits, _ = tg.forward(ids[1:COMPILED_MAX_LEN], c, logits="all")
        assert set(calls) == {1, COMPILED_MAX_LEN - 1}
    finally:
        FastLayer._attn_in_eager = orig
        tg.layers = saved
    np.testing.assert_allclose(np.array(short_logits), np.array(long_logits[1:COMPILED_MAX_LEN]), atol=2e-5)


@pytest.mark.parametrize("layout,dtype", [("hf", "bfloat16"), ("mlx", "q4")])
def test_half_precision_and_quantized_steps_run_and_match_mlx_lm(factory_checkpoints, layout, dtype):
    """bf16 and 4-bit targets: fused projections; the pieces are compiled only where MLX runs them
    (not on the CPU backend in bf16, where evaluating them never returned). Steps match mlx-lm's ids."""
    from core.model.layers import compile_ok

    tg = load_target(factory_checkpoints.target("e-style", layout=layout, dtype=dtype))
    assert all(f.compiled == compile_ok(mx.bfloat16) for f in tg.layers)
    if mx.default_device() == mx.cpu:
        assert not any(f.compiled for f in tg.layers)
    ids = list(range(3, 20))
    ours, theirs = tg.make_cache(), _mlx_lm_cache(tg)
    tg.forward(ids, ours, logits=None)
    mx.eval(tg.model(mx.array([ids]), cache=theirs))
    tok = 40
    for L in (1, 3, 1):
        block = [tok] + [(tok * 5 + i) % 2000 + 3 for i in range(L - 1)]
        got, _ = tg.forward(block, ours, logits="all")
        want = tg.model(mx.array([block]), cache=theirs)[0]
        assert mx.argmax(got, axis=-1).tolist() == mx.argmax(want, axis=-1).tolist()
        tok = int(mx.argmax(got[-1]).item())


def test_the_cpu_geglu_is_as_close_to_the_exact_function_as_the_tanh_form():
    x64 = np.linspace(-12, 12, 200_001)
    exact = 0.5 * x64 * (1 + np.tanh(0.7978845608028654 * (x64 + 0.044715 * x64**3)))
    x = mx.array(x64.astype(np.float32))
    ones = mx.ones_like(x)
    ours, tanh_form = (np.array(g(x, ones)) for g in (geglu_sigmoid, geglu_tanh))
    near = np.abs(x64) < 4
    assert np.abs(ours - exact).max() < 1e-6
    assert (np.abs(ours - exact) / np.maximum(np.abs(exact), 1e-3))[near].max() < 5e-6  # the tanh form: 6e-5
    assert np.abs(ours - tanh_form).max() < 2e-6


def test_the_cpu_geglu_gives_the_same_bits_compiled_into_a_piece_eagerly_and_at_any_shape():
    assert geglu_for(mx.float32) is (geglu_tanh if mx.default_device() == mx.gpu else geglu_sigmoid)
    assert geglu_for(mx.bfloat16) is not geglu_sigmoid
    rng = np.random.default_rng(0)
    gate, up = (mx.array(rng.normal(0, 3, (40, 96)).astype(np.float32)) for _ in range(2))
    whole = geglu_sigmoid(gate, up)
    inlined = mx.compile(lambda g, u: geglu_sigmoid(g * 1.0, u) + 0.0)(gate, up)
    rows = mx.concatenate([geglu_sigmoid(gate[i : i + 1], up[i : i + 1]) for i in range(40)])
    assert mx.array_equal(whole, inlined) and mx.array_equal(whole, rows)
