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

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import mlx.core as mx

from core import sampling
from core.decode.autoblock import AutoBlock, AutoBlockConfig
from core.decode.spec import Controls, Decoder, Prompt, TurnResult, draft_cost_hint
from core.events import PrefillDone, RoundEvent, TokenEvent, TurnStats
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
        row.b_tok, row.h = done
        stats.prefill_tokens = len(prompt.ids)
        stats.prefill_s = time.perf_counter() - row.t0
        emit(PrefillDone(stats.prompt_tokens, stats.prefill_tokens, 0, stats.prefill_s))
        row.t_first = time.perf_counter()
        stats.ttft_s = row.t_first - (row.t0 if t_start is None else t_start)
        if not self.rows:
            self.auto.begin_turn(sampled=keys is not None)
        _, row.reason = self._stop_rule(row, [row.b_tok])
        self._emit_token(row, row.b_tok, False)
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
        if not rows:
            return
        room = min(self._room(r) for r in rows)
        if room < 1:
            for r in rows:
                if self._room(r) < 1:
                    r.reason = "max_tokens" if len(r.emitted) >= r.settings.max_tokens else "context_full"
            return
        K, auto = self._plan(rows, room)
        n_acc, decided = self._read(self._submit(rows, K))
        self._observe(K, n_acc, auto)
        for row, n, tokens in zip(rows, n_acc, decided):
            self._advance(row, K, n, tokens)
        self.rounds += 1
        if self.rounds % memory.CLEAR_CACHE_EVERY == 0:
            mx.clear_cache()

    def _room(self, row: Row) -> int:
        return min(row.settings.max_tokens - len(row.emitted), self.target.context_length - row.cache.offset)

    def _plan(self, rows: list[Row], room: int) -> tuple[int, bool]:
        """(K, whether the controller chose it): the rows' smallest fixed size, or auto when all ask for it."""
        wants: list[int] = []
        for r in rows:
            if self.drafter is None or not r.controls.drafter_enabled:
                return 1, False
            if r.controls.block_size != "auto":
                wants.append(int(r.controls.block_size))
        if wants:
            return max(1, min(min(wants), room)), False
        return max(1, min(self.auto.decide().block_size, room)), True

    def _submit(self, rows: list[Row], K: int) -> tuple[list[Row], int, mx.array, mx.array]:
        """Build the round for `rows` and hand it to the device: (rows, K, packed [B, 1 + K] uint32 with
        n accepted, the target's token and the drafts per row, hidden [B, K, H])."""
        tg = self.target
        caches = [r.cache for r in rows]
        b = mx.array([r.b_tok for r in rows], dtype=mx.uint32)
        softcap = any(r.keys is not None for r in rows)
        B = len(rows)
        if K == 1:
            logits, H = forward_rows(tg, b.reshape(B, 1), caches, softcap=softcap)
            picks = [self.solo._pick(logits[i, 0], r.settings, r.keys) for i, r in enumerate(rows)]
            t = mx.stack(picks).astype(mx.uint32).reshape(B, 1)
            packed = mx.concatenate([mx.zeros((B, 1), mx.uint32), t], axis=1)
            mx.async_eval(packed, H)
            return rows, K, packed, H
        assert self.drafter is not None, "a speculative round needs a drafter"
        sampled = [
            RowSampling(r.settings.temperature, r.settings.top_k, r.settings.top_p, r.keys.split(K - 1))
            if r.keys is not None
            else None
            for r in rows
        ]
        h = mx.stack([cast(mx.array, r.h) for r in rows])
        drafts, q_lps = draft_rows(self.drafter, tg, caches, b, h, K - 1, sampled)
        mx.async_eval(drafts)
        logits, H = forward_rows(tg, mx.concatenate([b.reshape(B, 1), drafts], axis=1), caches, softcap=softcap)
        n, t = sampling.verify_greedy(drafts, logits)
        if softcap:  # sampled rows verify alone, each with its own key (as it would alone)
            ns, ts = [], []
            for i, r in enumerate(rows):
                if r.keys is None:
                    ns.append(n[i])
                    ts.append(t[i])
                    continue
                s = r.settings
                p_lp = sampling.transform_logits_compiled(logits[i], s.temperature, s.top_k, s.top_p)
                q_lp = q_lps[i]
                assert q_lp is not None, "a sampled draft comes with its distribution"
                ni, ti = sampling.verify_speculative(drafts[i], q_lp, p_lp, r.keys.next())
                ns.append(ni)
                ts.append(ti)
            n, t = mx.stack(ns), mx.stack(ts)
        packed = mx.concatenate([n.reshape(B, 1).astype(mx.uint32), t.reshape(B, 1).astype(mx.uint32), drafts], axis=1)
        mx.async_eval(packed, H)
        return rows, K, packed, H

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

    def _observe(self, K: int, n_acc: list[int], auto: bool) -> None:
        now = self._clock()
        round_s, self._last_sync = now - self._last_sync, now
        if not auto and K == 1:
            return
        clean = K in self._timed  # a size's first round also built its kernels
        self._timed.add(K)
        mean = round(sum(n_acc) / len(n_acc)) if n_acc else 0
        self.auto.observe(K, min(mean, K - 1), round_s=round_s, clean=clean)

    def _advance(self, row: Row, K: int, n: int, tokens: list[int]) -> None:
        """Emit what the row decided, up to its stop; trim its cache to what it keeps; carry b and h."""
        out, stop = self._stop_rule(row, tokens)
        P = row.cache.offset - K
        row.cache.trim_to(P + out)
        H = cast(mx.array, row.h)
        row.h = H[out - 1]
        row.committed.append(row.b_tok)
        row.committed.extend(tokens[: out - 1])
        row.b_tok = tokens[out - 1]
        row.round_no += 1
        for j, tok in enumerate(tokens[:out]):
            self._emit_token(row, tok, j < n)
        ev = RoundEvent(row.round_no, K - 1, min(n, out), K, False, out)
        row.stats.add_round(ev)
        row.emit(ev)
        row.reason = stop

    def _stop_rule(self, row: Row, tokens: list[int]) -> tuple[int, str | None]:
        s = row.settings
        for j, tok in enumerate(tokens):
            if tok in self.stop_ids and not s.ignore_eos:
                return j + 1, "eos"
            if len(row.emitted) + j + 1 >= s.max_tokens:
                return j + 1, "max_tokens"
        return len(tokens), None

    def _emit_token(self, row: Row, tok: int, from_draft: bool) -> None:
        row.emitted.append(tok)
        text = row.detok.add(tok) if row.detok is not None else ""
        row.emit(TokenEvent(tok, text, from_draft, row.round_no))

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
