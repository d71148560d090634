"""Batched speculative decoding: several independent replies decoded together, one round at a time.

Every row is one request with its own `TargetCache` (offsets, sliding window, rollback), settings,
stop rule, key stream and detokenizer. A round (block size K, the same for every row):

    drafts  = drafter over all rows (core.model.batched.draft_rows)       [B, K-1]   lazy
    logits  = target over all rows' [b, d1 .. d_{K-1}] in one call        [B, K, V]  lazy
    n, t    = per row: greedy prefix, or rejection sampling with its own keys
    one host sync for the whole batch; then per row: emit d1..dn, t; trim its cache to P + n + 1

Each row accepts its own prefix, so rows advance at different speeds. Rows join between rounds
(`join` prefills one, alone) and leave as soon as they stop (eos, max tokens, context, cancel):
`step` returns them finished and drops their caches. K = 1 (drafter off for any row, or a row with
one token of room) is a plain step for the whole batch through the same path.

The block size is the batch's: an `AutoBlock` controller (timed per batch round, fed the rows' mean
acceptance) when every row asks for auto, else the smallest fixed size the rows ask for. A row cannot
verify with fewer drafts than its neighbours: rows share one [B, K] verify shape.

Greedy rows produce exactly the ids they would alone (a row's attention runs on its own cache with
the single stream's shapes; only the projections see the other rows). A sampled row keeps the
target's distribution (per-row rejection sampling) and, with a seed, draws its keys as it would alone.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import mlx.core as mx

from core import sampling
from core.decode.autoblock import AutoBlock, AutoBlockConfig
from core.decode.logprobs import BlockLogprobs, block_logprobs, round_tokens
from core.decode.spec import Controls, Decoder, Prompt, TurnResult, draft_cost_hint, stop_rule
from core.events import PrefillDone, RoundEvent, TokenEvent, TokenLogprob, TurnStats
from core.model import memory
from core.model.batched import RowSampling, draft_rows, forward_rows
from core.model.target import Target, TargetCache
from core.settings import GenerationSettings

if TYPE_CHECKING:
    from core.decode.detok import Detokenizer
    from core.model.drafter import Drafter


@dataclass
class Row:
    """One request in the batch (see the module docstring)."""

    cache: TargetCache
    settings: GenerationSettings
    controls: Controls
    emit: Callable[[object], None]
    stats: TurnStats
    keys: sampling.KeyStream | None
    detok: Detokenizer | None
    b_tok: int = 0  # the last emitted token, not in the cache
    h: mx.array | None = None  # the target's post-norm hidden at the last cached position [H]
    emitted: list[int] = field(default_factory=list)
    committed: list[int] = field(default_factory=list)
    round_no: int = 0
    t0: float = 0.0
    t_first: float = 0.0
    reason: str | None = None  # why it stopped, once it has
    tag: Any = None  # the caller's handle for this request
    logprobs: BlockLogprobs | None = None  # this round's, when the row asks for them


class BatchDecoder:
    """Decodes up to any number of rows together for one target (+ optional drafter)."""

    def __init__(
        self,
        target: Target,
        drafter: Drafter | None,
        detokenizer: Callable[[], Detokenizer | None],
        stop_ids: Iterable[int] = frozenset(),
    ) -> None:
        self.target = target
        self.drafter = drafter
        self.make_detok = detokenizer
        self.stop_ids = frozenset(stop_ids)
        self.solo = Decoder(target, drafter, None, self.stop_ids)  # its prefill, pick and stop rule
        self.auto = AutoBlock(AutoBlockConfig(), draft_cost=draft_cost_hint(target, drafter))
        self.rows: list[Row] = []
        self._clock = time.perf_counter if memory.on_metal() else time.process_time
        self._last_sync = self._clock()
        self._timed: set[int] = set()
        self.rounds = 0

    # --- rows join and leave --------------------------------------------------------------------

    def join(
        self,
        prompt: Prompt,
        settings: GenerationSettings,
        emit: Callable[[object], None],
        controls: Controls,
        *,
        prompt_tokens: int | None = None,
        t_start: float | None = None,
        tag: Any = None,
    ) -> Row:
        """Prefill a new request into a fresh cache and add it to the batch (or finish it at once: a
        stop on its first token, a cancel while prefilling). The caller collects finished rows from
        `take_finished`."""
        cache = self.target.make_cache()
        stats = TurnStats(
            prompt_tokens=prompt_tokens if prompt_tokens is not None else len(prompt.ids),
            drafter_enabled=self.drafter is not None and controls.drafter_enabled,
        )
        keys = sampling.KeyStream(settings.seed) if settings.temperature > 0 else None
        row = Row(cache, settings, controls, emit, stats, keys, self.make_detok(), tag=tag)
        row.t0 = time.perf_counter()
        self.solo._check_prompt(cache, prompt)
        if row.detok is not None:
            row.detok.reset()
        done = self.solo._prefill(cache, prompt, settings, keys, controls, row.committed)
        if done is None:
            row.reason = "cancelled"
            self.rows.append(row)
            return row
        first, row.h = done
        row.b_tok = first[-1]
        stats.prefill_tokens = len(prompt.ids)
        stats.prefill_s = time.perf_counter() - row.t0
        emit(PrefillDone(stats.prompt_tokens, stats.prefill_tokens, 0, stats.prefill_s))
        row.t_first = time.perf_counter()
        stats.ttft_s = row.t_first - (row.t0 if t_start is None else t_start)
        if not self.rows:
            self.auto.begin_turn(sampled=keys is not None)
        _, row.reason = self._stop_rule(row, first)
        lp, self.solo.first_logprobs = self.solo.first_logprobs, None
        for tok in first:  # more than one: a forced start (Prompt.forced), which scores no logprobs
            self._emit_token(row, tok, False, lp.row(0, tok, row.detok) if lp is not None and len(first) == 1 else None)
        self.rows.append(row)
        return row

    def take_finished(self) -> list[tuple[Row, TurnResult]]:
        """Remove the rows that stopped (or were cancelled) and return them with their results."""
        out = []
        for row in list(self.rows):
            if row.reason is None and row.controls.cancelled:
                row.reason = "cancelled"
            if row.reason is not None:
                self.rows.remove(row)
                out.append((row, self._result(row)))
        return out

    # --- one round ----------------------------------------------------------------------------

    def step(self) -> None:
        """One round for every running row (nothing when no row runs); stopped rows wait in `take_finished`."""
        rows = [r for r in self.rows if r.reason is None and not r.controls.cancelled]
        for r in rows:
            if self._room(r) < 1:
                r.reason = "max_tokens" if len(r.emitted) >= r.settings.max_tokens else "context_full"
        rows = [r for r in rows if r.reason is None]
        if not rows:
            return
        sizes, auto = self._plan(rows)
        K = max(sizes)
        n_acc, decided = self._read(self._submit(rows, sizes, K))
        scored = any(r.logprobs is not None for r in rows)  # scoring the vocabulary is not the block's cost
        self._observe(K, [n for n, k, a in zip(n_acc, sizes, auto) if a], any(auto), clean=not scored)
        for row, k, n, tokens in zip(rows, sizes, n_acc, decided):
            self._advance(row, K, k, n, tokens)
        self.rounds += 1
        if self.rounds % memory.CLEAR_CACHE_EVERY == 0:
            mx.clear_cache()

    def _room(self, row: Row) -> int:
        return min(row.settings.max_tokens - len(row.emitted), self.target.context_length - row.cache.offset)

    def _plan(self, rows: list[Row]) -> tuple[list[int], list[bool]]:
        """Per row its block size (what it asks for, or the controller's choice for auto; never past its
        room, so a row verifies as it would alone) and whether the controller chose it. The round
        verifies the largest; a row with a smaller one ignores the drafts past its own."""
        choice: int | None = None
        sizes, auto = [], []
        for r in rows:
            if self.drafter is None or not r.controls.drafter_enabled:
                k, a = 1, False
            elif r.controls.block_size == "auto":
                choice = choice or self.auto.decide().block_size
                k, a = choice, True
            else:
                k, a = int(r.controls.block_size), False
            # every row appends the round's K positions: the largest must fit each row's context
            sizes.append(max(1, min(k, self._room(r))))
            auto.append(a)
        fits = min(self.target.context_length - r.cache.offset for r in rows)
        return [min(k, fits) for k in sizes], auto

    def _submit(self, rows: list[Row], sizes: list[int], K: int) -> tuple[list[Row], int, mx.array, mx.array]:
        """Build the round for `rows` (row i keeps at most sizes[i] - 1 drafts) and hand it to the device:
        (rows, K, packed [B, 1 + K] uint32 with n accepted, the target's token and the drafts per row,
        hidden [B, K, H])."""
        tg = self.target
        caches = [r.cache for r in rows]
        B = len(rows)
        b = mx.array([r.b_tok for r in rows], dtype=mx.uint32)
        softcap = any(r.keys is not None for r in rows)
        if K == 1:
            logits, H = forward_rows(tg, b.reshape(B, 1), caches, softcap=softcap)
            picks = [self.solo._pick(logits[i, 0], r.settings, r.keys) for i, r in enumerate(rows)]
            t = mx.stack(picks).astype(mx.uint32).reshape(B, 1)
            packed = mx.concatenate([mx.zeros((B, 1), mx.uint32), t], axis=1)
            mx.async_eval(packed, H, *self._logprobs(rows, logits, t, softcap))
            return rows, K, packed, H
        assert self.drafter is not None, "a speculative round needs a drafter"
        sampled = [_draft_sampling(r, k, K) for r, k in zip(rows, sizes)]
        h = mx.stack([cast(mx.array, r.h) for r in rows])
        drafts, q_lps = draft_rows(self.drafter, tg, caches, b, h, K - 1, sampled)
        mx.async_eval(drafts)
        logits, H = forward_rows(tg, mx.concatenate([b.reshape(B, 1), drafts], axis=1), caches, softcap=softcap)
        caps = mx.array([k - 1 for k in sizes], dtype=mx.int32)
        n, t = verify_greedy_capped(drafts, logits, caps)
        if softcap:  # sampled rows verify alone, each with its own key (as it would alone)
            ns, ts = [], []
            for i, (r, k) in enumerate(zip(rows, sizes)):
                if r.keys is None:
                    ns.append(n[i])
                    ts.append(t[i])
                elif k == 1:  # a plain step inside a drafting round: its token as the plain step draws it
                    ns.append(mx.array(0, mx.int32))
                    ts.append(self.solo._pick(logits[i, 0], r.settings, r.keys))
                else:
                    s = r.settings
                    p_lp = sampling.transform_logits_compiled(logits[i, :k], s.temperature, s.top_k, s.top_p)
                    q_lp = _first_rows(q_lps[i], k - 1)
                    ni, ti = sampling.verify_speculative(drafts[i, : k - 1], q_lp, p_lp, r.keys.next())
                    ns.append(ni)
                    ts.append(ti)
            n, t = mx.stack(ns), mx.stack(ts)
        packed = mx.concatenate([n.reshape(B, 1).astype(mx.uint32), t.reshape(B, 1).astype(mx.uint32), drafts], axis=1)
        lp = self._logprobs(rows, logits, round_tokens(drafts, n.reshape(B), t.reshape(B)), softcap)
        mx.async_eval(packed, H, *lp)
        return rows, K, packed, H

    def _logprobs(self, rows: list[Row], logits: mx.array, tokens: mx.array, capped: bool) -> list[mx.array]:
        """Each asking row's logprobs of its tokens [B, K] under logits [B, K, V] (core.decode.logprobs),
        kept on the row for `_advance`; the arrays to evaluate with the round."""
        tops = [r.settings.logprobs for r in rows]
        for r in rows:
            r.logprobs = None
        if all(t is None for t in tops):
            return []
        cap = None if capped else getattr(self.target, "softcap", None)
        lp = BlockLogprobs(block_logprobs(logits, tokens, max(t or 0 for t in tops), cap))
        for i, r in enumerate(rows):
            r.logprobs = lp.part(i) if tops[i] is not None else None
        return lp.arrays()

    def _read(self, submitted: tuple[list[Row], int, mx.array, mx.array]) -> tuple[list[int], list[list[int]]]:
        """The round's one host sync: per row (accepted drafts n, the tokens it decided: d1..dn, t);
        each row's hidden rows are kept for `_advance`."""
        rows, K, packed, H = submitted
        values = cast(list[list[int]], packed.tolist())
        n_acc, decided = [], []
        for i, (row, v) in enumerate(zip(rows, values)):
            n = v[0]
            n_acc.append(n)
            decided.append(v[2 : 2 + n] + [v[1]])
            row.h = H[i]  # [K, H] for now; _advance keeps the row it needs
        return n_acc, decided

    def _observe(self, K: int, n_acc: list[int], auto: bool, clean: bool = True) -> None:
        """Feed the controller the round's time (sync to sync) and its auto rows' mean acceptance."""
        now = self._clock()
        round_s, self._last_sync = now - self._last_sync, now
        if not auto:
            return
        clean = clean and K in self._timed  # a size's first round also built its kernels
        self._timed.add(K)
        mean = round(sum(n_acc) / len(n_acc)) if n_acc else 0
        self.auto.observe(K, min(mean, K - 1), round_s=round_s, clean=clean)

    def _advance(self, row: Row, K: int, k: int, n: int, tokens: list[int]) -> None:
        """Emit what the row decided (at its block size k), up to its stop; trim its cache to what it
        keeps (the round appended K positions); carry b and h."""
        out, stop = self._stop_rule(row, tokens)
        P = row.cache.offset - K
        row.cache.trim_to(P + out)
        H = cast(mx.array, row.h)
        row.h = H[out - 1]
        row.committed.append(row.b_tok)
        row.committed.extend(tokens[: out - 1])
        row.b_tok = tokens[out - 1]
        row.round_no += 1
        lp = row.logprobs
        for j, tok in enumerate(tokens[:out]):
            self._emit_token(row, tok, j < n, lp.row(j, tok, row.detok) if lp is not None else None)
        ev = RoundEvent(row.round_no, k - 1, min(n, out), k, row.controls.block_size == "auto", out)
        row.stats.add_round(ev)
        row.emit(ev)
        row.reason = stop

    def _stop_rule(self, row: Row, tokens: list[int]) -> tuple[int, str | None]:
        return stop_rule(tokens, self.stop_ids, row.settings, len(row.emitted))

    def _emit_token(self, row: Row, tok: int, from_draft: bool, logprob: TokenLogprob | None = None) -> None:
        row.emitted.append(tok)
        text = row.detok.add(tok) if row.detok is not None else ""
        if logprob is not None:  # the batch scored the most alternatives any row asked for
            logprob = dataclasses.replace(logprob, top=logprob.top[: row.settings.logprobs or 0])
        row.emit(TokenEvent(tok, text, from_draft, row.round_no, logprob))

    def _result(self, row: Row) -> TurnResult:
        stats = row.stats
        now = time.perf_counter()
        if row.t_first:
            stats.decode_s = now - row.t_first
        else:
            stats.prefill_s = now - row.t0
        stats.stop_reason = row.reason or "cancelled"
        stats.tokens = len(row.emitted)
        stats.peak_memory_bytes = int(mx.get_peak_memory())
        text = ""
        if row.detok is not None:
            row.detok.flush()
            text = row.detok.text
        row.h = None
        return TurnResult(stats, list(row.emitted), row.committed, text)


_SPARE_KEY: list[mx.array] = []


def _draft_sampling(row: Row, k: int, K: int) -> RowSampling | None:
    """A sampled row's draft keys: its own k - 1 (as it would draw them alone), then spares for the
    drafts past its block size, which it ignores. None for a greedy row."""
    if row.keys is None:
        return None
    if not _SPARE_KEY:
        _SPARE_KEY.append(mx.random.key(0))
    keys = row.keys.split(k - 1) if k > 1 else []
    s = row.settings
    return RowSampling(s.temperature, s.top_k, s.top_p, keys + _SPARE_KEY * (K - k))


def _first_rows(lp: mx.array | sampling.SparseLogProbs | None, n: int) -> mx.array | sampling.SparseLogProbs:
    assert lp is not None, "a sampled draft comes with its distribution"
    if isinstance(lp, sampling.SparseLogProbs):
        return sampling.SparseLogProbs(lp.ids[:n], lp.logprobs[:n])
    return lp[:n]


def verify_greedy_capped(drafts: mx.array, logits: mx.array, caps: mx.array) -> tuple[mx.array, mx.array]:
    """`sampling.verify_greedy` for B rows where row b looks at its first caps[b] drafts only:
    drafts [B, K-1], logits [B, K, V], caps [B] -> (n accepted [B] <= caps, the target's token [B])."""
    target = mx.argmax(logits, axis=-1)  # [B, K]
    K1 = drafts.shape[1]
    inside = mx.arange(K1)[None, :] < caps[:, None]
    accept = (drafts == target[:, :-1].astype(drafts.dtype)) & inside
    n = mx.cumprod(accept.astype(mx.int32), axis=-1).sum(axis=-1).astype(mx.int32)
    return n, mx.take_along_axis(target, n[:, None], axis=-1)[:, 0]
