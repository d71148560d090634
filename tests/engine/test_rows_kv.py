"""The batch's shared K/V (core.model.rows_kv) against each row's own solo cache, bit for bit.

Random rows (prompts across the sliding window, so buffers compact) join, decode rounds of random
block sizes with random acceptance (rollbacks), leave and come back. Every round, each row's attention
over the shared buffers with the batch's mask must equal, in every bit, the same query over what the
row's solo cache (`TargetCache` fed the same keys) hands `Target.forward`, with its masks; the drafter's
read (`key_range_mask`) likewise; a released cache must hold what the solo cache holds.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import mlx.core as mx
import numpy as np
import pytest

from core.model.cache import SlidingKVCache, attention_mask
from core.model.rows_kv import RowsKV
from core.model.target import FULL, SLIDING, Target, TargetCache, _sliding_start_after

WINDOW = 12
TYPES = [SLIDING, FULL, SLIDING]
DIMS = {SLIDING: 8, FULL: 16}  # head dims differ by type, as in Gemma 4
NH, KVH = 2, 1


def _target() -> Target:
    return cast(Target, SimpleNamespace(layer_types=TYPES, first_shared=len(TYPES), window=WINDOW))


def _kv(rng: np.random.Generator, L: int) -> list[tuple[mx.array, mx.array]]:
    """Random new keys/values [1, KVH, L, d] for each layer."""
    out = []
    for t in TYPES:
        d = DIMS[t]
        out.append(
            (
                mx.array(rng.standard_normal((1, KVH, L, d)), mx.float32),
                mx.array(rng.standard_normal((1, KVH, L, d)), mx.float32),
            )
        )
    return out


def _prefill(rng: np.random.Generator, n: int) -> tuple[TargetCache, TargetCache]:
    """A row's cache after an n-token prompt in random chunks, and its solo twin (same keys)."""
    cache, twin = TargetCache(TYPES, WINDOW, slack=16), TargetCache(TYPES, WINDOW, slack=16)
    done = 0
    while done < n:
        L = min(n - done, int(rng.integers(1, 40)))
        for i, (k, v) in enumerate(_kv(rng, L)):
            cache.layers[i].update_and_fetch(k, v)
            twin.layers[i].update_and_fetch(k, v)
        done += L
    mx.eval(cache.state(), twin.state())
    return cache, twin


def _solo_mask(c: Any, t: str, L: int) -> Any:
    """The mask `Target.forward` gives L new tokens on a layer of type t (the keys start where its cache's
    update_and_fetch will start them)."""
    P = c.offset
    if t == FULL:
        return "causal" if L > 1 else None
    start = _sliding_start_after(c, L)
    return attention_mask(P, L, start, P + L - start, WINDOW)


@pytest.mark.parametrize("seed", range(4))
def test_shared_buffers_attend_exactly_as_each_rows_own_cache(seed: int) -> None:
    rng = np.random.default_rng(seed)
    kv = RowsKV(_target(), step=16)  # small buffers: they grow and compact often
    rows: list[tuple[TargetCache, TargetCache]] = [_prefill(rng, int(rng.integers(1, 60))) for _ in range(3)]
    away: list[tuple[TargetCache, TargetCache]] = []  # released rows that may come back
    compacted = 0
    for _ in range(40):
        r = rng.random()
        if r < 0.1 and len(rows) > 1:  # a row leaves (its buffers go back to its cache)
            cache, twin = rows.pop(int(rng.integers(len(rows))))
            kv.release(cache)
            for i in range(len(TYPES)):
                got, want = cache.layers[i], twin.layers[i]
                assert got.offset == want.offset
                first = max(getattr(got, "start", 0), getattr(want, "start", 0))
                for a, b in zip(got.fetch(first), want.fetch(first)):
                    assert mx.array_equal(a, b).item()
            away.append((cache, twin))
        elif r < 0.2:  # a row joins: new, or one that left and decoded alone meanwhile
            if away and rng.random() < 0.5:
                cache, twin = away.pop()
                for i, (k, v) in enumerate(_kv(rng, 3)):
                    cache.layers[i].update_and_fetch(k, v)
                    twin.layers[i].update_and_fetch(k, v)
                rows.append((cache, twin))
            else:
                rows.append(_prefill(rng, int(rng.integers(1, 80))))
        kv.seat([c for c, _ in rows])
        rows.sort(key=lambda row: cast(int, kv.index(row[0])))
        assert [kv.index(c) for c, _ in rows] == list(range(len(rows)))
        B, L = len(rows), int(rng.integers(1, 6))
        before = dict(kv.starts)
        P = [c.offset for c, _ in rows]
        new = [_kv(rng, L) for _ in rows]
        kv.reserve(L)
        compacted += kv.starts != before
        slots = {t: kv.write_slots(t, L) for t in (SLIDING, FULL)}
        masks = {t: kv.mask(t, L) for t in (SLIDING, FULL)}
        for i, t in enumerate(TYPES):
            d = DIMS[t]
            q = mx.array(rng.standard_normal((B, NH, L, d)), mx.float32)
            k = mx.concatenate([n[i][0] for n in new])
            v = mx.concatenate([n[i][1] for n in new])
            kb, vb = kv.write(i, k, v, slots[t])
            together = mx.fast.scaled_dot_product_attention(q, kb, vb, scale=d**-0.5, mask=masks[t])
            for b, (_, twin) in enumerate(rows):
                layer = twin.layers[i]
                mask = _solo_mask(layer, t, L)
                ks, vs = layer.update_and_fetch(k[b : b + 1], v[b : b + 1])
                alone = mx.fast.scaled_dot_product_attention(q[b : b + 1], ks, vs, scale=d**-0.5, mask=mask)
                assert mx.array_equal(together[b : b + 1], alone).item(), f"row {b} layer {i} L={L}"
        kv.advance(L)
        # the drafter's read: each row's keys of positions [first, offset) of a type
        for t in (SLIDING, FULL):
            i = TYPES.index(t)
            firsts = [max(0, c.offset - WINDOW - 1) if t == SLIDING else 0 for c, _ in rows]
            q = mx.array(rng.standard_normal((B, NH, 1, DIMS[t])), mx.float32)
            kb, vb = kv.keys[i], kv.values[i]
            assert kb is not None and vb is not None
            together = mx.fast.scaled_dot_product_attention(q, kb, vb, scale=1.0, mask=kv.key_range_mask(t, firsts))
            for b, (_, twin) in enumerate(rows):
                ks, vs = twin.layers[i].fetch(max(firsts[b], getattr(twin.layers[i], "start", 0)))
                alone = mx.fast.scaled_dot_product_attention(q[b : b + 1], ks, vs, scale=1.0, mask=None)
                assert mx.array_equal(together[b : b + 1], alone).item()
        for b, (cache, twin) in enumerate(rows):  # each row accepts its own prefix
            keep = P[b] + int(rng.integers(1, L + 1))
            kv.trim_to(cache, keep)
            twin.trim_to(keep)
            assert cache.offset == twin.offset == kv.offsets[b] == keep
    assert compacted, "the scenario never compacted a sliding buffer"
    for cache, _ in rows:
        kv.release(cache, keep=False)
        assert cache.offset == 0 and not cache.state()
    assert len(kv) == 0 and not kv.state()


def test_a_seated_rows_cache_keeps_the_bookkeeping_and_not_the_buffers() -> None:
    rng = np.random.default_rng(9)
    kv = RowsKV(_target())
    cache, twin = _prefill(rng, 60)  # past the window: its sliding layers dropped their first positions
    kv.seat([cache])
    assert not cache.state() and cache.offset == 60  # its buffers live in the batch
    layer = cache.layers[0]
    assert isinstance(layer, SlidingKVCache) and layer.start > 0
    with pytest.raises(ValueError):  # a rollback past what the sliding layers kept is refused, as alone
        kv.trim_to(cache, 10)
    kv.trim_to(cache, 58)
    kv.release(cache)
    twin.trim_to(58)
    assert cache.offset == 58 and cache.layers[1].fetch(0)[0].shape[2] == 58
    assert mx.array_equal(cache.layers[1].fetch(0)[0], twin.layers[1].fetch(0)[0]).item()


def test_a_batch_attends_once_per_layer_whatever_its_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """The point of the shared buffers: B rows cost one attention call per layer (and per drafter layer and
    step), not B; and the rows still decide what they decide alone."""
    from core.model.batched import draft_rows, forward_rows
    from core.model.drafter import load_drafter
    from core.model.target import load_target

    pack = "tests/data/pack/models"
    tg, dr = load_target(f"{pack}/e-style-target"), load_drafter(f"{pack}/e-style-assistant")
    prompts = [[2, 105, 9 + i, 17, 33 + 2 * i][: 3 + i] for i in range(3)]
    caches, alone = [], []
    for ids in prompts:
        c = tg.make_cache()
        logits, _ = tg.forward(ids, c)
        alone.append(int(mx.argmax(logits[-1]).item()))
        caches.append(c)
    kv = RowsKV(tg)
    kv.seat(caches)
    from core.model import batched

    calls = []
    attend = batched.attend  # mx.fast.scaled_dot_product_attention, or its grouped-heads form on the CPU
    monkeypatch.setattr(batched, "attend", lambda *a, **k: calls.append(1) or attend(*a, **k))
    bonus = mx.array(alone, dtype=mx.uint32)
    drafts, _ = draft_rows(dr, tg, kv, bonus, mx.zeros((3, tg.hidden_size)), 2, [None] * 3)
    assert len(calls) == 2 * len(dr.layer_types)
    calls.clear()
    logits, _ = forward_rows(tg, mx.concatenate([bonus[:, None], drafts], axis=1), kv)
    assert len(calls) == tg.n_layers
    for b, (ids, c) in enumerate(zip(prompts, caches)):  # each row's first verify position, as alone
        solo = tg.make_cache()
        want, _ = tg.forward(ids + [alone[b]], solo)
        assert int(mx.argmax(logits[b, 0]).item()) == int(mx.argmax(want[-1]).item())
        assert c.offset == len(ids) + 3


def test_a_long_row_leaving_takes_its_memory_with_it() -> None:
    """Every row's buffers are as long as the longest row's: when that row leaves, they shrink to what the
    rows that stay need, and those rows attend as before."""
    rng = np.random.default_rng(3)
    kv = RowsKV(_target(), step=16)
    short, short_twin = _prefill(rng, 10)
    long, _ = _prefill(rng, 200)
    kv.seat([short, long])
    full = TYPES.index(FULL)
    assert kv.size[FULL] >= 200
    with_long = kv.nbytes
    kv.release(long)
    assert kv.size[FULL] == 16 and kv.nbytes < with_long / 5
    kv.reserve(1)
    q = mx.array(rng.standard_normal((1, NH, 1, DIMS[FULL])), mx.float32)
    k, v = _kv(rng, 1)[full]
    kb, vb = kv.write(full, k, v, kv.write_slots(FULL, 1))
    together = mx.fast.scaled_dot_product_attention(q, kb, vb, scale=1.0, mask=kv.mask(FULL, 1))
    ks, vs = short_twin.layers[full].update_and_fetch(k, v)
    assert mx.array_equal(together, mx.fast.scaled_dot_product_attention(q, ks, vs, scale=1.0, mask=None)).item()
