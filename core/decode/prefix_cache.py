"""Prompt caches kept across server requests (issue 25): a request that continues an earlier
conversation prefills only its new tokens.

Agents resend the whole conversation every time. When a batched row finishes, its `TargetCache`
(holding exactly the ids it prefilled and committed) goes into a small LRU, bounded by bytes and by
count. A new text-only request takes a copy of the entry that shares the longest prefix with its
prompt, trimmed to that prefix, and prefills the rest.

Exactness (DESIGN.md, section 4): a sliding-window cache cannot give back positions it has compacted
away, so an entry only serves a prefix it can still trim to exactly (`TargetCache.can_trim_to`); the
state it then holds is the state a fresh prefill of that prefix leaves (the keys every later query
can see, at their absolute positions). At least the prompt's last token is always run again, so the
prefill still yields its logits and hidden state. Prompts with images or audio are neither stored
nor served (their soft-token ids are the same for every image; the solo path's ImageSpan rules are
not worth repeating here).

The copy shares the entry's buffers until it writes: MLX's slice assignment on a distinct array
object never changes the entry's arrays, so two requests may continue the same conversation.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from core.model.target import TargetCache

DEFAULT_MAX_BYTES = 1 << 30  # 1 GiB of K/V across entries
DEFAULT_MAX_ENTRIES = 16
MIN_REUSE = 16  # a shorter shared prefix (a BOS and a turn marker) is not worth a copy


@dataclass
class _Entry:
    ids: np.ndarray  # int64 [T]: the ids whose K/V the cache holds, in order
    cache: TargetCache
    nbytes: int


def clone_cache(cache: TargetCache) -> TargetCache:
    """A cache with the same contents whose writes never reach `cache` (buffers shared until written)."""
    out = copy.copy(cache)
    out.layers = []
    for layer in cache.layers:
        c = copy.copy(layer)
        if layer.keys is not None and layer.values is not None:
            c.keys, c.values = layer.keys[:], layer.values[:]  # distinct array objects
        out.layers.append(c)
    return out


def shared_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """The length of the longest common prefix of two id arrays."""
    n = min(a.size, b.size)
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


class PrefixCache:
    """An LRU of finished rows' caches, keyed by the ids they hold (see the module docstring)."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._next = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self._entries.values())

    def put(self, ids: Sequence[int], cache: TargetCache) -> None:
        """Keep `cache` (which holds exactly `ids`; the caller gives it up); an entry it extends goes."""
        if cache.offset != len(ids) or len(ids) < MIN_REUSE or self.max_entries < 1:
            return
        size = cache.nbytes
        if size > self.max_bytes:
            return
        arr = np.asarray(ids, dtype=np.int64)
        for key, e in list(self._entries.items()):  # an entry this one extends holds nothing more
            if e.ids.size <= arr.size and shared_prefix(e.ids, arr) == e.ids.size:
                del self._entries[key]
        self._entries[self._next] = _Entry(arr, cache, size)
        self._next += 1
        while len(self._entries) > self.max_entries or self.nbytes > self.max_bytes:
            self._entries.popitem(last=False)

    def take(self, prompt: Sequence[int]) -> tuple[TargetCache, int] | None:
        """A copy of the entry sharing the longest exactly-restorable prefix with `prompt`, trimmed to it,
        and that prefix's length (< len(prompt)); None when no entry shares MIN_REUSE ids or more."""
        arr = np.asarray(prompt, dtype=np.int64)[: max(0, len(prompt) - 1)]  # the last token runs again
        best: tuple[int, int] | None = None
        for key, e in self._entries.items():
            keep = shared_prefix(e.ids, arr)
            if keep >= MIN_REUSE and e.cache.can_trim_to(keep) and (best is None or keep > best[1]):
                best = (key, keep)
        if best is None:
            return None
        key, keep = best
        self._entries.move_to_end(key)
        cache = clone_cache(self._entries[key].cache)
        cache.trim_to(keep)
        return cache, keep

    def clear(self) -> None:
        self._entries.clear()
