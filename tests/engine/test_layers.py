"""core.model.layers: fused projections and compiled layer pieces compute mlx-lm's layer, float and quantized."""

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx_lm.models.cache import KVCache, RotatingKVCache
from mlx_lm.models.rope_utils import ProportionalRoPE

from core.model.layers import (
    COMPILED_MAX_LEN,
    FastLayer,
    FusedLinear,
    TransposedLinear,
    fuse,
    geglu_for,
    geglu_sigmoid,
    geglu_tanh,
    projection,
    rope_key,
    rope_tables,
    rotate,
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


# -- RoPE tables and transposed weights (the CPU backend's fewer ops per layer) ------------------------


ROPES = [
    (nn.RoPE(64, base=10000.0), 64),  # the sliding layers' rope
    (ProportionalRoPE(128, 32, base=1e6), 128),  # the full layers': a quarter of the dims rotate
    (nn.RoPE(256, base=10000.0), 256),
    (nn.RoPE(32, base=500000.0, scale=0.5), 64),  # fewer rotated dims than the head's, a scale
]


@pytest.mark.parametrize("rope,head_dim", ROPES)
def test_rope_tables_rotate_to_the_same_bits_as_mx_fast_rope(rope, head_dim):
    """The tables a forward builds once give every layer exactly what `mx.fast.rope` gives it, eagerly and
    inside a compiled piece, for one row and for several rows at their own offsets, float32 and bfloat16."""
    assert rope_key(rope) is not None
    for B, L in [(1, 1), (1, 5), (1, 300), (4, 3), (8, 1)]:
        for first in [0, 5, 1023, 4097, 131071]:
            for dtype in (mx.float32, mx.bfloat16):
                x = mx.random.normal((B, 2, L, head_dim)).astype(dtype)
                offset = mx.array([first]) if B == 1 else mx.array([first + 7 * i for i in range(B)])
                want = rope(x, offset=offset)
                at = rope_tables(rope, offset, L)
                assert mx.array_equal(rotate(rope, x, at), want).item(), (B, L, first, dtype)
                compiled = mx.compile(lambda x, cos, sin: rotate(rope, x, (cos, sin)))(x, *at)
                assert mx.array_equal(compiled, want).item(), (B, L, first, dtype, "compiled")
                assert mx.array_equal(rotate(rope, x, offset), want).item()  # an offset: the module rotates


def test_ropes_without_tables_rotate_by_themselves():
    assert rope_key(nn.RoPE(64, traditional=True)) is None
    assert rope_key(ProportionalRoPE(64, 16, traditional=True)) is None

    class OtherRoPE(nn.RoPE):  # a scaled variant (llama3, yarn): its own frequencies
        pass

    assert rope_key(OtherRoPE(64)) is None


def test_a_float_projection_runs_on_a_transposed_view_of_its_own_weight():
    lin = nn.Linear(64, 48, bias=False)
    proj = projection(lin)
    assert isinstance(proj, TransposedLinear)
    x = mx.random.normal((2, 3, 64))
    assert mx.array_equal(proj(x), lin(x)).item()
    assert mx.array_equal(proj.weight_t, lin.weight.T).item()
    big = nn.Linear(1024, 1024, bias=False)
    mx.eval(big.parameters())
    before = mx.get_active_memory()
    _ = projection(big)
    assert mx.get_active_memory() - before < 1024 * 1024  # a view of the 4 MB weight, not a copy
    assert projection(nn.Linear(64, 48, bias=True)) is not None
    assert not isinstance(projection(nn.Linear(64, 48, bias=True)), TransposedLinear)
    quantized = nn.QuantizedLinear.from_linear(lin, group_size=32, bits=4)
    assert projection(quantized) is quantized


@pytest.mark.parametrize("fam", ["e-style", "dense-style"])
def test_a_forward_with_shared_rope_tables_gives_the_bits_of_the_rope_modules(fam):
    """Decode steps, verify blocks and a prefill chunk with the tables shared by the forward's layers give
    the same logits, bit for bit, as the same target with every layer rotating through its rope module."""
    ours, theirs = load_target(f"{PACK}/{fam}-target"), load_target(f"{PACK}/{fam}-target")
    assert all(f.rope_key is not None for f in ours.layers)
    for f in theirs.layers:
        f.rope_key = None
    a, b = ours.make_cache(), theirs.make_cache()
    ids = list(range(3, 40))  # a chunk longer than COMPILED_MAX_LEN: the eager pieces
    for block in (ids, [41], [42, 43, 44, 45], [46]):
        got, _ = ours.forward(block, a, logits="all")
        want, _ = theirs.forward(block, b, logits="all")
        assert mx.array_equal(got, want).item(), len(block)


def _sdpa_masks(B: int, L: int, S: int, seed: int) -> list:
    rng = np.random.default_rng(seed)
    rows = rng.random((B, 1, L, S)) > 0.3
    rows[..., 0] = True  # every query sees a key
    plain = rng.random((L, S)) > 0.3
    plain[:, 0] = True
    return ([None] if L == 1 else []) + ["causal", mx.array(rows), mx.array(plain)]


@pytest.mark.parametrize("heads", [(2, 1, 64), (8, 1, 256), (4, 2, 64), (32, 16, 128)])
def test_grouped_attention_is_the_fused_calls_result_bit_for_bit(heads, monkeypatch):
    # `attend` stacks the query heads that share a K/V head into one product on the CPU; every path that
    # must agree (plain step, verify block, batch row, drafter) goes through it, and so does mlx-lm's MoE
    # layer's mx.fast call for the same rows: the two must give the same bits for every mask kind
    from core.model.layers import attend

    nh, nkv, hd = heads
    differ, n = [], 0
    for B in (1, 3):
        for L in (1, 2, 5):
            for S in (L + 4, 64, 133):
                q = mx.random.normal((B, nh, L, hd), key=mx.random.key(n))
                k, v = mx.random.normal((2, B, nkv, S, hd), key=mx.random.key(1000 + n))
                for mask in _sdpa_masks(B, L, S, n):
                    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=hd**-0.5, mask=mask)
                    got = attend(q, k, v, hd**-0.5, mask, {})
                    n += 1
                    if not bool(mx.all(got == want)):
                        differ.append((B, L, S, mask if mask is None or isinstance(mask, str) else mask.shape))
    assert n > 40 and not differ
    # and it is the stacked form that ran, not the call it is compared with
    monkeypatch.setattr(mx.fast, "scaled_dot_product_attention", lambda *a, **k: pytest.fail("the fused call ran"))
    for mask in _sdpa_masks(2, 3, 40, 0):
        mx.eval(attend(q[:2, :, :3], k[:2, :, :40], v[:2, :, :40], hd**-0.5, mask))
