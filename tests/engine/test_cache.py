"""The rollback-able sliding-window cache against recomputation from scratch."""

import random

import mlx.core as mx
import numpy as np
import pytest

from core.model.cache import FullKVCache, SlidingKVCache, attention_mask
from core.model.target import load_target

PACK = "tests/data/pack/models"


def _rows(n, start, heads=2, dim=4):
    # a key row encodes its absolute position, so any misplaced row is visible
    pos = np.arange(start, start + n, dtype=np.float32)
    k = np.broadcast_to(pos[None, None, :, None], (1, heads, n, dim)).copy()
    k += np.arange(dim, dtype=np.float32)[None, None, None, :] * 1e-3
    return mx.array(k), mx.array(-k[..., :3])


@pytest.mark.parametrize("seed", range(4))
def test_sliding_cache_random_append_trim_keeps_exact_positions(seed):
    rng = random.Random(seed)
    window = rng.choice([3, 5, 12])
    cache = SlidingKVCache(window, slack=rng.choice([1, 4, 16]))
    for _ in range(300):
        if cache.offset and rng.random() < 0.4:
            # roll back any amount the cache says it can serve
            target = rng.randint(0, cache.offset)
            if cache.can_trim_to(target):
                cache.trim_to(target)
            else:
                with pytest.raises(ValueError):
                    cache.trim_to(target)
                assert cache.start > max(0, target - cache.keep)
        else:
            L = rng.choice([1, 1, 2, 3, 7, 20, 40])
            P = cache.offset
            k, v = _rows(L, P)
            keys, values = cache.update_and_fetch(k, v)
            assert cache.start <= max(0, P - cache.keep)  # every reader's keys are still there
            start = cache.visible_start(P)  # returned: only keys a query of this chunk can see
            assert start == max(0, P - window + 1)
            got = np.array(keys[0, 0, :, 0])
            np.testing.assert_array_equal(got, np.arange(start, P + L, dtype=np.float32))
            np.testing.assert_array_equal(np.array(values), -np.array(keys)[..., :3])
            # right after an append, trimming back to the chunk start must be possible
            assert cache.can_trim_to(P)
        first = max(0, cache.offset - cache.keep)
        kk, _ = cache.fetch(first)
        np.testing.assert_array_equal(np.array(kk[0, 1, :, 0]), np.arange(first, cache.offset, dtype=np.float32))


def test_full_cache_trim_and_regrow():
    c = FullKVCache()
    for P in range(0, 600, 100):
        c.trim_to(P)
        k, v = _rows(100, P)
        keys, _ = c.update_and_fetch(k, v)
        np.testing.assert_array_equal(np.array(keys[0, 0, :, 0]), np.arange(0, P + 100, dtype=np.float32))
    c.trim_to(37)
    assert c.offset == 37
    with pytest.raises(ValueError):
        c.trim_to(38)


def test_attention_mask_semantics():
    m = np.array(attention_mask(5, 3, 2, 6, window=3))  # queries 5..7, keys 2..7
    q = np.arange(5, 8)[:, None]
    k = np.arange(2, 8)[None]
    np.testing.assert_array_equal(m, (k <= q) & (k > q - 3))
    # an image span [3, 7) sees itself both ways, still inside the window (HF sliding rule)
    m = np.array(attention_mask(3, 4, 0, 7, window=3, bidirectional=[(3, 7)]))
    q = np.arange(3, 7)[:, None]
    k = np.arange(0, 7)[None]
    np.testing.assert_array_equal(m, ((k <= q) | ((k >= 3) & (q >= 3))) & (k > q - 3))
    assert attention_mask(9, 1, 7, 3, window=3) is None
    assert attention_mask(9, 1, 0, 10) is None


@pytest.mark.parametrize("family", ["e-style", "moe-style"])
def test_target_random_append_trim_equals_recompute(family):
    """Speculative-style use of the whole target cache past the window equals a fresh prefill."""
    tg = load_target(f"{PACK}/{family}-target")
    rng = random.Random(7)
    cache = tg.make_cache(slack=5)
    seq: list[int] = []
    for step in range(40):
        L = rng.choice([1, 2, 4, 6, 9])
        new = [rng.randrange(30, tg.vocab_size) for _ in range(L)]
        logits, _ = tg.forward(new, cache, logits="all")
        seq += new
        if step % 8 == 7:  # check: the cache's view equals recompute from scratch
            fresh, _ = tg.forward(seq, tg.make_cache(), logits=L)
            np.testing.assert_allclose(np.array(logits), np.array(fresh), atol=2e-5)
        reject = rng.randint(0, L - 1)
        cache.trim(reject)
        del seq[len(seq) - reject :]
    assert len(seq) > 3 * tg.window
