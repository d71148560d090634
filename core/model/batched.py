"""Several sequences through the target (and the drafter) in one call, each with its own cache.

A server batch holds rows at different lengths, each with its own `TargetCache` (its own offsets,
sliding-window buffer and rollback). Here the rows' tokens go through the model as one [B, L, H]
tensor, so every projection, norm, MLP and the logits head reads its weights once for the whole
batch, while each row's attention runs on that row's own cache:

    x [B, L, H] -> input norm, q/k/v, q/k/v norms, RoPE at each row's own offset   (batched)
    per row b:  its cache appends k[b], v[b]; sdpa(q[b], its keys, its mask)       (per row)
    o [B, nh, L, hd] -> o_proj, norms, MLP (or MoE), per-layer input, scalar      (batched)

Why not one padded attention over a shared [B, kv, S, hd] buffer (mlx-lm's BatchKVCache with left
padding)? Rows accept different numbers of drafts every round, so a shared write index leaves holes
or needs a per-row shift, and the sliding cache's compaction and rollback would have to be redone
per row inside one buffer. Per-row attention keeps `SlidingKVCache` exactly as the single stream
uses it (same shapes, same masks, same rollback), rows join and leave by list membership, and a
leaving row's memory goes with its cache. The price is one attention call per row per layer.
Measured on the demo (CPU backend, interleaved, one forward of B=4 or 8 rows): one masked sdpa over
the rows' K/V padded into one tensor (bit-identical logits) changed the forward by -5..+1 %: there the
rows' cost is compute in the projections (about 5-7 ms per row and position), not attention dispatch.

Every row of one call has the same number of new tokens L (the batch's block size).

The compiled layer pieces (core.model.layers) serve every row count. A compiled piece is traced per
input shape, and a batch meets a new [B, L] whenever a row joins or leaves or the block size changes:
each costs one trace the first time in a process (about 0.5 s for the demo on this CPU); the C++ kernels
the CPU backend builds for them are shared by every B > 1 and kept in the kernel cache between runs.
Measured with `scripts/bench_serve.py --streams 4,8 --compare` (interleaved, the server's CPU time per
token, demo): 8 streams 8.0 -> 6.4 ms (111 against 92 tok/s), 4 streams 10.0 -> 10.1 ms, eager ->
compiled. (They used to run for one row only on the CPU backend.)
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn

from core import sampling
from core.model.cache import SlidingKVCache, attention_mask
from core.model.drafter import Drafter
from core.model.layers import COMPILED_MAX_LEN, FastLayer
from core.model.target import FULL, SLIDING, Target, TargetCache, _sliding_start_after

Mask = mx.array | str | None


def _row_masks(target: Target, caches: list[TargetCache], L: int) -> list[dict[str, Mask]]:
    """Per row, the mask of each attention type for L new tokens (as `Target.forward` builds them)."""
    out = []
    for cache in caches:
        P = cache.offset
        masks: dict[str, Mask] = {}
        if cache.first_of(FULL) is not None:
            masks[FULL] = "causal" if L > 1 else None
        sliding = cache.first_of(SLIDING)
        if isinstance(sliding, SlidingKVCache):
            start = _sliding_start_after(sliding, L)
            masks[SLIDING] = attention_mask(P, L, start, P + L - start, target.window)
        out.append(masks)
    return out


def _moe_out(layer: Any, o: mx.array, residual: mx.array, per_layer_input: mx.array | None) -> mx.array:
    """mlx-lm's DecoderLayer after its attention, for a MoE layer (26B-A4B): o [B, nh, L, hd] -> [B, L, H]."""
    B, _, L, _ = o.shape
    h = residual + layer.post_attention_layernorm(layer.self_attn.o_proj(o.transpose(0, 2, 1, 3).reshape(B, L, -1)))
    residual = h
    h1 = layer.post_feedforward_layernorm_1(layer.mlp(layer.pre_feedforward_layernorm(h)))
    top_k_indices, top_k_weights = layer.router(h)
    h2 = layer.experts(layer.pre_feedforward_layernorm_2(h), top_k_indices, top_k_weights)
    h = residual + layer.post_feedforward_layernorm(h1 + layer.post_feedforward_layernorm_2(h2))
    if layer.per_layer_input_gate is not None and per_layer_input is not None:
        g = nn.gelu_approx(layer.per_layer_input_gate(h)) * per_layer_input
        h = h + layer.post_per_layer_input_norm(layer.per_layer_projection(g))
    if layer.layer_scalar is not None:
        h = h * layer.layer_scalar
    return h


def _layer(
    fast: FastLayer,
    x: mx.array,
    masks: list[Mask],
    caches: list[Any] | None,
    per_layer_input: mx.array | None,
    shared: tuple[list[tuple[mx.array, mx.array]], mx.array] | None,
) -> tuple[mx.array, list[tuple[mx.array, mx.array]], mx.array]:
    """One decoder layer over B rows: x [B, L, H]; `caches` the rows' caches of this layer (a layer with
    its own K/V) or `shared` (per row K/V, offsets [B]) from the layer it reads. Returns (h, kvs, offsets)."""
    L = x.shape[1]
    small = L <= COMPILED_MAX_LEN and not fast.moe
    if shared is None:
        assert caches is not None, "a layer with its own K/V needs the rows' caches"
        offsets = mx.array([c.offset for c in caches])
    else:
        offsets = shared[1]
    q, k, v = (fast._attn_in if small else fast._attn_in_eager)(x, offsets)
    kvs: list[tuple[mx.array, mx.array]] = []
    outs = []
    for b in range(x.shape[0]):
        if shared is not None:
            kb, vb = shared[0][b]
        else:
            assert caches is not None and k is not None and v is not None
            kb, vb = caches[b].update_and_fetch(k[b : b + 1], v[b : b + 1])
        kvs.append((kb, vb))
        outs.append(mx.fast.scaled_dot_product_attention(q[b : b + 1], kb, vb, scale=fast.attn.scale, mask=masks[b]))
    o = mx.concatenate(outs, axis=0) if len(outs) > 1 else outs[0]
    if fast.moe:
        return _moe_out(fast.layer, o, x, per_layer_input), kvs, offsets
    out = (fast._attn_out if small else fast._attn_out_eager)(o, x, per_layer_input, fast.layer.layer_scalar)
    return out, kvs, offsets


def forward_rows(
    target: Target, tokens: mx.array, caches: list[TargetCache], softcap: bool = True
) -> tuple[mx.array, mx.array]:
    """Run tokens [B, L] (row b at positions [caches[b].offset, + L)) and append each row's K/V to its cache.

    Text only (a row's image prefill runs alone, through `Target.forward`). Returns (logits [B, L, V]
    float, hidden [B, L, H] after the final norm); softcap=False leaves the logits uncapped (same argmax)."""
    ids = tokens.astype(mx.int32)
    B, L = ids.shape
    inner = target.inner
    h = target.embed(ids)
    per_layer: list[mx.array | None] = [None] * target.n_layers
    if inner.hidden_size_per_layer_input:
        pli = inner._project_per_layer_inputs(h, inner._get_per_layer_inputs(ids))
        per_layer = [pli[:, :, i, :] for i in range(target.n_layers)]
    row_masks = _row_masks(target, caches, L)
    intermediates: list[Any] = [None] * target.n_layers
    for i, fast in enumerate(target.layers):
        masks = [m[fast.layer_type] for m in row_masks]
        own = i < target.first_shared
        layer_caches = [c.layers[i] for c in caches] if own else None
        shared = None if own else intermediates[inner.previous_kvs[i]]
        h, kvs, offsets = _layer(fast, h, masks, layer_caches, per_layer[i], shared)
        intermediates[i] = (kvs, offsets)
    hidden = inner.norm(h)
    return target.logits(hidden, softcap), hidden


# --- the drafter over B rows -------------------------------------------------------------------


def _drafter_step(
    drafter: Drafter, e: mx.array, h: mx.array, kvs: list[dict], positions: mx.array
) -> tuple[mx.array, mx.array]:
    """`Drafter.step` over B rows: e, h [B, 1, Hb]; each row reads its own K/V at its own position."""
    x = mx.concatenate([e, h], axis=-1).astype(drafter.norm.weight.dtype)
    x = drafter.pre_projection(x)
    if getattr(drafter, "_fast", None) is None:
        drafter.use_fast_layers()
    for fast in drafter._fast:
        q, _, _ = fast._attn_in(x, positions)
        outs = []
        for b, kv in enumerate(kvs):
            kb, vb = kv[fast.layer_type]
            outs.append(mx.fast.scaled_dot_product_attention(q[b : b + 1], kb, vb, scale=fast.attn.scale, mask=None))
        o = mx.concatenate(outs, axis=0) if len(outs) > 1 else outs[0]
        x = fast._attn_out(o, x, None, fast.layer.layer_scalar)
    y = drafter.norm(x)
    return y, drafter.post_projection(y)


def _greedy_rows(drafter: Drafter, y: mx.array) -> mx.array:
    """y [B, Hd] -> the drafter's argmax token per row [B] uint32 (only the candidates on the centroid head)."""
    if not drafter.ordered:
        return mx.argmax(drafter.embed_tokens.as_linear(y), axis=-1).astype(mx.uint32)
    k, C = drafter.cfg.centroid_top_k, drafter.cfg.num_centroids
    top = mx.argpartition(-drafter.centroids(y), kth=k - 1, axis=-1)[:, :k]  # [B, k]
    ids = drafter.token_ordering.reshape(C, drafter.vocab_size // C)[top].reshape(y.shape[0], -1)  # [B, m]
    logits = (drafter.embed_tokens(ids) @ y[:, :, None])[..., 0]  # [B, m]; the soft-cap keeps the argmax
    best = mx.argmax(logits, axis=-1)[:, None]
    return mx.take_along_axis(ids, best, axis=-1)[:, 0].astype(mx.uint32)


def _sample_row(
    drafter: Drafter, y: mx.array, temperature: float, top_k: int, top_p: float, key: mx.array
) -> tuple[mx.array, mx.array | tuple[mx.array, mx.array]]:
    """One sampled row (y [Hd]): (token [1] uint32, its log-probs [V] or (candidate ids, their log-probs))."""
    if drafter.ordered:
        ids, sel = drafter._candidates(y)
        lp = sampling.transform_logits_compiled(sel, temperature, top_k, top_p)
        return ids[sampling.sample(lp, key)].reshape(1).astype(mx.uint32), (ids, lp)
    lp = sampling.transform_logits_compiled(drafter.logits(y), temperature, top_k, top_p)
    return sampling.sample(lp, key).reshape(1).astype(mx.uint32), lp


class RowSampling:
    """A sampled row's transform and its draft keys for this round (one per draft step)."""

    def __init__(self, temperature: float, top_k: int, top_p: float, keys: list[mx.array]) -> None:
        self.temperature, self.top_k, self.top_p, self.keys = temperature, top_k, top_p, keys


def draft_rows(
    drafter: Drafter,
    target: Target,
    caches: list[TargetCache],
    bonus: mx.array,
    hidden: mx.array,
    n: int,
    sampled: list[RowSampling | None],
) -> tuple[mx.array, list[mx.array | sampling.SparseLogProbs | None]]:
    """`Drafter.draft` for B rows at once: bonus [B] (each row's token not yet in its cache), hidden [B, Hb].

    Returns (drafts [B, n] uint32, per row its draft log-probs [n, V] (or sparse) when sampled, else None).
    Lazy: nothing waits for the device."""
    B = bonus.shape[0]
    kvs, positions = [], []
    for cache in caches:
        pos, kv = drafter.gather_kv(target, cache, cache.offset)
        kvs.append(kv)
        positions.append(pos)
    pos_arr = mx.array(positions)
    tok = bonus.reshape(B).astype(mx.uint32)
    h = hidden.reshape(B, 1, -1)
    steps: list[mx.array] = []
    row_lp: list[list[Any]] = [[] for _ in range(B)]
    for j in range(n):
        e = target.embed(tok.reshape(B, 1))
        y, h = _drafter_step(drafter, e, h, kvs, pos_arr)
        y = y.reshape(B, -1)
        tok = _greedy_rows(drafter, y) if any(s is None for s in sampled) else mx.zeros((B,), mx.uint32)
        if any(s is not None for s in sampled):
            picks = []
            for b, s in enumerate(sampled):
                if s is None:
                    picks.append(tok[b : b + 1])
                    continue
                t, lp = _sample_row(drafter, y[b], s.temperature, s.top_k, s.top_p, s.keys[j])
                picks.append(t)
                row_lp[b].append(lp)
            tok = mx.concatenate(picks)
        steps.append(tok)
    drafts = mx.stack(steps, axis=1) if steps else mx.zeros((B, 0), mx.uint32)
    return drafts, [_stack_lp(lps) if lps else None for lps in row_lp]


def _stack_lp(lps: list[Any]) -> mx.array | sampling.SparseLogProbs:
    if isinstance(lps[0], tuple):
        return sampling.SparseLogProbs(mx.stack([i for i, _ in lps]), mx.stack([lp for _, lp in lps]))
    return mx.stack(lps)
