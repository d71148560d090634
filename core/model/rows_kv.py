"""The decoding rows' K/V in one padded buffer per layer, so a batch attends in one call per layer.

A server batch holds rows at different lengths, each accepting its own number of drafts per round.
While a row decodes in the batch its K/V lives here; its `TargetCache` keeps only the bookkeeping
(offsets, sliding starts, so `can_trim_to` and the context checks read as before) and gets its
buffers back when it leaves (`release`), exactly as a solo cache would hold them.

Layout, for each layer with its own K/V (keys and values alike):

    keys [B, kv_heads, S, head_dim]: row b holds absolute positions [start_b, offset_b) in slots
    [0, offset_b - start_b); later slots are stale (rolled-back drafts, padding up to S).

start_b is 0 on full layers; on sliding layers it moves forward when the buffer compacts (`reserve`
drops each row's positions before offset_b - keep, as `SlidingKVCache` does, so any round can still
roll back to its start and the drafter still finds its W + 1 keys). A round writes every row's L new
positions at that row's own slots in one scatter per layer; the boolean masks (one per attention type
and call, [B, 1, L, S]) let each query see exactly the keys the row's solo cache would hand it: causal,
inside the window on sliding layers, nothing stale. Rolling a row back is moving its offset.

Exactness: against the row attending over its own unpadded keys, masked padding changes nothing on the
CPU backend (measured: `mx.fast.scaled_dot_product_attention` over keys padded with masked random keys,
leading or trailing, boolean masks against "causal" or None, 0 of 300 cases differ in any bit;
tests/engine/test_batch.py compares every batched row's ids with its solo run). The price: every row
attends over the batch's longest S (a row at 200 tokens next to one at 8000 computes 8000 scores per
query), and the buffers hold B x S positions per layer until that row leaves (then they shrink to the
longest row that stays). On the demo the padded attention is cheap next to what it saves; a batch that
mixes one very long context with short ones pays for it in memory on the full-attention layers (sliding
layers compact to W + 1 positions a row).
"""

from __future__ import annotations

import mlx.core as mx

from core.model.cache import FullKVCache, SlidingKVCache
from core.model.target import FULL, SLIDING, Target, TargetCache

STEP = 64  # slots come in multiples of this many positions: every row attends over all of them


class RowsKV:
    """The K/V of the rows decoding in a batch (see the module docstring)."""

    def __init__(self, target: Target, step: int = STEP) -> None:
        self.step = step  # slots come in multiples of this
        self.types: list[str] = target.layer_types[: target.first_shared]  # the layers with their own K/V
        self.window = target.window
        self.keep = target.window + 1
        self.caches: list[TargetCache] = []  # the seated rows' caches, in row order
        self._index: dict[int, int] = {}
        self.offsets: list[int] = []
        self.starts: dict[str, list[int]] = {SLIDING: [], FULL: []}
        self.size: dict[str, int] = {SLIDING: 0, FULL: 0}
        self.keys: list[mx.array | None] = [None] * len(self.types)
        self.values: list[mx.array | None] = [None] * len(self.types)

    def __len__(self) -> int:
        return len(self.caches)

    def index(self, cache: TargetCache) -> int | None:
        return self._index.get(id(cache))

    # --- rows in and out ------------------------------------------------------------------------

    def seat(self, caches: list[TargetCache]) -> None:
        """Make `caches` the seated rows: a seated row not among them leaves (its buffers go back to its
        cache), a new one moves in (its buffers come here; its cache keeps the bookkeeping). The order
        afterwards is the rows that stayed, then the new ones: read it from `caches`/`index`."""
        wanted = {id(c) for c in caches}
        for c in [c for c in self.caches if id(c) not in wanted]:
            self.release(c)
        new = [c for c in caches if id(c) not in self._index]
        if not new:
            return
        for t in (SLIDING, FULL):
            used = [_used(c, t) for c in new if c.first_of(t) is not None]
            if used:
                self._resize(t, [0] * len(self.caches), max(self.size[t], self._round_up(max(used))))
        for i, t in enumerate(self.types):
            S = self.size[t]
            parts_k, parts_v = [], []
            for c in new:
                layer = c.layers[i]
                assert layer.keys is not None and layer.values is not None, "a seated row has been prefilled"
                u = _used(c, t)
                pad = [(0, 0), (0, 0), (0, S - u), (0, 0)]
                parts_k.append(mx.pad(layer.keys[..., :u, :], pad))
                parts_v.append(mx.pad(layer.values[..., :u, :], pad))
                layer.keys = layer.values = None  # they live here now
            old_k, old_v = self.keys[i], self.values[i]
            self.keys[i] = mx.concatenate(([old_k] if old_k is not None else []) + parts_k, axis=0)
            self.values[i] = mx.concatenate(([old_v] if old_v is not None else []) + parts_v, axis=0)
        for c in new:
            self.caches.append(c)
            self.offsets.append(c.offset)
            for t in (SLIDING, FULL):
                first = c.first_of(t)
                self.starts[t].append(first.start if isinstance(first, SlidingKVCache) else 0)
        self._reindex()
        mx.eval(*self.state())

    def release(self, cache: TargetCache, keep: bool = True) -> None:
        """The row leaves: keep=True gives its cache its buffers back (positions [start, offset) of each
        layer, a copy: the batch's buffers are not kept alive by it), else its cache is emptied."""
        b = self._index.get(id(cache))
        if b is None:
            return
        for i, t in enumerate(self.types):
            layer = cache.layers[i]
            if keep:
                u = self.offsets[b] - self.starts[t][b]
                k, v = self.keys[i], self.values[i]
                assert k is not None and v is not None
                layer.keys = mx.contiguous(k[b : b + 1, :, :u, :])
                layer.values = mx.contiguous(v[b : b + 1, :, :u, :])
        if keep:
            mx.eval(cache.state())
        else:
            cache.reset()
        rest = [j for j in range(len(self.caches)) if j != b]
        # the rows that stay keep their slots; a buffer sized for the leaving row shrinks with it
        size = {
            t: min(self.size[t], self._round_up(max((self.offsets[j] - self.starts[t][j] for j in rest), default=0)))
            for t in (SLIDING, FULL)
        }
        for i, t in enumerate(self.types):
            k, v = self.keys[i], self.values[i]
            assert k is not None and v is not None
            if rest:
                idx = mx.array(rest)
                self.keys[i], self.values[i] = k[idx, :, : size[t]], v[idx, :, : size[t]]
            else:
                self.keys[i] = self.values[i] = None
        del self.caches[b], self.offsets[b], self.starts[SLIDING][b], self.starts[FULL][b]
        self.size = size if rest else {SLIDING: 0, FULL: 0}
        self._reindex()
        mx.eval(*self.state())  # the old buffers go now, not at the next round

    def _round_up(self, n: int) -> int:
        return max(self.step, -(-n // self.step) * self.step)

    def _reindex(self) -> None:
        self._index = {id(c): j for j, c in enumerate(self.caches)}

    # --- one forward ----------------------------------------------------------------------------

    def reserve(self, L: int) -> None:
        """Room for L new positions in every row: compact the sliding buffers (each row keeps its last
        `keep` positions) or grow, as needed."""
        for t in (SLIDING, FULL):
            if t not in self.types:
                continue
            used = [o - s for o, s in zip(self.offsets, self.starts[t])]
            if max(used) + L <= self.size[t]:
                continue
            drop = [max(0, u - self.keep) for u in used] if t == SLIDING else [0] * len(used)
            need = max(u - d for u, d in zip(used, drop)) + L
            self._resize(t, drop, max(self.size[t], self._round_up(need)))
            if any(drop):  # only sliding buffers compact
                self.starts[t] = [s + d for s, d in zip(self.starts[t], drop)]
                for c, s in zip(self.caches, self.starts[t]):
                    for layer in c.layers:
                        if isinstance(layer, SlidingKVCache):
                            layer.start = s

    def _resize(self, t: str, drop: list[int], size: int) -> None:
        """Each buffer of type t to `size` slots, row b shifted left by drop[b] (stale slots past the end)."""
        S = self.size[t]
        self.size[t] = size
        if not self.caches or (size == S and not any(drop)):
            return
        if any(drop):
            src = mx.minimum(mx.arange(size)[None] + mx.array(drop)[:, None], S - 1)  # [B, size]
        for i, lt in enumerate(self.types):
            if lt != t:
                continue
            for name in ("keys", "values"):
                buf = getattr(self, name)[i]
                assert buf is not None
                if any(drop):
                    B, H, _, D = buf.shape
                    out = mx.take_along_axis(buf, mx.broadcast_to(src[:, None, :, None], (B, H, size, D)), axis=2)
                else:
                    out = mx.pad(buf, [(0, 0), (0, 0), (0, size - S), (0, 0)])
                getattr(self, name)[i] = out

    def write_slots(self, t: str, L: int) -> mx.array:
        """[B, 1, L, 1] int32: the slots the next L positions of each row go to, on layers of type t."""
        first = mx.array([o - s for o, s in zip(self.offsets, self.starts[t])], dtype=mx.int32)
        return (first[:, None] + mx.arange(L, dtype=mx.int32)[None])[:, None, :, None]

    def write(self, i: int, k: mx.array, v: mx.array, slots: mx.array) -> tuple[mx.array, mx.array]:
        """Layer i's new keys/values k, v [B, kv, L, hd] into every row's slots; its whole buffers after."""
        kb, vb = self.keys[i], self.values[i]
        assert kb is not None and vb is not None, "write before seat"
        kb = mx.put_along_axis(kb, mx.broadcast_to(slots, k.shape), k, axis=2)
        vb = mx.put_along_axis(vb, mx.broadcast_to(slots, v.shape), v, axis=2)
        self.keys[i], self.values[i] = kb, vb
        return kb, vb

    def mask(self, t: str, L: int) -> mx.array:
        """[B, 1, L, S] bool: what each of the next L queries of each row sees on layers of type t
        (causal, inside the window on sliding layers; the slots past the row's own positions never)."""
        k_abs = mx.array(self.starts[t])[:, None] + mx.arange(self.size[t])[None]  # [B, S]
        q_abs = mx.array(self.offsets)[:, None] + mx.arange(L)[None]  # [B, L]
        seen = k_abs[:, None, :] <= q_abs[:, :, None]
        if t == SLIDING:
            seen = seen & (k_abs[:, None, :] > q_abs[:, :, None] - self.window)
        return seen[:, None]

    def key_range_mask(self, t: str, first: list[int]) -> mx.array:
        """[B, 1, 1, S] bool: row b's keys of absolute positions [first[b], offset_b) on layers of type t
        (what the drafter reads)."""
        k_abs = mx.array(self.starts[t])[:, None] + mx.arange(self.size[t])[None]
        seen = (k_abs >= mx.array(first)[:, None]) & (k_abs < mx.array(self.offsets)[:, None])
        return seen[:, None, None, :]

    def advance(self, L: int) -> None:
        """Every row's L positions written by the forward are in."""
        self.offsets = [o + L for o in self.offsets]
        for c, o in zip(self.caches, self.offsets):
            for layer in c.layers:
                layer.offset = o

    def trim_to(self, cache: TargetCache, length: int) -> None:
        """Roll the row back to `length` positions (its slots past it become stale)."""
        b = self._index[id(cache)]
        cache.trim_to(length)  # checks, and keeps the row's bookkeeping
        self.offsets[b] = length

    def state(self) -> list[mx.array]:
        return [a for a in self.keys + self.values if a is not None]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.state())


def _used(cache: TargetCache, t: str) -> int:
    """The slots the cache's layers of type t fill: positions [start, offset)."""
    layer = cache.first_of(t)
    if isinstance(layer, SlidingKVCache):
        return layer.offset - layer.start
    assert isinstance(layer, FullKVCache)
    return layer.offset
