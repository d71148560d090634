"""The speculative decoding loop: prefill, then rounds of draft -> verify -> accept -> trim.

One round with block size K (K counts the bonus token; the drafter proposes K - 1):

    cache holds positions [0, P); b is the last emitted token (not in the cache); h is the
    target's post-norm hidden at P - 1
    drafts = drafter.draft(b, h, producer K/V of [0, P), K - 1)      lazy
    logits, H = target.forward([b, d1 .. d_{K-1}])                   lazy, appends K positions
    n, t = verify(drafts, logits)                                    the round's one host sync
    emit d1 .. dn (from the drafter), then t (the target's own token)
    trim the cache to P + n + 1; h = H[n]; b = t

K = 1 (or the drafter off) is plain decoding through the same path. The cache always ends a
round holding exactly the committed tokens except the last emitted one, which is the next
round's b; stops, cancel and max tokens keep that invariant.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, cast

import mlx.core as mx
import mlx.nn as nn

from core import sampling
from core.decode.autoblock import (
    FIRST_DRAFT_PRIOR,
    AutoBlock,
    AutoBlockConfig,
    AutoChoice,
    load_kept,
    save_costs,
)
from core.decode.logprobs import BlockLogprobs, block_logprobs, round_tokens
from core.events import PrefillDone, RoundEvent, TokenEvent, TokenLogprob, TurnStats
from core.limits import context_error
from core.model import memory
from core.model.target import Target, TargetCache
from core.settings import GenerationSettings

if TYPE_CHECKING:
    from core.decode.detok import Detokenizer
    from core.decode.forced import ForcedPrefix

PREFILL_CHUNK = 512


def stop_rule(
    tokens: list[int], stop_ids: frozenset[int], settings: GenerationSettings, emitted: int
) -> tuple[int, str | None]:
    """The one stop rule (solo and batched turns): how many of `tokens` (decided, not yet emitted, after
    `emitted` already out) go out, and the stop they end on, if any (a stop token unless eos is
    ignored, or max tokens)."""
    for j, tok in enumerate(tokens):
        if tok in stop_ids and not settings.ignore_eos:
            return j + 1, "eos"
        if emitted + j + 1 >= settings.max_tokens:
            return j + 1, "max_tokens"
    return len(tokens), None


class DraftModel(Protocol):
    """What the round loop needs of a drafter (`core.model.drafter.Drafter`; the bench's simulated
    drafter and the tests' oracles wrap or imitate it)."""

    def draft(
        self,
        target: Target,
        cache: TargetCache,
        bonus: mx.array,
        hidden: mx.array,
        n: int,
        *,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        keys: list[mx.array] | None = None,
    ) -> tuple[mx.array, mx.array | sampling.SparseLogProbs | None]: ...


class TurnError(Exception):
    """A turn that cannot run (empty prompt, past the context length); the message is for the user."""


@dataclass
class Controls:
    """What may change while a turn runs; read at the start of every round."""

    block_size: int | str = "auto"
    drafter_enabled: bool = True
    cancel_event: threading.Event = field(default_factory=threading.Event)
    prefilled: int = 0  # prompt tokens the target has run so far this turn (the UI's prefill progress)

    @property
    def cancelled(self) -> bool:
        return self.cancel_event.is_set()


@dataclass
class Prompt:
    """The part of the prompt to prefill, with image inputs (absolute positions)."""

    ids: list[int]
    start: int = 0  # the cache length it continues (reused prefix)
    embeddings: mx.array | None = None  # [len(ids), H] soft tokens, rows used where mask is set
    embedding_mask: mx.array | None = None  # [len(ids)] bool
    bidirectional: list[tuple[int, int]] = field(default_factory=list)  # absolute [a, b) spans
    forced: ForcedPrefix | None = None  # the reply's first tokens are a walk of this trie (core.decode.forced)


@dataclass
class TurnResult:
    stats: TurnStats
    token_ids: list[int]  # every emitted token (a stop token included)
    committed: list[int]  # the new tokens whose K/V are now in the cache, in order
    text: str


def prefill_chunks(n: int, spans: list[tuple[int, int]], size: int | None = None) -> list[tuple[int, int]]:
    """Split [0, n) into chunks of about `size` (default PREFILL_CHUNK) that never cut an image span."""
    size = size or PREFILL_CHUNK
    out, a = [], 0
    while a < n:
        b = min(n, a + size)
        for s, e in spans:
            if s < b < e:  # would cut this image: end before it, or take it whole
                b = s if s > a else e
        out.append((a, b))
        a = b
    return out


@dataclass
class _Turn:
    """What a turn carries from round to round (see the module docstring's invariant)."""

    cache: TargetCache
    settings: GenerationSettings
    stats: TurnStats
    keys: sampling.KeyStream | None
    b_tok: int  # the last emitted token, not in the cache
    h: mx.array  # the target's post-norm hidden at the last cached position [H]
    emitted: list[int] = field(default_factory=list)
    committed: list[int] = field(default_factory=list)
    round_no: int = 0
    last_sync: float = 0.0  # `Decoder._clock` when the previous round was read (rounds are timed sync to sync)


@dataclass
class _Round:
    """A round built and submitted to the device, not read yet: a plain step (K = 1, no drafts)
    or a speculative round (draft K - 1, verify K). It has appended K positions at [P, P + K)."""

    K: int
    setting: int | str  # what the controls asked for when it was planned (`Decoder._setting`)
    choice: AutoChoice | None  # the controller's choice, when auto planned it
    P: int
    token: mx.array  # [1] uint32: the target's own token (lazy)
    packed: mx.array | None  # K > 1: [2 + K - 1] uint32, n accepted, the target's token, the drafts
    H: mx.array  # [K, H] target hidden states of the verified block
    ahead: bool = False  # submitted on an unread plain step (built while that step ran)
    logprobs: BlockLogprobs | None = None  # when the turn asks for them (core.decode.logprobs)


def draft_cost_hint(target: Target, drafter: object | None) -> float | None:
    """A first guess at one draft step's cost in target steps, before any round is timed: the mean of
    the drafter's weight bytes against the target's (decoding reads every weight once per step: a
    4-bit drafter is cheaper) and its layers against the target's (each layer's kernels cost time of
    their own, which dominates for small models). The controller's measurements replace it."""
    model = getattr(target, "model", None)
    layers = getattr(drafter, "layers", None)
    if not isinstance(drafter, nn.Module) or model is None or layers is None or not getattr(target, "n_layers", 0):
        return None  # a stand-in drafter (tests, the bench's simulated one): no sizes to compare
    target_bytes = memory.model_bytes(model)
    if target_bytes <= 0:
        return None
    ratio = memory.model_bytes(drafter) / target_bytes
    return min(1.0, (ratio + len(layers) / target.n_layers) / 2)


class Decoder:
    """Runs chat turns for one target (+ optional drafter) on the calling thread.

    A turn is `_prefill`, then rounds until a stop (`_decode`). Every round, a plain step included
    (a round with no drafts), goes the same way: `_plan` decides its block size from the controls
    (the one plan rule), `_submit` builds it and hands it to the device, `_read` syncs once,
    `_stop_rule` says how many of its tokens go out and why it ends (the one stop rule), `_commit`
    trims the cache and carries b and h, and `_emit_round` sends the events.

    One round is in flight ahead of the host: the next round is submitted before this one's
    tokens are emitted, so emission, detokenizing and the controller overlap device work. After
    a plain step the next round's inputs (its token, hidden row and position) are known without
    reading it, so the next round is submitted even before the sync, as mlx-lm keeps one step
    queued; after a speculative round it is submitted right after the sync. A queued round that
    turns out unwanted (a stop, cancel, new controls) is dropped and its K/V trimmed; drafting
    writes nothing, so dropping costs only the wasted work.
    """

    def __init__(
        self,
        target: Target,
        drafter: DraftModel | None = None,
        detokenizer: Detokenizer | None = None,
        stop_ids: Iterable[int] = frozenset(),
        auto: AutoBlock | None = None,
        costs_path: Path | None = None,
    ) -> None:
        self.target = target
        self.drafter = drafter
        self.detok = detokenizer
        self.stop_ids = frozenset(stop_ids)
        if auto is None:
            # on Metal, auto block size stays where the fused attention kernel applies (core.model.memory)
            cap = target.metal_block_cap() if hasattr(target, "metal_block_cap") else None
            config = AutoBlockConfig(k_max=max(2, min(AutoBlockConfig.k_max, cap))) if cap else AutoBlockConfig()
            auto = AutoBlock(config, draft_cost=draft_cost_hint(target, drafter))
        self.auto = auto
        # the block costs the last session on this machine measured: auto drafts from a first reply's
        # first round when they say drafts can pay (AutoBlock.prime), and keeps this session's for the next
        self.costs_path = costs_path
        self._saved_costs: tuple[dict[int, float], dict[str, list[float]], float | None] = ({}, {}, None)
        # what a process's first drafting round cost beyond its own, as an earlier session kept it; and
        # whether the engine traced every size at idle time (then nothing is left for a round to trace)
        self._kept_first_draft: float | None = None
        self._kept_acceptance: dict[str, list[float]] = {}  # as the file had it, for kinds this session adds nothing to
        self._traced_ahead = False
        if costs_path is not None:
            self._prime_from(costs_path)
        self._wired_bytes: int | None = None
        # Rounds are timed for the controller by the wall clock on Metal (the GPU's time is not the
        # process's), and by the process's CPU time on the CPU backend: on a shared machine another
        # process taking the cores inflates wall times by 2-5x at random, CPU time only a little.
        self._clock = time.perf_counter if memory.on_metal() else time.process_time
        self._timed_sizes: set[int] = set()  # block sizes that have run once (their kernels are built)
        # the first token's logprobs, from the last `_prefill` (when its settings ask for them)
        self.first_logprobs: BlockLogprobs | None = None

    def run(
        self,
        cache: TargetCache,
        prompt: Prompt,
        settings: GenerationSettings,
        emit: Callable[[object], None],
        controls: Controls | None = None,
        *,
        prompt_tokens: int | None = None,
        t_start: float | None = None,
    ) -> TurnResult:
        """One turn: prefill `prompt` into `cache`, then decode until a stop; events go to `emit`."""
        controls = controls or Controls(settings.block_size, settings.drafter_enabled)
        t_start = time.perf_counter() if t_start is None else t_start
        if not memory.on_metal():
            return self._run(cache, prompt, settings, emit, controls, prompt_tokens, t_start)
        if self._wired_bytes is None:
            drafter = self.drafter if isinstance(self.drafter, nn.Module) else None
            self._wired_bytes = memory.model_bytes(getattr(self.target, "model", None), drafter)
        with memory.wired_limit(self._wired_bytes + cache.nbytes):
            return self._run(cache, prompt, settings, emit, controls, prompt_tokens, t_start)

    def _run(
        self,
        cache: TargetCache,
        prompt: Prompt,
        settings: GenerationSettings,
        emit: Callable[[object], None],
        controls: Controls,
        prompt_tokens: int | None,
        t_start: float,
    ) -> TurnResult:
        stats = TurnStats(
            prompt_tokens=prompt_tokens if prompt_tokens is not None else prompt.start + len(prompt.ids),
            reused_tokens=prompt.start,
            drafter_enabled=self.drafter is not None and controls.drafter_enabled,
        )
        self._check_prompt(cache, prompt)
        keys = sampling.KeyStream(settings.seed) if settings.temperature > 0 else None
        self.auto.begin_turn(sampled=keys is not None)
        if self.detok is not None:
            self.detok.reset()
        mx.reset_peak_memory()

        t0 = time.perf_counter()
        committed: list[int] = []
        done = self._prefill(cache, prompt, settings, keys, controls, committed)
        if done is None:
            return self._finish(stats, [], committed, "cancelled", t0, None)
        first, h = done
        stats.prefill_tokens = len(prompt.ids)
        stats.prefill_s = time.perf_counter() - t0
        emit(PrefillDone(stats.prompt_tokens, stats.prefill_tokens, stats.reused_tokens, stats.prefill_s))

        t_first = time.perf_counter()
        stats.ttft_s = t_first - t_start
        turn = _Turn(cache, settings, stats, keys, first[-1], h, committed=committed, last_sync=self._clock())
        _, reason = self._stop_rule(turn, first)
        lp = self._first_logprob(first[0]) if len(first) == 1 else None  # a forced start scores none
        for tok in first:  # more than one: a forced start (Prompt.forced), all but the last in the cache
            self._emit_token(turn, tok, False, emit, lp)
        if reason is None:
            reason = self._decode(turn, controls, emit)
        self._keep_costs()
        return self._finish(stats, turn.emitted, turn.committed, reason, t0, t_first)

    def _keep_costs(self) -> None:
        if self.costs_path is not None and self.drafter is not None:
            first, before = self.auto.first_draft_measured(), self._kept_first_draft
            if first is not None and before is not None:
                first = (first + before) / 2  # one round's measure: half of it moves the kept value
            # a kind of acceptance this session drafted too little to say anything of stays as the file had it
            # (it once dropped out of the file: the next session then knew nothing, probed at once, learnt it
            # again and kept it, and the one after dropped it again: every other one-shot `generate` on the
            # dense-style pack pairing drafted where its drafts never pay)
            acceptance = {**self._kept_acceptance, **self.auto.acceptance_snapshot()}
            kept = (self.auto.cost_snapshot(), acceptance, before if first is None else first)
            if kept != self._saved_costs:
                save_costs(self.costs_path, *kept)
                self._saved_costs = kept

    @property
    def traced_ahead(self) -> bool:
        return self._traced_ahead

    @traced_ahead.setter
    def traced_ahead(self, done: bool) -> None:
        """The engine traced every block size at idle time (core.engine.kernels): no round traces now."""
        self._traced_ahead = done
        if done:
            self.auto.first_draft_cost = 0.0

    def _prime_from(self, path: Path, learnt: dict[str, list[float]] | None = None) -> None:
        """Start the controller from the costs kept at `path`, and how often the drafts were kept (else `learnt`)."""
        if self.drafter is not None:
            costs, self._kept_acceptance, self._kept_first_draft = load_kept(path)
            self.auto.prime(costs)
            self.auto.prime_acceptance(self._kept_acceptance or learnt or {})
            prior = FIRST_DRAFT_PRIOR if self._kept_first_draft is None else self._kept_first_draft
            self.auto.first_draft_cost = 0.0 if self.traced_ahead else prior

    def use_costs(self, path: Path | None) -> None:
        """Keep the block costs at `path` from now on. Compiled and uncompiled rounds cost differently
        (uncompiled, every op is dispatched on its own: on the demo a plain step takes 1.7x as long, and a
        round of 8 costs 2.0 plain steps against 2.3 compiled), so the engine keeps the two apart and
        switches files when compilation comes on mid-session. This session's costs so far go to the old
        file; the controller starts again from the new file's costs, keeping what it has learnt of
        acceptance where that file has none."""
        if path == self.costs_path:
            return
        self._keep_costs()
        learnt = self.auto.acceptance_snapshot()
        self.auto = AutoBlock(self.auto.config, draft_cost=self.auto.draft_cost)
        self.costs_path, self._saved_costs, self._kept_first_draft = path, ({}, {}, None), None
        self._kept_acceptance = {}
        if path is not None:
            self._prime_from(path, learnt)
        else:
            self.auto.prime_acceptance(learnt)
        self._timed_sizes = set()  # compiled, a size's first round traces its functions: not its cost

    def _check_prompt(self, cache: TargetCache, prompt: Prompt) -> None:
        if not prompt.ids:
            raise TurnError("empty prompt: nothing to generate from")
        if cache.offset != prompt.start:
            raise TurnError(f"internal: cache holds {cache.offset} tokens, prompt continues at {prompt.start}")
        too_long = context_error(prompt.start + len(prompt.ids), self.target.context_length)
        if too_long:
            raise TurnError(too_long)

    # --- the rounds ---------------------------------------------------------------------------

    def _decode(self, turn: _Turn, controls: Controls, emit: Callable[[object], None]) -> str:
        """Rounds until a stop, one in flight ahead of the host (see the class docstring); the stop reason."""
        cache = turn.cache
        rnd: _Round | None = None
        while True:
            if controls.cancelled:
                reason = "cancelled"
                break
            if rnd is not None and rnd.setting != self._setting(controls):
                cache.trim_to(rnd.P)  # the controls changed while it was queued: drop it, plan again
                rnd = None
            if rnd is None:
                rnd = self._next_round(turn, controls, 0)
                if rnd is None:
                    reason = "max_tokens" if len(turn.emitted) >= turn.settings.max_tokens else "context_full"
                    break
            # after a plain step the next round's inputs are known unread: queue it before the sync
            ahead = self._next_round(turn, controls, 1, after=rnd) if rnd.K == 1 else None
            n_acc, tokens = self._read(rnd)
            self._observe(turn, rnd, n_acc, ahead)
            out, stop = self._stop_rule(turn, tokens)
            if stop is not None and ahead is not None:
                cache.trim_to(ahead.P)
                ahead = None
            self._commit(turn, rnd, tokens, out, trim=ahead is None)
            if ahead is None and stop is None and not controls.cancelled:
                ahead = self._next_round(turn, controls, out)  # before this round's events go out
            self._emit_round(turn, rnd, n_acc, tokens[:out], emit)
            rnd = ahead
            if stop is not None:
                reason = stop
                break
            if len(turn.emitted) // memory.CLEAR_CACHE_EVERY != (len(turn.emitted) - out) // memory.CLEAR_CACHE_EVERY:
                mx.clear_cache()  # keep the buffer cache from growing over a long reply (as mlx-lm)
        if rnd is not None:  # a queued round that was never read
            cache.trim_to(rnd.P)
        return reason

    def _setting(self, controls: Controls) -> int | str:
        """What the controls ask for: "auto", a fixed block size, or 1 (no drafter, or the drafter off)."""
        if self.drafter is None or not controls.drafter_enabled:
            return 1
        return "auto" if controls.block_size == "auto" else int(controls.block_size)

    def _plan(self, controls: Controls, room: int) -> tuple[int, int | str, AutoChoice | None]:
        """The one plan rule: (K, setting, the controller's choice) for the next round, K <= room.
        An auto setting asks the controller, once per round."""
        setting = self._setting(controls)
        if setting != "auto":
            return min(int(setting), room), setting, None
        choice = self.auto.decide()
        if choice.block_size > room:
            k = max(1, room)
            choice = AutoChoice(k, "room", f"auto → {k}: the reply ends within {k} tokens")
        return choice.block_size, setting, choice

    def _next_round(self, turn: _Turn, controls: Controls, pending: int, after: _Round | None = None) -> _Round | None:
        """Plan and submit the round that follows the committed state, or, with `after` (an unread
        plain step), the one that follows that step; None when the reply has no room left.
        `pending`: tokens decided but not emitted yet (the unread step's one, or a read round's)."""
        P = turn.cache.offset
        # the prompt and the reply together fit the context: P cached, plus the decided token not in it yet
        room = min(turn.settings.max_tokens - len(turn.emitted) - pending, self.target.context_length - P - 1)
        if room < 1:
            return None
        K, setting, choice = self._plan(controls, room)
        if after is not None:
            rnd = self._submit(turn, K, setting, choice, after.token, after.H[0])
            rnd.ahead = True
            return rnd
        return self._submit(turn, K, setting, choice, mx.array([turn.b_tok], dtype=mx.uint32), turn.h)

    def _submit(
        self, turn: _Turn, K: int, setting: int | str, choice: AutoChoice | None, b: mx.array, h: mx.array
    ) -> _Round:
        """Build a round on token b [1] (whose K/V is not in the cache yet) and the hidden h [H]
        before it, and hand it to the device; nothing waits. The drafts are submitted as soon as
        they are built, so the device drafts while the host builds the verify."""
        s, tg, cache = turn.settings, self.target, turn.cache
        temp = s.temperature
        P = cache.offset
        if K == 1:
            logits, H = tg.forward(b, cache, logits="all", softcap=temp > 0)
            assert logits is not None  # asked for
            t = self._pick(logits[0], s, turn.keys).reshape(1).astype(mx.uint32)
            lp = self.logprobs_of(logits, t, s)
            mx.async_eval(t, *(lp.arrays() if lp is not None else []))
            return _Round(K, setting, choice, P, t, None, H, logprobs=lp)
        assert self.drafter is not None, "a speculative round needs a drafter"
        draft_keys = turn.keys.split(K - 1) if turn.keys is not None else None
        drafts, q_lp = self.drafter.draft(
            tg, cache, b, h, K - 1, temperature=temp, top_k=s.top_k, top_p=s.top_p, keys=draft_keys
        )
        mx.async_eval(drafts)
        logits, H = tg.forward(mx.concatenate([b, drafts]), cache, logits="all", softcap=temp > 0)
        assert logits is not None  # asked for
        if turn.keys is not None:
            assert q_lp is not None, "a sampled draft comes with its distribution"
            p_lp = sampling.transform_logits_compiled(logits, temp, s.top_k, s.top_p)
            n, t = sampling.verify_speculative(drafts, q_lp, p_lp, turn.keys.next())
        else:
            n, t = sampling.verify_greedy(drafts, logits)
        t = t.reshape(1).astype(mx.uint32)
        packed = mx.concatenate([n.reshape(1).astype(mx.uint32), t, drafts])
        lp = self.logprobs_of(logits, round_tokens(drafts, n, t[0]), s)
        mx.async_eval(packed, H, *(lp.arrays() if lp is not None else []))
        return _Round(K, setting, choice, P, t, packed, H, logprobs=lp)

    def logprobs_of(self, logits: mx.array, tokens: mx.array, s: GenerationSettings) -> BlockLogprobs | None:
        """The logprobs of `tokens` [..., K] under logits [..., K, V] (soft-capped when sampling), if asked."""
        if s.logprobs is None:
            return None
        cap = None if s.temperature > 0 else getattr(self.target, "softcap", None)
        return BlockLogprobs(block_logprobs(logits, tokens, s.logprobs, cap))

    def _first_logprob(self, tok: int) -> TokenLogprob | None:
        lp, self.first_logprobs = self.first_logprobs, None
        return lp.row(0, tok, self.detok) if lp is not None else None

    def _read(self, rnd: _Round) -> tuple[int, list[int]]:
        """The round's one host sync: (accepted drafts n, the tokens it decided: d1..dn, t)."""
        if rnd.packed is None:
            return 0, [cast(int, rnd.token.item())]
        values: list[int] = rnd.packed.tolist()  # type: ignore[assignment]  # a 1-D uint32 array
        n = values[0]
        return n, values[2 : 2 + n] + [values[1]]

    def _observe(self, turn: _Turn, rnd: _Round, n_acc: int, ahead: _Round | None) -> None:
        """Time the round from the previous round's sync to this one's and feed the controller. The
        time is the block size's own (clean) when the round ran as its size runs in a stretch: a plain
        step queued behind a plain step with a plain step queued behind it, or a drafting round built
        after the previous round was read (see AutoBlock.observe)."""
        now = self._clock()
        round_s, turn.last_sync = now - turn.last_sync, now
        if rnd.K > 1 or rnd.choice is not None:
            # a plain step times T(1) only between plain steps; see AutoBlock.observe for `ahead`
            clean = rnd.K > 1 or (rnd.ahead and ahead is not None and ahead.K == 1)
            traced = rnd.K not in self._timed_sizes  # its first round traces its functions (MLX compiles per shape)
            if traced:
                self._timed_sizes.add(rnd.K)
                clean = False
            clean = clean and rnd.logprobs is None  # scoring the vocabulary is not the block size's cost
            traced = traced and not self.traced_ahead
            self.auto.observe(rnd.K, n_acc, round_s=round_s, clean=clean, ahead=rnd.K > 1 and rnd.ahead, traced=traced)

    # --- per-round bookkeeping -----------------------------------------------------------------

    def _stop_rule(self, turn: _Turn, tokens: list[int]) -> tuple[int, str | None]:
        return stop_rule(tokens, self.stop_ids, turn.settings, len(turn.emitted))

    def _commit(self, turn: _Turn, rnd: _Round, tokens: list[int], out: int, trim: bool) -> None:
        """Keep b and the accepted drafts before the last emitted token (next round's b) in the cache;
        trim=False: a round queued on top of this (plain) step keeps its K/V, which needs no trim."""
        if trim:
            turn.cache.trim_to(rnd.P + out)
        turn.h = rnd.H[out - 1]
        turn.committed.append(turn.b_tok)
        turn.committed.extend(tokens[: out - 1])
        turn.b_tok = tokens[out - 1]

    def _emit_round(
        self, turn: _Turn, rnd: _Round, n_acc: int, tokens: list[int], emit: Callable[[object], None]
    ) -> None:
        turn.round_no += 1
        lp = rnd.logprobs
        for j, tok in enumerate(tokens):
            self._emit_token(turn, tok, j < n_acc, emit, lp.row(j, tok, self.detok) if lp is not None else None)
        choice = rnd.choice
        ev = RoundEvent(
            turn.round_no,
            rnd.K - 1,
            min(n_acc, len(tokens)),
            rnd.K,
            choice is not None,
            len(tokens),
            reason=choice.reason if choice else "",
            note=choice.note if choice else "",
        )
        turn.stats.add_round(ev)
        emit(ev)

    def _emit_token(
        self,
        turn: _Turn,
        tok: int,
        from_draft: bool,
        emit: Callable[[object], None],
        logprob: TokenLogprob | None = None,
    ) -> None:
        turn.emitted.append(tok)
        text = self.detok.add(tok) if self.detok is not None else ""
        emit(TokenEvent(tok, text, from_draft, turn.round_no, logprob))

    # --- prefill ------------------------------------------------------------------------------

    def _prefill(
        self,
        cache: TargetCache,
        prompt: Prompt,
        settings: GenerationSettings,
        keys: sampling.KeyStream | None,
        controls: Controls,
        committed: list[int],
    ) -> tuple[list[int], mx.array] | None:
        """Run the prompt through the target in chunks; ([first token], hidden at its last position),
        or None when cancelled between chunks. With `prompt.forced`, the reply's first tokens are its
        walk (`_walk`): all of them but the last are then in the cache and in `committed`.

        Every chunk but the last evaluates only the K/V it appends, and the last position runs as
        its own one-token step (as mlx-lm's generate_step does). MLX is lazy, so for the
        earlier positions nothing is computed that no cache keeps. On the E-series (KV-shared
        layers) that skips the shared layers and the final norm, more than half of E2B's layers.
        The one exception: a last position inside an image span stays in its span's chunk."""
        tg = self.target
        n = len(prompt.ids)
        rel_spans = [(a - prompt.start, b - prompt.start) for a, b in prompt.bidirectional]
        logits: mx.array | None = None
        hidden: mx.array | None = None
        size = tg.prefill_chunk_size() if hasattr(tg, "prefill_chunk_size") else None
        split_last = n > 1 and not any(s <= n - 1 < e for s, e in rel_spans)
        chunks = (
            prefill_chunks(n - 1, rel_spans, size) + [(n - 1, n)] if split_last else prefill_chunks(n, rel_spans, size)
        )
        for a, b in chunks:
            if controls.cancelled:
                return None
            last = b == n
            emb = mask = None
            if prompt.embeddings is not None and prompt.embedding_mask is not None:
                emb, mask = prompt.embeddings[a:b], prompt.embedding_mask[a:b]
            spans = [(s + prompt.start, e + prompt.start) for s, e in rel_spans if s < b and e > a]
            logits, hidden = tg.forward(
                prompt.ids[a:b],
                cache,
                embeddings=emb,
                embedding_mask=mask,
                bidirectional=spans or None,
                logits="last" if last else None,
                softcap=settings.temperature > 0,
            )
            if not last:
                mx.eval(cache.state())  # bound the graph (and memory) per chunk; see the docstring
                mx.clear_cache()
                controls.prefilled = b
            committed.extend(prompt.ids[a:b])
        assert logits is not None and hidden is not None  # the last chunk asked for its logits
        h = hidden[-1]
        if prompt.forced is not None:
            controls.prefilled = len(prompt.ids)
            self.first_logprobs = None
            return self._walk(cache, prompt.forced, logits[0], h, settings, keys, committed)
        first = self._pick(logits[0], settings, keys)
        self.first_logprobs = self.logprobs_of(logits[:1], first.reshape(1), settings)
        mx.eval(first, h, *(self.first_logprobs.arrays() if self.first_logprobs is not None else []))
        controls.prefilled = len(prompt.ids)
        return [cast(int, first.item())], h

    def _walk(
        self,
        cache: TargetCache,
        node: ForcedPrefix,
        logits: mx.array,
        h: mx.array,
        settings: GenerationSettings,
        keys: sampling.KeyStream | None,
        committed: list[int],
    ) -> tuple[list[int], mx.array]:
        """A forced start (core.decode.forced): from the target's `logits` [V] and hidden `h` [H] at the
        last cached position, walk the trie to a complete opening. One possible token is taken as is;
        among several the target picks (the others masked out), after the walked tokens before it ran.
        Returns (the walked tokens, the hidden before the last); all but the last end up in the cache."""
        tg, softcap = self.target, settings.temperature > 0
        walked: list[int] = []
        pending: list[int] = []  # walked, not yet in the cache
        while node.children:
            if len(node.children) == 1:
                tok = next(iter(node.children))
            else:
                if pending:
                    step_logits, hidden = tg.forward(pending, cache, logits="last", softcap=softcap)
                    assert step_logits is not None  # asked for
                    committed.extend(pending)
                    pending, logits, h = [], step_logits[0], hidden[-1]
                allowed = sorted(node.children)
                mask = mx.full(logits.shape, float("-inf"), dtype=logits.dtype)
                mask[mx.array(allowed)] = 0.0
                tok = cast(int, self._pick(logits + mask, settings, keys).item())
            walked.append(tok)
            node = node.children[tok]
            if node.children:
                pending.append(tok)
        if pending:
            _, hidden = tg.forward(pending, cache, logits=None, softcap=softcap)
            committed.extend(pending)
            h = hidden[-1]
        mx.eval(h, cache.state())
        return walked, h

    def _pick(self, logits: mx.array, settings: GenerationSettings, keys: sampling.KeyStream | None) -> mx.array:
        """One token from one row of logits [V]: the argmax, or a sample from the transformed distribution."""
        if keys is not None:
            lp = sampling.transform_logits_compiled(logits, settings.temperature, settings.top_k, settings.top_p)
            return sampling.sample(lp, keys.next())
        return mx.argmax(logits)

    def _finish(
        self,
        stats: TurnStats,
        emitted: list[int],
        committed: list[int],
        reason: str,
        t0: float,
        t_first: float | None,
    ) -> TurnResult:
        now = time.perf_counter()
        if t_first is None:
            stats.prefill_s = now - t0
        else:
            stats.decode_s = now - t_first
        stats.stop_reason = reason
        stats.peak_memory_bytes = int(mx.get_peak_memory())
        text = ""
        if self.detok is not None:
            self.detok.flush()
            text = self.detok.text
        return TurnResult(stats, list(emitted), committed, text)
