"""The demo's Gemma 4 text model and drafter, in numpy (autograd) for training on a CPU.

MLX's CPU backend is the engine's runtime, but its float32 matmul on this x86 machine measured
about 1 GFLOP/s against OpenBLAS's ~20 through numpy: training the demo in MLX would take hours.
So the training arithmetic runs here, on parameter dicts keyed by the MLX modules' names, and
`train_demo.py` checks that the engine's MLX forward reproduces these logits before and after.

Shapes: x [B, T] ids; hidden [B, T, H]; per-head tensors [B, heads, T, head_dim].
RoPE tables come from the MLX modules themselves (`rope_tables`), so both conventions (default
and Gemma 4's proportional partial rotation) are exactly the engine's.
"""

from __future__ import annotations

import math

import autograd.numpy as anp
import numpy as np
from autograd.extend import defvjp, primitive

EPS = 1e-6
S, F = "sliding_attention", "full_attention"


# The hot spots are primitives with their own derivatives (autograd's generic ones broadcast and
# reduce [B, h, T, T] tensors several times over): a training step runs about twice as fast.


def _softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@primitive
def softmax(x):
    """Softmax over the last axis."""
    return _softmax(x)


defvjp(softmax, lambda ans, x: lambda g: ans * (g - (g * ans).sum(axis=-1, keepdims=True)))


@primitive
def logsumexp(x):
    """Stable log-sum-exp over the last axis."""
    m = x.max(axis=-1, keepdims=True)
    return (m + np.log(np.exp(x - m).sum(axis=-1, keepdims=True)))[..., 0]


defvjp(logsumexp, lambda ans, x: lambda g: g[..., None] * np.exp(x - ans[..., None]))


@primitive
def cross_entropy(logits, y):
    """-log softmax(logits)[y] per position: logits [..., V], y [...] integer targets."""
    lse = logsumexp(logits)
    return lse - np.take_along_axis(logits, y[..., None], axis=-1)[..., 0]


def _ce_vjp(ans, logits, y):
    def vjp(g):
        d = _softmax(logits)
        np.put_along_axis(d, y[..., None], np.take_along_axis(d, y[..., None], axis=-1) - 1.0, axis=-1)
        return g[..., None] * d

    return vjp


defvjp(cross_entropy, _ce_vjp)


@primitive
def soft_cross_entropy(z, target):
    """-sum(target * log_softmax(z)) over the last axis; `target` is a constant (not differentiated)."""
    return -(target * (z - logsumexp(z)[..., None])).sum(axis=-1)


defvjp(
    soft_cross_entropy,
    lambda ans, z, target: lambda g: g[..., None] * (_softmax(z) * target.sum(axis=-1, keepdims=True) - target),
)


@primitive
def rms_norm(x):
    """x / sqrt(mean(x^2) + eps) over the last axis."""
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + EPS)


def _rms_vjp(ans, x):
    r = 1.0 / np.sqrt((x * x).mean(axis=-1, keepdims=True) + EPS)
    return lambda g: r * (g - ans * (g * ans).mean(axis=-1, keepdims=True))


defvjp(rms_norm, _rms_vjp)


def rms(x, w=None):
    y = rms_norm(x)
    return y if w is None else y * w


_GELU_C = np.float32(math.sqrt(2 / math.pi))
_GELU_A = np.float32(0.044715)


@primitive
def gelu(x):
    """mlx's gelu_approx (tanh form); a primitive with its own derivative: autograd's tanh
    gradient goes through cosh(x)**2, slow and overflowing."""
    return 0.5 * x * (1 + np.tanh(_GELU_C * (x + _GELU_A * x * x * x)))


def _gelu_grad(x):
    t = np.tanh(_GELU_C * (x + _GELU_A * x * x * x))
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * _GELU_C * (1 + 3 * _GELU_A * x * x)


defvjp(gelu, lambda ans, x: lambda g: g * _gelu_grad(x))


def linear(x, w):
    return anp.matmul(x, w.T)


def rope(x, tables, positions: np.ndarray | None = None):
    """x [B, h, T, d] with (cos, sin) [L, d/2] tables: rotate pairs (i, i + d/2). Positions 0..T-1,
    or `positions` [B, T] (queries gathered from anywhere in their sequences)."""
    cos, sin = tables
    if positions is None:
        T = x.shape[2]
        cos, sin = cos[:T], sin[:T]
    else:
        cos, sin = cos[positions][:, None], sin[positions][:, None]  # [B, 1, T, d/2]
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return anp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def rope_tables(mlx_rope, head_dim: int, length: int) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin [length, head_dim/2] of an MLX RoPE module: rotating (1.., 0..) gives (cos, sin)."""
    import mlx.core as mx

    half = head_dim // 2
    unit = np.zeros((1, 1, length, head_dim), np.float32)
    unit[..., :half] = 1.0
    out = np.array(mlx_rope(mx.array(unit), offset=0))[0, 0]
    return out[:, :half].copy(), out[:, half:].copy()


def causal_mask(T: int, window: int | None = None) -> np.ndarray:
    """[T, T] additive mask: query i sees key j <= i, and with `window` only i - j < window
    (mlx-lm's sliding-window rule)."""
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    ok = (j <= i) if window is None else (j <= i) & (i - j < window)
    return np.where(ok, 0.0, -1e30).astype(np.float32)


def layer_masks(T: int, window: int) -> dict[str, np.ndarray]:
    """The mask of each layer type: sliding layers see the last `window` positions."""
    return {S: causal_mask(T, window), F: causal_mask(T)}


def attention(q, k, v, mask):
    """q [B, h, Q, d], k/v [B, kv, T, d] (kv divides h), mask [Q, T] or [B, 1, 1, Q, T]; scale 1
    (the q/k norms set it)."""
    B, h, T, d = q.shape
    kv = k.shape[1]
    q = anp.reshape(q, (B, kv, h // kv, T, d))
    k = anp.reshape(k, (B, kv, 1, k.shape[2], d))
    v = anp.reshape(v, (B, kv, 1, v.shape[2], d))
    p = softmax(anp.matmul(q, anp.swapaxes(k, -1, -2)) + mask)
    return anp.reshape(anp.matmul(p, v), (B, h, T, d))


class TextSpec:
    """What the forward needs to know about the target (from mlx-lm's ModelArgs and modules)."""

    def __init__(self, lm, max_len: int):
        a = lm.args
        inner = lm.model
        self.hidden = a.hidden_size
        self.n_layers = a.num_hidden_layers
        self.layer_types = list(a.layer_types)
        self.first_shared = a.num_hidden_layers - a.num_kv_shared_layers
        self.previous_kvs = list(inner.previous_kvs)
        self.ple = a.hidden_size_per_layer_input
        self.softcap = a.final_logit_softcapping
        self.heads = a.num_attention_heads
        self.kv_heads = a.num_key_value_heads
        self.head_dims = {t: inner.layers[self.layer_types.index(t)].self_attn.head_dim for t in set(self.layer_types)}
        self.producers = {t: i for i, t in enumerate(self.layer_types[: self.first_shared])}
        self.window = a.sliding_window
        self.rope = {
            t: rope_tables(inner.layers[self.layer_types.index(t)].self_attn.rope, self.head_dims[t], max_len)
            for t in set(self.layer_types)
        }


def attend_and_mlp(p: dict, lp: str, x, q, k, v, mask, width: int):
    """The rest of a Gemma 4 layer once q, k, v are known (target and drafter alike): x plus the
    post-normed attention output, then plus the post-normed gated MLP."""
    B, T, _ = x.shape
    o = anp.reshape(anp.transpose(attention(q, k, v, mask), (0, 2, 1, 3)), (B, T, width))
    x = x + rms(linear(o, p[lp + "self_attn.o_proj.weight"]), p[lp + "post_attention_layernorm.weight"])
    m = rms(x, p[lp + "pre_feedforward_layernorm.weight"])
    m = linear(
        gelu(linear(m, p[lp + "mlp.gate_proj.weight"])) * linear(m, p[lp + "mlp.up_proj.weight"]),
        p[lp + "mlp.down_proj.weight"],
    )
    return x + rms(m, p[lp + "post_feedforward_layernorm.weight"])


def target_forward(p: dict, spec: TextSpec, x: np.ndarray, want_kv: bool = False, n_run: int | None = None):
    """Logits [B, T, V] (soft-capped), post-norm hidden [B, T, H] and, with want_kv, the producer
    layers' K/V per type."""
    B, T = x.shape
    pre = "model."
    E = p[pre + "embed_tokens.weight"]
    h = E[x] * np.float32(math.sqrt(spec.hidden))
    pli = None
    if spec.ple:
        n, d = spec.n_layers, spec.ple
        raw = p[pre + "embed_tokens_per_layer.weight"][x] * np.float32(math.sqrt(d))
        proj = linear(h, p[pre + "per_layer_model_projection.weight"]) * np.float32(spec.hidden**-0.5)
        proj = rms(anp.reshape(proj, (B, T, n, d)), p[pre + "per_layer_projection_norm.weight"])
        pli = (proj + anp.reshape(raw, (B, T, n, d))) * np.float32(2.0**-0.5)
    masks = layer_masks(T, spec.window)
    kvs = [None] * spec.n_layers
    for i in range(n_run or spec.n_layers):
        lp = f"{pre}layers.{i}."
        t = spec.layer_types[i]
        hd = spec.head_dims[t]
        a = rms(h, p[lp + "input_layernorm.weight"])
        q = anp.reshape(linear(a, p[lp + "self_attn.q_proj.weight"]), (B, T, spec.heads, hd))
        q = rope(anp.transpose(rms(q, p[lp + "self_attn.q_norm.weight"]), (0, 2, 1, 3)), spec.rope[t])
        if i < spec.first_shared:
            k = anp.reshape(linear(a, p[lp + "self_attn.k_proj.weight"]), (B, T, spec.kv_heads, hd))
            k = rope(anp.transpose(rms(k, p[lp + "self_attn.k_norm.weight"]), (0, 2, 1, 3)), spec.rope[t])
            v = anp.reshape(linear(a, p[lp + "self_attn.v_proj.weight"]), (B, T, spec.kv_heads, hd))
            v = anp.transpose(rms(v), (0, 2, 1, 3))
            kvs[i] = (k, v)
        else:
            kvs[i] = kvs[spec.previous_kvs[i]]
        k, v = kvs[i]
        h = attend_and_mlp(p, lp, h, q, k, v, masks[t], spec.heads * hd)
        if pli is not None:
            g = gelu(linear(h, p[lp + "per_layer_input_gate.weight"])) * pli[:, :, i, :]
            g = rms(linear(g, p[lp + "per_layer_projection.weight"]), p[lp + "post_per_layer_input_norm.weight"])
            h = h + g
        h = h * p[lp + "layer_scalar"]
    hidden = rms(h, p[pre + "norm.weight"])
    logits = linear(hidden, E)
    if spec.softcap:
        logits = anp.tanh(logits / spec.softcap) * spec.softcap
    kv = {t: kvs[i] for t, i in spec.producers.items()} if want_kv else None
    return logits, hidden, kv


class DrafterSpec:
    def __init__(self, dr, target_spec: TextSpec):
        a = dr.cfg.text
        self.hidden = a.hidden_size
        self.heads = a.num_attention_heads
        self.layer_types = [layer.layer_type for layer in dr.layers]
        self.head_dims = {t: dr.layers[self.layer_types.index(t)].self_attn.head_dim for t in set(self.layer_types)}
        self.rope = target_spec.rope  # same RoPE per type as the target (the drafter reads its keys)
        self.target_embed_scale = np.float32(math.sqrt(target_spec.hidden))
        self.num_centroids = dr.cfg.num_centroids


def drafter_step(p: dict, spec: DrafterSpec, emb, h, kv: dict, masks: dict, positions: np.ndarray | None = None):
    """One unrolled drafter step at every query: emb, h [B, Q, Hb] -> (y [B, Q, Hd], next h).

    The queries are the positions 0..T-1 of the target's K/V (`masks` from layer_masks, [T, T]), or
    the gathered `positions` [B, Q] with `masks` [B, 1, 1, Q, T] (the rows of those positions): query
    q reads the target's K/V of [0, q], as the engine's round does at its last committed position."""
    B, T, _ = h.shape
    z = linear(anp.concatenate([emb, h], axis=-1), p["pre_projection.weight"])
    for i, t in enumerate(spec.layer_types):
        lp = f"layers.{i}."
        hd = spec.head_dims[t]
        a = rms(z, p[lp + "input_layernorm.weight"])
        q = anp.reshape(linear(a, p[lp + "self_attn.q_proj.weight"]), (B, T, spec.heads, hd))
        q = rope(anp.transpose(rms(q, p[lp + "self_attn.q_norm.weight"]), (0, 2, 1, 3)), spec.rope[t], positions)
        k, v = kv[t]
        z = attend_and_mlp(p, lp, z, q, k, v, masks[t], spec.heads * hd)
        z = z * p[lp + "layer_scalar"]
    y = rms(z, p["norm.weight"])
    return y, linear(y, p["post_projection.weight"])


def log_softmax(x):
    return x - logsumexp(x)[..., None]


class Adam:
    def __init__(self, params: dict, b1=0.9, b2=0.999, eps=1e-8):
        self.m = {k: np.zeros_like(v) for k, v in params.items()}
        self.v = {k: np.zeros_like(v) for k, v in params.items()}
        self.b1, self.b2, self.eps, self.t = b1, b2, eps, 0

    def update(self, params: dict, grads: dict, lr: float, clip: float = 1.0) -> None:
        norm = math.sqrt(sum(float((g * g).sum()) for g in grads.values()))
        scale = min(1.0, clip / (norm + 1e-12))
        self.t += 1
        c1, c2 = 1 - self.b1**self.t, 1 - self.b2**self.t
        for k, g in grads.items():
            g = g * scale
            self.m[k] = self.b1 * self.m[k] + (1 - self.b1) * g
            self.v[k] = self.b2 * self.v[k] + (1 - self.b2) * g * g
            params[k] = (params[k] - lr * (self.m[k] / c1) / (np.sqrt(self.v[k] / c2) + self.eps)).astype(np.float32)
