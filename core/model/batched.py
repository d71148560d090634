"""Several sequences through the target (and the drafter) in one call, over the rows' shared K/V.

A server batch holds rows at different lengths, each with its own offsets, sliding-window state and
rollback. Here the rows' tokens go through the model as one [B, L, H] tensor, and each layer attends
in one call over every row's K/V padded into one buffer (`core.model.rows_kv.RowsKV`), a boolean mask
per attention type showing each row exactly the keys its solo cache would:

    x [B, L, H] -> input norm, q/k/v, q/k/v norms, RoPE at each row's own offset   (batched)
    k, v -> one scatter into each row's slots; sdpa(q, all rows' keys, mask [B,1,L,S]) (batched)
    o [B, nh, L, hd] -> o_proj, norms, MLP (or MoE), per-layer input, scalar      (batched)

Rows accept different numbers of drafts every round: each row's slots are its own (row b's positions
[start_b, offset_b) at slots [0, offset_b - start_b)), so a rollback moves one row's offset and a
round writes every row at its own slot with one `put_along_axis`. It replaced one attention call (and
a cache update, with its slices) per row per layer. Measured on the demo (CPU backend,
`scripts/bench_serve.py --streams 4,8 --compare`, interleaved): the server's CPU time per token fell
9.2 -> 7.9 ms at 4 streams and 7.5 -> 5.3 ms at 8; one plain forward of 4 rows alone did not move
(24.2 against 23.9 ms): what grows with the rows is attention's per-row BLAS calls, which stay.

Every row of one call has the same number of new tokens L (the batch's block size).

The compiled layer pieces (core.model.layers) serve every row count. A compiled piece is traced per
input shape, and a batch meets a new [B, L] whenever a row joins or leaves or the block size changes:
each costs one trace the first time in a process (for the demo on this CPU, with its kernels in the cache:
a first forward of 14-24 ms against 6-10 ms after, at B = 2, 3, 5 and L = 1, 3; a first draft step 3-5 ms
against 1.2-1.6). The C++ kernels the CPU backend builds for them are shared by every B > 1 and kept in the
kernel cache between runs.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn

from core import sampling
from core.model.drafter import Drafter
from core.model.layers import COMPILED_MAX_LEN, FastLayer, attend
from core.model.rows_kv import RowsKV
from core.model.target import Target


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
    mask: mx.array,
    offsets: mx.array,
    kv: RowsKV,
    i: int,
    slots: mx.array | None,
    per_layer_input: mx.array | None,
    shared: tuple[mx.array, mx.array] | None,
    tables: dict,
) -> tuple[mx.array, tuple[mx.array, mx.array]]:
    """One decoder layer over B rows: x [B, L, H]. A layer with its own K/V writes the rows' new K/V at
    their `slots` in `kv`; a shared layer reads `shared` (the buffers of the layer it reads). Returns
    (h, the K/V buffers it attended over)."""
    L = x.shape[1]
    small = L <= COMPILED_MAX_LEN and not fast.moe
    q, k, v = (fast._attn_in if small else fast._attn_in_eager)(x, fast.rope_input(offsets, L, tables))
    if shared is None:
        assert k is not None and v is not None and slots is not None, "a layer with its own K/V writes it"
        shared = kv.write(i, k, v, slots)
    kb, vb = shared
    o = attend(q, kb, vb, fast.attn.scale, mask, tables)
    if fast.moe:
        return _moe_out(fast.layer, o, x, per_layer_input), shared
    return (fast._attn_out if small else fast._attn_out_eager)(o, x, per_layer_input, fast.layer.layer_scalar), shared


def forward_rows(target: Target, tokens: mx.array, kv: RowsKV, softcap: bool = True) -> tuple[mx.array, mx.array]:
    """Run tokens [B, L] (row b at positions [its offset, + L)) and append each row's K/V in `kv`.

    Text only (a row's image prefill runs alone, through `Target.forward`). Returns (logits [B, L, V]
    float, hidden [B, L, H] after the final norm); softcap=False leaves the logits uncapped (same argmax)."""
    ids = tokens.astype(mx.int32)
    B, L = ids.shape
    assert B == len(kv), "one row of tokens per seated row"
    inner = target.inner
    h = target.embed(ids)
    per_layer: list[mx.array | None] = [None] * target.n_layers
    if inner.hidden_size_per_layer_input:
        pli = inner._project_per_layer_inputs(h, inner._get_per_layer_inputs(ids))
        per_layer = [pli[:, :, i, :] for i in range(target.n_layers)]
    kv.reserve(L)
    offsets = mx.array(kv.offsets)
    types = set(kv.types)
    masks = {t: kv.mask(t, L) for t in types}
    slots = {t: kv.write_slots(t, L) for t in types}
    buffers: list[Any] = [None] * target.n_layers
    tables: dict = {}  # shared by the layers: the rows' RoPE tables (FastLayer.rope_input), the masks `attend` folds
    for i, fast in enumerate(target.layers):
        t = fast.layer_type
        own = i < target.first_shared
        shared = None if own else buffers[inner.previous_kvs[i]]
        args = (masks[t], offsets, kv, i, slots[t] if own else None, per_layer[i], shared, tables)
        h, buffers[i] = _layer(fast, h, *args)
    kv.advance(L)
    hidden = inner.norm(h)
    return target.logits(hidden, softcap), hidden


# --- the drafter over B rows -------------------------------------------------------------------


def _drafter_step(
    drafter: Drafter, e: mx.array, h: mx.array, kv: dict[str, tuple[mx.array, mx.array, mx.array]], positions: mx.array
) -> tuple[mx.array, mx.array]:
    """`Drafter.step` over B rows: e, h [B, 1, Hb]; kv per layer type (keys, values, mask [B, 1, 1, S]):
    each row reads its own keys (the mask) at its own position."""
    x = mx.concatenate([e, h], axis=-1).astype(drafter.norm.weight.dtype)
    x = drafter.pre_projection(x)
    if getattr(drafter, "_fast", None) is None:
        drafter.use_fast_layers()
    tables: dict = {}
    for fast in drafter._fast:
        q, _, _ = fast._attn_in(x, fast.rope_input(positions, 1, tables))
        kb, vb, mask = kv[fast.layer_type]
        o = attend(q, kb, vb, fast.attn.scale, mask, tables)
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
    kv: RowsKV,
    bonus: mx.array,
    hidden: mx.array,
    n: int,
    sampled: list[RowSampling | None],
) -> tuple[mx.array, list[mx.array | sampling.SparseLogProbs | None]]:
    """`Drafter.draft` for B rows at once: bonus [B] (each row's token not yet in its cache), hidden [B, Hb].

    Returns (drafts [B, n] uint32, per row its draft log-probs [n, V] (or sparse) when sampled, else None).
    Lazy: nothing waits for the device."""
    B = bonus.shape[0]
    windows = [drafter.key_windows(o) for o in kv.offsets]
    pos_arr = mx.array([pos for pos, _ in windows])
    read: dict[str, tuple[mx.array, mx.array, mx.array]] = {}
    for kind in set(drafter.layer_types):
        i = target.producers[kind]
        kb, vb = kv.keys[i], kv.values[i]
        assert kb is not None and vb is not None, "draft before seat"
        read[kind] = (kb, vb, kv.key_range_mask(kind, [firsts[kind] for _, firsts in windows]))
    tok = bonus.reshape(B).astype(mx.uint32)
    h = hidden.reshape(B, 1, -1)
    steps: list[mx.array] = []
    row_lp: list[list[Any]] = [[] for _ in range(B)]
    for j in range(n):
        e = target.embed(tok.reshape(B, 1))
        y, h = _drafter_step(drafter, e, h, read, pos_arr)
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
