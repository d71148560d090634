"""core.decode.prefix_cache: the server's LRU of finished rows' caches.

Caches here are filled with known K/V (each position's value is its position), so what a copy holds
is checked value by value: the longest restorable prefix is served, a copy never writes into its
entry, the LRU is bounded by count and by bytes, and a prefix the sliding buffer has compacted
away is refused."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from core.decode.prefix_cache import MIN_REUSE, PrefixCache, clone_cache, shared_prefix
from core.model.target import FULL, SLIDING, TargetCache

WINDOW, SLACK = 4, 8


def _cache(n: int, chunk: int = 3) -> TargetCache:
    """A sliding and a full layer holding positions [0, n): key and value of position p are p."""
    cache = TargetCache([SLIDING, FULL], WINDOW, SLACK)
    for a in range(0, n, chunk):
        b = min(n, a + chunk)
        kv = mx.arange(a, b, dtype=mx.float32).reshape(1, 1, b - a, 1)
        for layer in cache.layers:
            layer.update_and_fetch(kv, kv)
    return cache


def _positions(cache: TargetCache, layer: int, first: int) -> list[float]:
    k, _ = cache.layers[layer].fetch(first)
    return mx.flatten(k).tolist()


def test_shared_prefix() -> None:
    a = np.array([1, 2, 3, 4])
    assert shared_prefix(a, np.array([1, 2, 9])) == 2
    assert shared_prefix(a, np.array([1, 2])) == 2 and shared_prefix(a, np.array([7])) == 0


def test_a_copy_holds_the_prefix_and_never_writes_into_its_entry() -> None:
    lru = PrefixCache()
    ids = list(range(100, 100 + 30))
    lru.put(ids, _cache(30, chunk=30))  # one chunk: no compaction, every position restorable
    got = lru.take(ids[:20] + [7, 7])
    assert got is not None
    copy, keep = got
    assert keep == 20 and copy.offset == 20
    assert _positions(copy, 1, 0) == list(range(20))
    kv = mx.full((1, 1, 2, 1), -1.0)
    for layer in copy.layers:
        layer.update_and_fetch(kv, kv)
    again = lru.take(ids + [5])
    assert again is not None and again[1] == 30  # the whole entry, untouched by the copy's writes
    assert _positions(again[0], 1, 0) == list(range(30))
    assert _positions(again[0], 0, 30 - WINDOW) == list(range(26, 30))
    assert _positions(copy, 1, 18) == [18, 19, -1, -1]


def test_the_last_prompt_token_always_runs_again_and_short_prefixes_are_not_served() -> None:
    lru = PrefixCache()
    ids = list(range(40))
    lru.put(ids, _cache(40, chunk=40))
    got = lru.take(ids)
    assert got is not None and got[1] == 39
    assert lru.take(ids[: MIN_REUSE - 1] + [999, 999]) is None


def test_a_compacted_prefix_is_refused() -> None:
    cache = _cache(40, chunk=3)  # buffer of keep + slack slots: compacted several times
    sliding = cache.layers[0]
    assert sliding.start > 0 and not cache.can_trim_to(20)
    lru = PrefixCache()
    ids = list(range(40))
    lru.put(ids, cache)
    assert lru.take(ids[:20] + [1, 2]) is None
    got = lru.take(ids + [1])
    assert got is not None and got[1] == 40  # the end is still exact
    assert _positions(got[0], 0, 40 - WINDOW) == [36, 37, 38, 39]


def test_the_lru_is_bounded_by_count_and_bytes_and_keeps_the_longest() -> None:
    lru = PrefixCache(max_entries=2)
    a, b, c = (list(range(k * 1000, k * 1000 + 30)) for k in (1, 2, 3))
    for ids in (a, b):
        lru.put(ids, _cache(30, chunk=30))
    assert lru.take(a + [0]) is not None  # a is now the most recently used
    lru.put(c, _cache(30, chunk=30))
    assert len(lru) == 2 and lru.take(b + [0]) is None and lru.take(a + [0]) is not None
    # an entry that extends another replaces it
    lru.put(a + [5, 6, 7], _cache(33, chunk=33))
    assert len(lru) == 2 and lru.take(a + [5, 6, 7, 8]) is not None
    one = _cache(30, chunk=30).nbytes
    small = PrefixCache(max_bytes=int(one * 1.5))
    small.put(a, _cache(30, chunk=30))
    small.put(b, _cache(30, chunk=30))
    assert len(small) == 1 and small.nbytes <= small.max_bytes and small.take(b + [0]) is not None
    tiny = PrefixCache(max_bytes=one - 1)  # an entry larger than the bound is not kept at all
    tiny.put(a, _cache(30, chunk=30))
    assert len(tiny) == 0
    none = PrefixCache(max_entries=0)
    none.put(a, _cache(30, chunk=30))
    assert len(none) == 0


def test_clone_of_an_empty_layer() -> None:
    cache = TargetCache([SLIDING, FULL], WINDOW, SLACK)
    out = clone_cache(cache)
    assert out.offset == 0 and out.layers[0] is not cache.layers[0]
