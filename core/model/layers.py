"""A Gemma 4 decoder layer with fewer kernels: fused projections and compiled pieces.

mlx-lm's `DecoderLayer` issues every projection, norm and residual as its own op. For short inputs
(a decode step, a verify block, a drafter step) the per-op cost dominates, and on MLX's CPU backend
each fast op (RMSNorm, RoPE) also expands into half a dozen primitives. `FastLayer` computes the
same function over the same modules' weights in three pieces:

    attn_in   (compiled)  input norm, one q/k/v matmul, q/k/v norms, RoPE at an array position
    attention (eager)     cache append + scaled dot-product attention (their shapes grow per step)
    attn_out  (compiled)  o_proj, norms, residuals, one gate/up matmul + GeGLU, down, per-layer input

`fuse_projections` concatenates q/k/v (and gate/up) weights once at load, float or quantized, and
points the original `Linear`s at row slices of the fused array, so mlx-lm's own modules (the eager
path, mlx-lm's model call) keep working on the same memory.

On the CPU backend a forward also builds its RoPE tables once for all its layers (`rope_tables`: `mx.fast.rope`
is a dozen ops there, per call), and float projections multiply by a transposed view of their weight made
once (`transposed`: no Transpose op per call). Both give the same bits; measured in one process, interleaved
(the demo target, `forward_rows`, median of 270 calls each): one row 8.68 -> 8.04 ms, a 4-token verify
16.67 -> 15.95 ms, 8 rows 24.64 -> 23.15 ms, 4 rows x 4 tokens 25.75 -> 23.99 ms (0.93-0.96x).

A compiled piece is traced once per input shape, so only short inputs (`COMPILED_MAX_LEN`) take it
(compiled on the GPU, and on the CPU backend in float32 only: see `compile_ok`); prefill chunks run the
same pieces uncompiled (their GeGLU compiled shapeless: the same function the compiled pieces inline).
On the CPU backend the GeGLU is written with exp instead of tanh (`geglu_sigmoid`: the wheel's tanh is a
scalar libm call). MoE layers (26B-A4B) keep mlx-lm's layer: their expert routing is data-dependent.
"""

from __future__ import annotations

from typing import Any, cast

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models.gemma4_text import geglu as geglu_tanh  # gelu_approx(gate) * up, compiled shapeless
from mlx_lm.models.rope_utils import ProportionalRoPE

COMPILED_MAX_LEN = 16  # inputs up to this many tokens take the compiled pieces (decode, verify, draft)


def _geglu_sigmoid(gate: mx.array, up: mx.array) -> mx.array:
    # 0.5 x (1 + tanh(u)) = x sigmoid(2u) = x / (1 + exp(-2u)), u = sqrt(2 / pi) (x + 0.044715 x^3)
    return gate / (1.0 + mx.exp((-1.5957691216057308 - 0.07135481627159185 * (gate * gate)) * gate)) * up


def _geglu_tanh(gate: mx.array, up: mx.array) -> mx.array:
    return nn.gelu_approx(gate) * up


# Why the sigmoid form on the CPU backend: the Linux wheel's kernels are built for baseline x86-64, where
# tanh is a scalar libm call (about 25 ns an element here); MLX's exp is its own polynomial. Measured on
# the demo's widths: a 256-wide GeGLU of one row costs the same, of 32 rows (8 rows verifying 4 tokens)
# 2.2x less, of 512 rows (a prefill chunk) 2.4x less; and it is closer to the exact function (relative error
# 1.5e-6 for |x| < 4 where the tanh form loses 6e-5 to cancellation). It stays one fused kernel (a deeper
# rational tanh split into three and made a one-row step 2 % slower). Elementwise only, so one shapeless
# compile serves every shape, and the compiled pieces inline the same ops: the GeGLU gives a row the same
# bits on every path (decode, verify, prefill chunks of any length, a batch; tested). GPUs keep tanh, and
# so does half precision on the CPU (its layers run uncompiled there: see `compile_ok`).
geglu_sigmoid = mx.compile(_geglu_sigmoid, shapeless=True)


def geglu_for(dtype: mx.Dtype) -> Any:
    """gelu_approx(gate) * up for activations of `dtype`, in the form that is fast on the default device."""
    if mx.default_device() == mx.gpu:
        return geglu_tanh
    return geglu_sigmoid if dtype == mx.float32 else _geglu_tanh


def compile_ok(dtype: mx.Dtype) -> bool:
    """Whether the layer pieces are compiled: always on the GPU; on the CPU backend only for float32,
    because MLX 0.32's CPU backend never returns from evaluating these compiled pieces in bfloat16
    (seen with every bf16 and 4-bit factory target: the first decode step hangs in a futex wait).
    Uncompiled pieces still save the fused projections' matmuls."""
    return dtype == mx.float32 or mx.default_device() == mx.gpu


# --- RoPE on the CPU backend: the tables once per forward ------------------------------------------
#
# MLX's CPU backend has no RoPE kernel: `mx.fast.rope` expands into its fallback graph (positions, inverse
# frequencies, cos, sin, the rotation), about a dozen ops for every call, and a layer calls it twice (q and k).
# The tables depend only on the positions and the rope's parameters, so a forward computes them once per kind
# of layer and every layer rotates with them: about 14 fewer ops per layer. `rope_tables` builds them with
# the fallback's own ops in its order and `rotate` applies them as it does, so the result is the same bits
# (tests/engine/test_layers.py checks it against `mx.fast.rope`, eager and compiled, and a whole forward
# against one whose layers rotate through their modules). GPUs keep their
# one fused RoPE kernel.

RopeInput = Any  # an offset array (the rope module rotates) or a (cos, sin) pair from `rope_tables`


def rope_key(rope: Any) -> tuple | None:
    """What identifies `rope`'s tables, or None where it rotates by itself (a GPU, a traditional or scaled
    variant that `rope_tables` does not build)."""
    if mx.default_device() != mx.cpu or getattr(rope, "traditional", True):
        return None
    if isinstance(rope, ProportionalRoPE):
        return ("freqs", rope.dims, id(rope._freqs))
    if type(rope) is nn.RoPE:
        return ("base", rope.dims, float(rope.base), float(rope.scale))
    return None


def rope_tables(rope: Any, offset: mx.array, L: int) -> tuple[mx.array, mx.array]:
    """cos, sin [L, dims/2] float32 for positions offset + [0, L), or [B, 1, L, dims/2] for B offsets,
    as `mx.fast.rope`'s fallback computes them (its float32 log of the base included)."""
    half = rope.dims // 2
    if isinstance(rope, ProportionalRoPE):
        inv_freqs, scale = mx.reciprocal(rope._freqs), 1.0
    else:
        step = float(np.float32(np.log(np.float32(rope.base))) / np.float32(half))  # C++: std::log(float) / int
        inv_freqs = mx.exp(mx.arange(0, -half, -1, dtype=mx.float32) * mx.array(step, dtype=mx.float32))
        scale = rope.scale
    if offset.size > 1:
        offset = offset.reshape(-1, 1, 1)
    positions = (mx.arange(L, dtype=mx.float32) + offset) * mx.array(scale, dtype=mx.float32)
    theta = positions[..., None] * inv_freqs
    return mx.cos(theta), mx.sin(theta)


def rotate(rope: Any, x: mx.array, at: RopeInput) -> mx.array:
    """x [B, n, L, d] rotated at `at`: by the module for an offset, else with the (cos, sin) tables."""
    if not isinstance(at, tuple):
        return rope(x, offset=at)
    dims, cos, sin = rope.dims, at[0].astype(x.dtype), at[1].astype(x.dtype)
    half = dims // 2
    x1, x2 = x[..., :half], x[..., half:dims]
    parts = [x1 * cos - x2 * sin, x1 * sin + x2 * cos]
    if dims < x.shape[-1]:
        parts.append(x[..., dims:])
    return mx.concatenate(parts, axis=-1)


# --- attention on the CPU backend: the query heads that share a K/V head in one product -----------------
#
# MLX's CPU backend has no attention kernel: `mx.fast.scaled_dot_product_attention` runs its fallback graph,
# one product per query head, and every product is a BLAS call padded to 8 rows (core.blas). With grouped
# K/V (Gemma 4: 2 to 8 query heads per K/V head) `attend` stacks the rows of the query heads that share a
# K/V head into one product: the same function in the fallback's own order of operations (scale the queries,
# scores, -inf where masked, a precise softmax, the values), so the same bits (tests/engine/test_layers.py
# compares it with the fused call: 2:1, 8:1, 4:2 and 32:16 heads, 1 or 3 rows, 1 to 5 queries, every mask kind).
# Measured on the demo (`forward_rows` with its drafts, interleaved, 110 rounds each): one row 4.77 -> 4.62 ms,
# 4 rows x 2 tokens 7.54 -> 7.30, 8 rows 6.79 -> 6.46. GPUs keep the fused kernel; so do other dtypes.


def attend(q: mx.array, k: mx.array, v: mx.array, scale: float, mask: Any, folded: dict | None = None) -> mx.array:
    """`mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)` for q [B, nh, L, hd] and k, v
    [B, nkv, S, hd]; mask None, "causal" (bottom-right aligned) or boolean, broadcast to [B, 1, L, S]. On the CPU
    backend in float32 with nh > nkv, the query heads sharing a K/V head run as one product (see above).
    `folded`: where one forward's calls share the stacked masks."""
    B, nh, L, hd = q.shape
    nkv, S = k.shape[1], k.shape[2]
    stackable = mask is None or (isinstance(mask, str) and mask == "causal")
    stackable = stackable or (isinstance(mask, mx.array) and mask.dtype == mx.bool_)
    if nh == nkv or q.dtype != mx.float32 or not stackable or mx.default_device() != mx.cpu:
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)
    rep = nh // nkv
    scores = (q * scale).reshape(B, nkv, rep * L, hd) @ k.swapaxes(-1, -2)  # [B, nkv, rep * L, S]
    if mask is not None:
        key = ("mask", id(mask), rep, L, S)
        stacked = folded.get(key) if folded is not None else None
        if stacked is None:
            if isinstance(mask, str):
                m = mx.arange(S)[None] <= (S - L + mx.arange(L))[:, None]
            else:
                m = mask
            m = m.reshape((1,) * (4 - m.ndim) + m.shape)  # [Bm, 1, L, S]
            if m.shape[1] != 1:  # a mask per head: nothing to stack
                return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)
            Bm = m.shape[0]
            stacked = mx.broadcast_to(m[:, :, None], (Bm, 1, rep, L, S)).reshape(Bm, 1, rep * L, S)
            if folded is not None:
                folded[key] = stacked
        scores = mx.where(stacked, scores, mx.array(-mx.inf, scores.dtype))
    return (mx.softmax(scores, axis=-1, precise=True) @ v).reshape(B, nh, L, v.shape[-1])


class FusedLinear:
    """Several bias-free projections of one input as one matmul (float or quantized alike)."""

    def __init__(self, arrays: dict, quant: tuple | None):
        self.arrays = arrays  # weight [, scales, biases]: the parts' rows stacked
        self.quant = quant  # (group_size, bits, mode) or None
        self.weight_t = transposed(arrays["weight"]) if quant is None else None

    def __call__(self, x: mx.array) -> mx.array:
        a = self.arrays
        if self.weight_t is not None:
            return x @ self.weight_t
        group_size, bits, mode = cast(tuple, self.quant)
        return mx.quantized_matmul(
            x, a["weight"], a["scales"], a.get("biases"), transpose=True, group_size=group_size, bits=bits, mode=mode
        )


def transposed(weight: mx.array) -> mx.array:
    """weight.T as an evaluated view of the same memory. `x @ weight.T` adds a Transpose op to every call's
    graph; a view made once gives the product the same strides (the same BLAS call) without it."""
    t = weight.T
    mx.eval(t)
    return t


class TransposedLinear:
    """A float, bias-free `nn.Linear` as `x @ weight_t` (see `transposed`)."""

    def __init__(self, linear: nn.Linear):
        self.weight_t = transposed(linear.weight)

    def __call__(self, x: mx.array) -> mx.array:
        return x @ self.weight_t


def projection(linear: Any) -> Any:
    """`linear` itself, or for a float bias-free `nn.Linear` its `TransposedLinear`."""
    if type(linear) is nn.Linear and "bias" not in linear:
        return TransposedLinear(linear)
    return linear


def fuse(linears: list) -> FusedLinear | None:
    """Stack the given Linear / QuantizedLinear weights into one; each original then reads a row
    slice of the stacked arrays (no second copy). None when the parts differ in kind, carry a
    bias, or are quantized differently."""
    first = linears[0]
    quantized = isinstance(first, nn.QuantizedLinear)
    if not quantized and not isinstance(first, nn.Linear):
        return None
    for lin in linears:
        if type(lin) is not type(first) or "bias" in lin:
            return None
        if quantized and (lin.group_size, lin.bits, lin.mode) != (first.group_size, first.bits, first.mode):
            return None
    names = ["weight"]
    if quantized:
        names += ["scales"] + (["biases"] if "biases" in first else [])
    arrays = {n: mx.concatenate([lin[n] for lin in linears], axis=0) for n in names}
    mx.eval(arrays)
    start = 0
    for lin in linears:
        stop = start + lin.weight.shape[0]  # packed quantized weights keep one row per output feature
        for n, a in arrays.items():
            lin[n] = a[start:stop]
        start = stop
    mx.eval([lin.parameters() for lin in linears])
    return FusedLinear(arrays, (first.group_size, first.bits, first.mode) if quantized else None)


def _split_points(linears: list) -> list[int]:
    """Where the fused output splits back into the parts' outputs (along the last axis)."""
    out, total = [], 0
    for lin in linears[:-1]:
        total += lin.weight.shape[0]
        out.append(total)
    return out


class FastLayer:
    """Runs one mlx-lm `DecoderLayer` (see the module docstring); call signature as the layer's.

    It holds its own views of the layer's projection weights (fused, transposed), taken when it is built:
    a change to the layer's modules afterwards (quantizing in place, a new dtype) needs a new FastLayer."""

    def __init__(self, layer: nn.Module) -> None:
        self.layer = layer
        self.layer_type = layer.layer_type
        attn = layer.self_attn
        self.attn = attn
        self.has_kv = attn.has_kv
        self.moe = getattr(layer, "enable_moe", False)
        self.qkv = self.gate_up = None
        self.qkv_split: list[int] = []
        if self.has_kv:
            parts = [attn.q_proj, attn.k_proj] + ([] if attn.use_k_eq_v else [attn.v_proj])
            self.qkv = fuse(parts)
            self.qkv_split = _split_points(parts)
        if not self.moe:
            self.gate_up = fuse([layer.mlp.gate_proj, layer.mlp.up_proj])
        self.o_proj = projection(attn.o_proj)
        self.down_proj = projection(layer.mlp.down_proj) if not self.moe else None
        self.q_proj = projection(attn.q_proj)
        gate = getattr(layer, "per_layer_input_gate", None)
        self.per_layer_gate = projection(gate) if gate is not None else None
        proj = getattr(layer, "per_layer_projection", None)
        self.per_layer_projection = projection(proj) if proj is not None else None
        self.compiled = compile_ok(layer.input_layernorm.weight.dtype)
        self.geglu = geglu_for(layer.input_layernorm.weight.dtype)
        self.rope_key = rope_key(attn.rope)
        self._attn_in = mx.compile(self._attn_in_eager) if self.compiled else self._attn_in_eager
        self._attn_out = mx.compile(self._attn_out_eager) if self.compiled else self._attn_out_eager

    # --- the pieces (traced by mx.compile; also valid eagerly) -----------------------------

    def _attn_in_eager(
        self, x: mx.array, at: RopeInput
    ) -> tuple[mx.array, Any, Any]:  # k, v: None on a KV-shared layer
        """x [B, L, H] -> (q [B, nh, L, hd], k, v [B, nkv, L, hd] with RoPE at `at` (see `rope_input`);
        None on a KV-shared layer)."""
        a = self.attn
        B, L, _ = x.shape
        h = self.layer.input_layernorm(x)
        k: mx.array | None
        v: mx.array | None
        if self.has_kv:
            parts: list[mx.array]
            if self.qkv is not None:
                parts = list(mx.split(self.qkv(h), self.qkv_split, axis=-1))
            else:
                parts = [a.q_proj(h), a.k_proj(h)] + ([] if a.use_k_eq_v else [a.v_proj(h)])
            q = parts[0]
            k = parts[1].reshape(B, L, a.n_kv_heads, a.head_dim)
            v = k if a.use_k_eq_v else parts[2].reshape(B, L, a.n_kv_heads, a.head_dim)
            k = rotate(a.rope, a.k_norm(k).transpose(0, 2, 1, 3), at)
            v = a.v_norm(v).transpose(0, 2, 1, 3)
        else:
            q = self.q_proj(h)
            k = v = None
        q = a.q_norm(q.reshape(B, L, a.n_heads, a.head_dim)).transpose(0, 2, 1, 3)
        q = rotate(a.rope, q, at)
        return q, k, v

    def _attn_out_eager(
        self, o: mx.array, residual: mx.array, per_layer_input: mx.array | None, scalar: mx.array | None
    ) -> mx.array:
        """o [B, nh, L, hd] attention output, residual [B, L, H] -> the layer's output [B, L, H].

        `scalar` is the layer's `layer_scalar` [1], passed in rather than read from the layer: mx.compile
        bakes a captured one-element array into the kernel as a constant, so every layer would compile
        kernels of its own (16 layers: 16 C++ compiles on the CPU backend instead of one)."""
        layer = self.layer
        B, _, L, _ = o.shape
        h = self.o_proj(o.transpose(0, 2, 1, 3).reshape(B, L, -1))
        h = residual + layer.post_attention_layernorm(h)
        residual = h
        x = layer.pre_feedforward_layernorm(h)
        mlp = layer.mlp
        if self.gate_up is not None:
            gate, up = mx.split(self.gate_up(x), 2, axis=-1)
        else:
            gate, up = mlp.gate_proj(x), mlp.up_proj(x)
        h = residual + layer.post_feedforward_layernorm(cast(Any, self.down_proj)(self.geglu(gate, up)))
        if self.per_layer_gate is not None and self.per_layer_projection is not None and per_layer_input is not None:
            g = self.geglu(self.per_layer_gate(h), per_layer_input)
            h = h + layer.post_per_layer_input_norm(self.per_layer_projection(g))
        if scalar is not None:
            h = h * scalar
        return h

    def rope_input(self, offset: mx.array, L: int, tables: dict | None = None) -> RopeInput:
        """What `_attn_in` rotates at for positions offset + [0, L): the offset itself, or on the CPU
        backend this rope's tables, built once per forward where the forward's layers share `tables`."""
        key = self.rope_key
        if key is None:
            return offset
        if tables is None:
            return rope_tables(self.attn.rope, offset, L)
        if key not in tables:
            tables[key] = rope_tables(self.attn.rope, offset, L)
        return tables[key]

    # --- the layer ---------------------------------------------------------------------------

    def __call__(
        self,
        x: mx.array,
        mask: Any = None,
        cache: Any = None,
        per_layer_input: mx.array | None = None,
        shared_kv: Any = None,
        offset: Any = None,
        tables: dict | None = None,
    ) -> Any:
        """mlx-lm's layer call; `tables`: a dict shared by one forward's layers (see `rope_input`)."""
        if self.moe:
            return self.layer(x, mask, cache, per_layer_input=per_layer_input, shared_kv=shared_kv, offset=offset)
        small = x.shape[1] <= COMPILED_MAX_LEN  # a longer input (a prefill chunk) runs the same pieces eagerly
        if shared_kv is None:
            if not self.has_kv:
                raise ValueError(f"layer {self.layer.layer_idx} is KV-shared but received no shared K/V")
            offset = mx.array(cache.offset if cache is not None else 0)
        elif not isinstance(offset, mx.array):
            offset = mx.array(offset)
        at = self.rope_input(offset, x.shape[1], tables)
        q, k, v = (self._attn_in if small else self._attn_in_eager)(x, at)
        if shared_kv is not None:
            k, v = shared_kv
        elif cache is not None:
            k, v = cache.update_and_fetch(k, v)
        o = attend(q, k, v, self.attn.scale, mask, tables)
        h = (self._attn_out if small else self._attn_out_eager)(o, x, per_layer_input, self.layer.layer_scalar)
        return h, (k, v), offset


def fast_layers(layers: list) -> list[FastLayer]:
    return [FastLayer(layer) for layer in layers]
