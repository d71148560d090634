"""The target's log-probabilities of the tokens a turn emits (OpenAI's `logprobs` / `top_logprobs`).

They are the target's own distribution at each emitted position: log_softmax of its soft-capped logits,
before temperature, top-k or top-p (vLLM's default "raw" logprobs). With speculative decoding, the
verify call's logits [K, V] already hold that distribution at every position of the block: row j
decides the token after input j, so a round that accepted n drafts emits d1..dn, t from rows 0..n.
Nothing extra runs through the target, and the values are those of the target alone (the drafter
changes which positions are scored together, not the scores; at temperature 0 the ids are the same).

Built lazily with the round (`block_logprobs`) and read with its one host sync (`read_block`), so a
turn that asks for logprobs costs one log_softmax per round and a small transfer, never another sync.
"""

from __future__ import annotations

from typing import Protocol, cast

import mlx.core as mx

from core.events import TokenLogprob

MAX_TOP_LOGPROBS = 20  # as OpenAI and vLLM's default


def block_logprobs(logits: mx.array, tokens: mx.array, top: int, cap: float | None) -> tuple[mx.array, mx.array | None]:
    """logits [..., K, V] (soft-capped already when `cap` is None), tokens [..., K] the token each row
    emits (rows past the accepted ones are read by nobody) -> (chosen [..., K, 1 + top] float32: the
    token's logprob, then the `top` best logprobs unsorted; ids [..., K, top] int32 of those, or None)."""
    x = logits.astype(mx.float32)
    if cap:
        x = mx.tanh(x / cap) * cap
    lp = x - mx.logsumexp(x, axis=-1, keepdims=True)
    chosen = mx.take_along_axis(lp, tokens.astype(mx.int32)[..., None], axis=-1)
    if top <= 0:
        return chosen, None
    ids = mx.argpartition(-lp, kth=top - 1, axis=-1)[..., :top].astype(mx.int32)
    return mx.concatenate([chosen, mx.take_along_axis(lp, ids, axis=-1)], axis=-1), ids


def round_tokens(drafts: mx.array, n: mx.array, t: mx.array) -> mx.array:
    """The token each verify row emits, lazily: drafts [..., K-1], n [...] accepted, t [...] the target's
    own -> [..., K] (row j < n: draft j; row n: t; later rows: t, unread)."""
    K = drafts.shape[-1] + 1
    padded = mx.concatenate([drafts.astype(mx.int32), mx.zeros((*drafts.shape[:-1], 1), mx.int32)], axis=-1)
    inside = mx.arange(K) < n.astype(mx.int32)[..., None]
    return mx.where(inside, padded, t.astype(mx.int32)[..., None])


class Pieces(Protocol):
    """A token's bytes (core.decode.detok.Detokenizer): in the reply's text, and as shown for an alternative."""

    def piece_bytes(self, token_id: int) -> bytes: ...

    def display_bytes(self, token_id: int) -> bytes: ...


class BlockLogprobs:
    """One round's logprobs, read on the host once (after the round's sync) and handed out per row."""

    def __init__(self, built: tuple[mx.array, mx.array | None]) -> None:
        self.built = built
        self._host: tuple[list, list | None] | None = None

    def arrays(self) -> list[mx.array]:
        """What to evaluate with the round (mx.async_eval)."""
        return [a for a in self.built if a is not None]

    def row(self, j: int, token: int, pieces: Pieces | None) -> TokenLogprob:
        """Row j's TokenLogprob for the emitted `token` (a batch's row index taken off first by `part`)."""
        if self._host is None:
            arrays, top_ids = self.built
            self._host = (cast(list, arrays.tolist()), cast(list, top_ids.tolist()) if top_ids is not None else None)
        values, ids = self._host
        return read_row(values[j], ids[j] if ids is not None else [], token, pieces)

    def part(self, i: int) -> BlockLogprobs:
        """Batch row i of a [B, K, ...] round."""
        values, ids = self.built
        return BlockLogprobs((values[i], ids[i] if ids is not None else None))


def read_row(values: list[float], ids: list[int], token: int, pieces: Pieces | None) -> TokenLogprob:
    """A row's host values (the chosen logprob, then the top ones) as a TokenLogprob, most likely first."""
    text = pieces.piece_bytes if pieces is not None else (lambda i: b"")
    shown = pieces.display_bytes if pieces is not None else (lambda i: b"")
    top = sorted(zip(ids, values[1:]), key=lambda p: -p[1])
    return TokenLogprob(float(values[0]), text(token), tuple((int(i), shown(int(i)), float(v)) for i, v in top))
