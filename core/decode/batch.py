"""Batched speculative decoding: several independent replies decoded together, one round at a time.

Every row is one request with its own `TargetCache` (offsets, sliding window, rollback), settings,
stop rule, key stream and detokenizer. While a row decodes, its K/V sits in the batch's shared
buffers (core.model.rows_kv: its cache keeps the bookkeeping and gets the buffers back when the row
leaves). A round (block size K, the largest any row has; each row keeps at most its own):

    drafts  = drafter over all rows (core.model.batched.draft_rows)       [B, K-1]   lazy
    logits  = target over all rows' [b, d1 .. d_{K-1}] in one call        [B, K, V]  lazy
    n, t    = per row: greedy prefix, or rejection sampling with its own keys
    one host sync for the whole batch; then per row: emit d1..dn, t; trim its cache to P + n + 1

Each row accepts its own prefix, so rows advance at different speeds. Rows join between rounds and
leave as soon as they stop (eos, max tokens, context, cancel): `take_finished` returns them. K = 1
(drafter off for any row, or a row with one token of room) is a plain step for the whole batch
through the same path.

A joining row's prompt is prefilled in chunks between rounds (`step`: first some prefill, then one
round for the rows that decode), so the running streams do not stall for a whole long prompt. While
rows decode, a step prefills, in join order, the larger of
- about PREFILL_SHARE of a measured round's time (tokens = round seconds x measured prefill tokens/s,
  PREFILL_MIN_CHUNK..PREFILL_CHUNK), and
- the joining prompt's rest, where that takes at most JOIN_ONE_STEP_S at the measured prefill rate (a
  pause a reader does not notice: the newcomer then waits for no round of the others at all), else
  1/JOIN_STEPS of the joining prompt (so its first token comes within its prefill + JOIN_STEPS - 1
  rounds), but never more than JOIN_MAX_STALL_S of prefill at the measured rate. Several prompts
  waiting at the head of the queue whose rests together take at most JOIN_ONE_STEP_S all run in one
  step: requests that arrive together (a client fanning out) decode together from the next round,
  not one more per round while the others wait.
The second keeps the newcomer's wait short and stalls the running streams for only one or JOIN_STEPS
gaps (a stream's p95 gap does not see them); the stall cap keeps a very long prompt from freezing
them: it then takes more steps. With no row decoding, prompts prefill at full speed (chunks of
PREFILL_CHUNK, as alone). A row whose prefill ends joins that step's round.

Prefix reuse (core.decode.prefix_cache): a finished text row's cache goes into a small LRU; a new text
request that shares a prefix with one of them starts from a copy trimmed to that prefix (only where
the sliding-window state for it is exact) and prefills only the rest; its stats say how many prompt
tokens were reused.

Block sizes (`_plan`): a row that asks for a fixed size keeps at most that many drafts; the auto rows share
one `AutoBlock` controller, timed per batch round and fed each auto row's accepted drafts (so it weighs the
batch's tokens per round against the batch's round time); the round verifies the largest size any row has,
and a row with a smaller one ignores the drafts past its own (`verify_greedy_capped`). The auto rows are not
given sizes of their own: the drafter step and the verify run for every row at once ([B, K - 1] drafts,
[B, K] verified), so a row that kept fewer drafts would save no work, and the ones it does not keep cost
nothing the batch does not pay anyway.

Greedy rows produce exactly the ids they would alone (a row's attention sees exactly its own keys,
the other rows' masked out; only the projections see the other rows). A sampled row keeps the
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
from core.decode.prefix_cache import PrefixCache
from core.decode.spec import (
    PREFILL_CHUNK,
    Controls,
    Decoder,
    Prompt,
    TurnResult,
    draft_cost_hint,
    prefill_chunks,
    stop_rule,
)
from core.events import PrefillDone, RoundEvent, TokenEvent, TokenLogprob, TurnStats
from core.model import memory
from core.model.batched import RowSampling, draft_rows, forward_rows
from core.model.rows_kv import RowsKV
from core.model.target import Target, TargetCache
from core.settings import GenerationSettings

if TYPE_CHECKING:
    from core.decode.detok import Detokenizer
    from core.model.drafter import Drafter

PREFILL_SHARE = 0.5  # while rows decode: prefill per step, as a fraction of one round's time
PREFILL_MIN_CHUNK = 16  # tokens: never less per step, so a long prompt still gets through
JOIN_ONE_STEP_S = 0.2  # while rows decode, a joining prompt this quick to prefill runs in one step
JOIN_STEPS = 2  # ... a longer one in this many steps (unless capped below)
JOIN_MAX_STALL_S = 1.0  # ... where a step's prefill takes no longer than this at the measured rate
_EMA = 0.3  # weight of the newest measurement of a round's time and of the prefill rate


@dataclass
class PrefillJob:
    """A joining row's prompt, prefilled a chunk at a time between rounds."""

    prompt: Prompt
    done: int = 0  # prompt tokens run so far (of prompt.ids)
    seconds: float = 0.0  # time spent in its chunks

    @property
    def rest(self) -> int:
        """Prompt tokens still to run."""
        return len(self.prompt.ids) - self.done

    def per_step(self, tokens_per_s: float | None) -> int:
        """Tokens per step while rows decode: the rest of the prompt where it takes at most JOIN_ONE_STEP_S at
        `tokens_per_s` (the measured prefill rate), else enough to prefill the whole prompt in JOIN_STEPS steps."""
        if tokens_per_s is not None and self.rest <= JOIN_ONE_STEP_S * tokens_per_s:
            return self.rest
        return -(-len(self.prompt.ids) // JOIN_STEPS)


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
    first: list[int] = field(default_factory=list)  # its prefill's first tokens (several: a forced start)
    prefill: PrefillJob | None = None  # its prompt while it is still being prefilled
    prefix: list[int] = field(default_factory=list)  # reused ids already in its cache at join
    storable: bool = True  # text only: its cache may serve later requests (core.decode.prefix_cache)
    error: str | None = None  # a failure of its own prefill (the others go on)
    t_start: float = 0.0  # when its request arrived (for the time to first token)

    @property
    def decoding(self) -> bool:
        """Prefilled, not stopped, not cancelled: it takes part in the next round."""
        return self.prefill is None and self.reason is None and not self.controls.cancelled


class BatchDecoder:
    """Decodes up to any number of rows together for one target (+ optional drafter)."""

    def __init__(
        self,
        target: Target,
        drafter: Drafter | None,
        detokenizer: Callable[[], Detokenizer | None],
        stop_ids: Iterable[int] = frozenset(),
        prefix_cache: PrefixCache | None = None,
        prefill_tokens: int | None = None,
    ) -> None:
        """prefix_cache: where finished rows' caches go (None: a fresh default one); prefill_tokens: a
        fixed prefill budget per step while rows decode, instead of the measured one (tests, benches)."""
        self.target = target
        self.drafter = drafter
        self.make_detok = detokenizer
        self.stop_ids = frozenset(stop_ids)
        self.solo = Decoder(target, drafter, None, self.stop_ids)  # its prefill, pick and stop rule
        self.auto = AutoBlock(AutoBlockConfig(), draft_cost=draft_cost_hint(target, drafter))
        self.prefix = PrefixCache() if prefix_cache is None else prefix_cache
        self.rows: list[Row] = []
        self.kv = RowsKV(target)  # the decoding rows' K/V (their caches hold it again when they leave)
        self._clock = time.perf_counter if memory.on_metal() else time.process_time
        self._last_sync = self._clock()
        self._timed: set[int] = set()
        self.rounds = 0
        self.round_s: float | None = None  # wall time of a round (EMA): the prefill budget's unit
        self.prefill_tps: float | None = None  # prefill tokens per second (EMA)
        self.prefill_tokens = prefill_tokens

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
        """Add a new request to the batch. Its prompt is prefilled by the following `step`s (in chunks
        while other rows decode), from a cached prefix where one fits; a refused prompt raises
        `TurnError` before anything changes. The caller collects finished rows from `take_finished`."""
        cache, rest, reused = self._cache_for(prompt)
        stats = TurnStats(
            prompt_tokens=prompt_tokens if prompt_tokens is not None else len(prompt.ids),
            reused_tokens=reused,
            drafter_enabled=self.drafter is not None and controls.drafter_enabled,
        )
        keys = sampling.KeyStream(settings.seed) if settings.temperature > 0 else None
        row = Row(cache, settings, controls, emit, stats, keys, self.make_detok(), tag=tag)
        row.t0 = time.perf_counter()
        row.t_start = row.t0 if t_start is None else t_start
        self.solo._check_prompt(cache, rest)
        row.prefix = list(prompt.ids[:reused])
        row.storable = prompt.embeddings is None and not prompt.bidirectional
        if row.detok is not None:
            row.detok.reset()
        row.prefill = PrefillJob(rest)
        self.rows.append(row)
        return row

    def _cache_for(self, prompt: Prompt) -> tuple[TargetCache, Prompt, int]:
        """A cache for a new row and the part of its prompt to prefill into it: a copy of a cached
        prefix for a text prompt that continues an earlier one, else a fresh cache and all of it."""
        if prompt.start == 0 and prompt.embeddings is None and not prompt.bidirectional:
            got = self.prefix.take(prompt.ids)
            if got is not None:
                cache, keep = got
                return cache, dataclasses.replace(prompt, ids=prompt.ids[keep:], start=keep), keep
        return self.target.make_cache(), prompt, 0

    def take_finished(self) -> list[tuple[Row, TurnResult]]:
        """Remove the rows that stopped (or were cancelled) and return them with their results; a text
        row's cache goes to the prefix cache (it holds exactly its prompt and its committed tokens). When
        the last row leaves, MLX's buffer cache is emptied."""
        out = []
        for row in list(self.rows):
            if row.reason is None and row.controls.cancelled:
                row.reason = "cancelled"
            if row.reason is not None:
                self.rows.remove(row)
                keep = row.storable and row.error is None
                self.kv.release(row.cache, keep=keep)
                if keep:
                    self.prefix.put(row.prefix + row.committed, row.cache)
                out.append((row, self._result(row)))
        if out and not self.rows:  # the batch drained: the buffers MLX keeps for reuse go back (RSS to idle)
            mx.clear_cache()
        return out

    # --- prefill between rounds -----------------------------------------------------------------

    def _prefill_budget(self, decoding: bool) -> int | None:
        """Prompt tokens this step may prefill: None (no limit) when no row decodes, else about
        PREFILL_SHARE of a round's time at the measured prefill rate (see the module docstring)."""
        if not decoding:
            return None
        if self.prefill_tokens is not None:
            return self.prefill_tokens
        if self.round_s is None or self.prefill_tps is None:
            share = 4 * PREFILL_MIN_CHUNK
        else:
            share = int(self.round_s * self.prefill_tps * PREFILL_SHARE)
            share -= share % PREFILL_MIN_CHUNK  # few distinct chunk shapes
            share = max(PREFILL_MIN_CHUNK, min(PREFILL_CHUNK, share))
        joining = [r.prefill for r in self.rows if r.prefill is not None and r.reason is None]
        newcomer = max((job.per_step(self.prefill_tps) for job in joining), default=0)
        if self.prefill_tps is not None:
            # the quick prompts at the head of the queue, together: requests that arrive at once all join
            # the next round, one pause for the running streams instead of one per newcomer
            quick, one_step = 0, JOIN_ONE_STEP_S * self.prefill_tps
            for job in joining:
                if quick + job.rest > one_step:
                    break
                quick += job.rest
            newcomer = min(max(newcomer, quick), int(JOIN_MAX_STALL_S * self.prefill_tps))
        return max(share, newcomer)

    def _prefill_some(self, budget: int | None) -> bool:
        """Prefill the joining rows in join order within `budget` tokens; whether any ran. A row whose
        own prefill fails ends with its error; the other rows go on."""
        spent, ran = 0, False
        for row in self.rows:
            if row.prefill is None or row.reason is not None:
                continue
            if row.controls.cancelled:
                row.reason = "cancelled"
                continue
            left = None if budget is None else budget - spent
            if left is not None and left <= 0:
                break
            try:
                n = self._prefill_row(row, left)
            except Exception as e:
                row.prefill, row.reason, row.error = None, "error", f"{type(e).__name__}: {e}"
                continue
            spent += n
            ran = ran or n > 0
        return ran

    def _prefill_row(self, row: Row, limit: int | None) -> int:
        """Run the row's next chunks, up to `limit` tokens (None: all of them); the tokens run. Chunks never
        cut an image; the prompt's last token runs as its own step (as `Decoder._prefill`), unless it
        lies inside an image; a chunk larger than the limit (an image) runs only as a step's first."""
        job = row.prefill
        assert job is not None
        p = job.prompt
        n = len(p.ids)
        rel = [(a - p.start, b - p.start) for a, b in p.bidirectional]
        body = n - 1 if n > 1 and not any(s <= n - 1 < e for s, e in rel) else n
        spent = 0
        while row.prefill is not None:
            a = job.done
            room = PREFILL_CHUNK if limit is None else min(PREFILL_CHUNK, limit - spent)
            if room <= 0:
                break
            if a < body:
                b = a + prefill_chunks(body - a, [(s - a, e - a) for s, e in rel if e > a], room)[0][1]
                if limit is not None and spent and b - a > limit - spent:
                    break
            else:
                b = n
            self._prefill_chunk(row, a, b, rel)
            spent += b - a
        return spent

    def _prefill_chunk(self, row: Row, a: int, b: int, rel: list[tuple[int, int]]) -> None:
        """Prompt positions [a, b) (of the part to prefill) into the row's cache; the last chunk picks the
        row's first token and hands it to `_prefilled`."""
        job = row.prefill
        assert job is not None
        p, t0 = job.prompt, time.perf_counter()
        last = b == len(p.ids)
        emb = mask = None
        if p.embeddings is not None and p.embedding_mask is not None:
            emb, mask = p.embeddings[a:b], p.embedding_mask[a:b]
        spans = [(s + p.start, e + p.start) for s, e in rel if s < b and e > a]
        logits, hidden = self.target.forward(
            p.ids[a:b],
            row.cache,
            embeddings=emb,
            embedding_mask=mask,
            bidirectional=spans or None,
            logits="last" if last else None,
            softcap=row.settings.temperature > 0,
        )
        row.committed.extend(p.ids[a:b])
        job.done = b
        if last:
            assert logits is not None  # asked for
            self._first_tokens(row, logits[0], hidden[-1])
        else:
            mx.eval(row.cache.state())  # bound the graph (and memory) per chunk
        row.controls.prefilled = b
        dt = time.perf_counter() - t0
        job.seconds += dt
        if b - a >= PREFILL_MIN_CHUNK and dt > 0:
            self.prefill_tps = _ema(self.prefill_tps, (b - a) / dt)
        if last:
            self._prefilled(row)

    def _first_tokens(self, row: Row, logits: mx.array, h: mx.array) -> None:
        """The row's first tokens from its prompt's last logits [V] and hidden [H]: one pick (with its
        logprobs when asked), or a forced start's walk (core.decode.forced), which scores none."""
        p, solo = cast(PrefillJob, row.prefill).prompt, self.solo
        if p.forced is not None:
            row.first, row.h = solo._walk(row.cache, p.forced, logits, h, row.settings, row.keys, row.committed)
        else:
            first = solo._pick(logits, row.settings, row.keys)
            row.logprobs = solo.logprobs_of(logits[None], first.reshape(1), row.settings)
            row.h = h
            mx.eval(first, h, *(row.logprobs.arrays() if row.logprobs is not None else []))
            row.first = [cast(int, first.item())]
        row.b_tok = row.first[-1]

    def _prefilled(self, row: Row) -> None:
        """The row's prompt is in: report the prefill, emit its first token (it decodes from the next round)."""
        job, stats = row.prefill, row.stats
        assert job is not None
        row.prefill = None
        stats.prefill_tokens = len(job.prompt.ids)
        stats.prefill_s = job.seconds
        row.emit(PrefillDone(stats.prompt_tokens, stats.prefill_tokens, stats.reused_tokens, stats.prefill_s))
        row.t_first = time.perf_counter()
        stats.ttft_s = row.t_first - row.t_start
        if not any(r.decoding for r in self.rows if r is not row):
            self.auto.begin_turn(sampled=row.keys is not None)
        _, row.reason = self._stop_rule(row, row.first)
        lp, row.logprobs = row.logprobs if len(row.first) == 1 else None, None
        for tok in row.first:  # more than one: a forced start (Prompt.forced)
            self._emit_token(row, tok, False, lp.row(0, tok, row.detok) if lp is not None else None)

    # --- one round ----------------------------------------------------------------------------

    def step(self) -> None:
        """Some prefill of joining rows (see the module docstring), then one round for every decoding row
        (nothing when none decodes); stopped rows wait in `take_finished`."""
        prefilled = False
        if any(r.prefill is not None for r in self.rows):
            prefilled = self._prefill_some(self._prefill_budget(any(r.decoding for r in self.rows)))
        rows = [r for r in self.rows if r.decoding]
        for r in rows:
            if self._room(r) < 1:
                r.reason = "max_tokens" if len(r.emitted) >= r.settings.max_tokens else "context_full"
        rows = [r for r in rows if r.reason is None]
        if not rows:
            return
        self.kv.seat([r.cache for r in rows])
        rows.sort(key=lambda r: cast(int, self.kv.index(r.cache)))  # the rows in their seats' order
        if prefilled:  # the round is timed from here: the prefill's time is not its own
            self._last_sync = self._clock()
        sizes, auto = self._plan(rows)
        K = max(sizes)
        t0 = time.perf_counter()
        n_acc, decided = self._read(self._submit(rows, sizes, K))
        self.round_s = _ema(self.round_s, time.perf_counter() - t0)
        scored = any(r.logprobs is not None for r in rows)  # scoring the vocabulary is not the block's cost
        # auto rows that verified the whole block (a row near its end verifies fewer: its count is capped)
        kept = [n for n, k, a in zip(n_acc, sizes, auto) if a and k == K]
        self._observe(K, kept, any(auto), clean=not (prefilled or scored))
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
        B = len(rows)
        b = mx.array([r.b_tok for r in rows], dtype=mx.uint32)
        softcap = any(r.keys is not None for r in rows)
        if K == 1:
            logits, H = forward_rows(tg, b.reshape(B, 1), self.kv, softcap=softcap)
            picks = [self.solo._pick(logits[i, 0], r.settings, r.keys) for i, r in enumerate(rows)]
            t = mx.stack(picks).astype(mx.uint32).reshape(B, 1)
            packed = mx.concatenate([mx.zeros((B, 1), mx.uint32), t], axis=1)
            mx.async_eval(packed, H, *self._logprobs(rows, logits, t, softcap))
            return rows, K, packed, H
        assert self.drafter is not None, "a speculative round needs a drafter"
        sampled = [_draft_sampling(r, k, K) for r, k in zip(rows, sizes)]
        h = mx.stack([cast(mx.array, r.h) for r in rows])
        drafts, q_lps = draft_rows(self.drafter, tg, self.kv, b, h, K - 1, sampled)
        mx.async_eval(drafts)
        logits, H = forward_rows(tg, mx.concatenate([b.reshape(B, 1), drafts], axis=1), self.kv, softcap=softcap)
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
        """Feed the controller the round's time (sync to sync) and its auto rows' accepted drafts."""
        now = self._clock()
        round_s, self._last_sync = now - self._last_sync, now
        if not auto:
            return
        clean = clean and K in self._timed  # a size's first round also built its kernels
        self._timed.add(K)
        self.auto.observe(K, n_acc, round_s=round_s, clean=clean)

    def _advance(self, row: Row, K: int, k: int, n: int, tokens: list[int]) -> None:
        """Emit what the row decided (at its block size k), up to its stop; trim its cache to what it
        keeps (the round appended K positions); carry b and h."""
        out, stop = self._stop_rule(row, tokens)
        P = row.cache.offset - K
        self.kv.trim_to(row.cache, P + out)
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


def _ema(old: float | None, new: float) -> float:
    return new if old is None else (1 - _EMA) * old + _EMA * new


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
