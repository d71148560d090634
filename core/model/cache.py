"""Target KV caches that can roll back at any context length.

mlx-lm's RotatingKVCache stops being trimmable once the context passes the sliding window, which
breaks speculative decoding (rejected drafts would stay visible). `SlidingKVCache` keeps a linear
buffer of the last `keep` positions plus slack, compacts only when the buffer is full, and knows
the absolute position of every key, so any tail written since the last compaction can be trimmed.

Both caches follow the protocol mlx-lm's Attention uses: `offset` (absolute position of the next
token, read for RoPE) and `update_and_fetch(keys, values)`. Masks are built by the caller, which
knows the absolute position of the first key returned (`SlidingKVCache.visible_start`; 0 for full
layers).

Shapes: keys/values [B, kv_heads, T, head_dim].
"""

from __future__ import annotations

import mlx.core as mx


class SlidingKVCache:
    """Keys of a sliding-window layer: always the last `keep` positions before a new chunk, plus it.

    keep = window + 1 covers every reader: a query at position q needs keys > q - W, and the
    drafter's widest convention reads the last W + 1 keys; so after appending a chunk at P the
    cache can still be trimmed back to P and serve both.
    """

    def __init__(self, window: int, slack: int = 256):
        self.window = window
        self.keep = window + 1
        self.slack = max(1, slack)
        self.keys: mx.array | None = None
        self.values: mx.array | None = None
        self.start = 0  # absolute position of buffer slot 0
        self.offset = 0  # absolute position of the next token

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        L = keys.shape[2]
        used = self.offset - self.start
        if self.keys is None or self.values is None:
            self._allocate(keys, values, self.keep + max(L, self.slack))
        elif used + L > self.keys.shape[2]:
            # compact: slide the last `keep` positions to the front (and grow for a long chunk)
            drop = max(0, used - self.keep)
            kept_k = self.keys[..., drop:used, :]
            kept_v = self.values[..., drop:used, :]
            size = max(self.keys.shape[2], self.keep + L)
            self._allocate(keys, values, size)
            self.keys[..., : used - drop, :] = kept_k
            self.values[..., : used - drop, :] = kept_v
            self.start += drop
            used -= drop
        assert self.keys is not None and self.values is not None  # allocated above
        self.keys[..., used : used + L, :] = keys
        self.values[..., used : used + L, :] = values
        self.offset += L
        # only keys some query of this chunk can see: positions > (first query) - window
        a = self.visible_start(self.offset - L) - self.start
        return self.keys[..., a : used + L, :], self.values[..., a : used + L, :]

    def visible_start(self, first_query: int) -> int:
        return max(self.start, first_query - self.window + 1)

    def _allocate(self, keys: mx.array, values: mx.array, size: int) -> None:
        B, H, _, Dk = keys.shape
        Dv = values.shape[3]
        self.keys = mx.zeros((B, H, size, Dk), keys.dtype)
        self.values = mx.zeros((B, H, size, Dv), values.dtype)

    def can_trim_to(self, length: int) -> bool:
        """Whether trimming to `length` tokens leaves every key a later reader needs."""
        if length >= self.offset:
            return length == self.offset
        return self.start <= max(0, length - self.keep)

    def trim(self, n: int) -> int:
        n = max(0, min(n, self.offset - self.start))
        self.offset -= n
        return n

    def trim_to(self, length: int) -> None:
        if not self.can_trim_to(length):
            raise ValueError(
                f"sliding cache holds positions {self.start}..{self.offset - 1}; cannot roll back to {length}"
            )
        self.offset = length

    def fetch(self, first: int) -> tuple[mx.array, mx.array]:
        """Keys/values of absolute positions [first, offset)."""
        if first < self.start:
            raise ValueError(f"position {first} was dropped from the sliding cache (starts at {self.start})")
        a, b = first - self.start, self.offset - self.start
        assert self.keys is not None and self.values is not None, "fetch before the first update"
        return self.keys[..., a:b, :], self.values[..., a:b, :]

    @property
    def nbytes(self) -> int:
        return 0 if self.keys is None or self.values is None else self.keys.nbytes + self.values.nbytes


class FullKVCache:
    """Keys of a full-attention layer: a growing buffer, trimmable anywhere."""

    step = 256

    def __init__(self) -> None:
        self.keys: mx.array | None = None
        self.values: mx.array | None = None
        self.offset = 0

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        L = keys.shape[2]
        if self.keys is None or self.offset + L > self.keys.shape[2]:
            B, H, _, Dk = keys.shape
            Dv = values.shape[3]
            size = ((self.offset + L + self.step - 1) // self.step) * self.step
            new_k = mx.zeros((B, H, size, Dk), keys.dtype)
            new_v = mx.zeros((B, H, size, Dv), values.dtype)
            if self.keys is not None and self.values is not None and self.offset:
                new_k[..., : self.offset, :] = self.keys[..., : self.offset, :]
                new_v[..., : self.offset, :] = self.values[..., : self.offset, :]
            self.keys, self.values = new_k, new_v
        assert self.keys is not None and self.values is not None  # allocated above
        self.keys[..., self.offset : self.offset + L, :] = keys
        self.values[..., self.offset : self.offset + L, :] = values
        self.offset += L
        return self.keys[..., : self.offset, :], self.values[..., : self.offset, :]

    def can_trim_to(self, length: int) -> bool:
        return 0 <= length <= self.offset

    def trim(self, n: int) -> int:
        n = max(0, min(n, self.offset))
        self.offset -= n
        return n

    def trim_to(self, length: int) -> None:
        if not self.can_trim_to(length):
            raise ValueError(f"full cache holds {self.offset} positions; cannot extend to {length}")
        self.offset = length

    def fetch(self, first: int = 0) -> tuple[mx.array, mx.array]:
        assert self.keys is not None and self.values is not None, "fetch before the first update"
        return self.keys[..., first : self.offset, :], self.values[..., first : self.offset, :]

    @property
    def nbytes(self) -> int:
        return 0 if self.keys is None or self.values is None else self.keys.nbytes + self.values.nbytes


def attention_mask(
    q_start: int,
    n_queries: int,
    key_start: int,
    n_keys: int,
    window: int | None = None,
    bidirectional: list[tuple[int, int]] | None = None,
    spans_past_window: bool = False,
) -> mx.array | None:
    """Boolean mask [n_queries, n_keys] over absolute positions (True = attend).

    Causal, optionally limited to keys with k > q - window (sliding layers). `bidirectional`
    spans [a, b) let positions inside one span see each other both ways (image soft tokens on
    sliding layers, HF semantics: (causal OR same span) AND inside the window).
    spans_past_window: the 12B unified rule instead, (causal AND inside the window) OR same span;
    the caller must pass keys from the first position of every span (a span sits in one chunk).
    Returns None when every key is visible to every query (a single query with no window cut).
    """
    if n_queries == 1 and not bidirectional:
        first_visible = q_start - window + 1 if window is not None else 0
        if key_start >= first_visible and key_start + n_keys - 1 <= q_start:
            return None
    q = mx.arange(q_start, q_start + n_queries)[:, None]
    k = mx.arange(key_start, key_start + n_keys)[None]
    allowed = k <= q
    same = None
    for a, b in bidirectional or ():
        if b > a:
            inside = (q >= a) & (q < b) & (k >= a) & (k < b)
            same = inside if same is None else same | inside
    if spans_past_window:
        if window is not None:
            allowed = allowed & (k > q - window)
        return allowed if same is None else allowed | same
    if same is not None:
        allowed = allowed | same
    if window is not None:
        allowed = allowed & (k > q - window)
    return allowed
