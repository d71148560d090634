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
from collections.abc import Callable
from dataclasses import dataclass, field

import mlx.core as mx

from core import sampling
from core.decode.autoblock import AutoBlock, AutoBlockConfig
from core.events import PrefillDone, RoundEvent, TokenEvent, TurnStats
from core.limits import context_error
from core.model import memory
from core.model.target import TargetCache
from core.settings import GenerationSettings

PREFILL_CHUNK = 512


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
    last_sync: float = 0.0  # when the previous round's result was read (rounds are timed sync to sync)


@dataclass
class _Round:
    """A speculative round built and submitted to the device, not read yet.

    Its verify has appended K positions to the cache at [P, P + K)."""

    K: int
    auto: bool
    P: int
    drafts: mx.array  # [K - 1] uint32
    packed: mx.array  # [2 + K - 1]: n accepted, the target's token, the drafts
    H: mx.array  # [K, H] target hidden states of the verified block


class Decoder:
    """Runs chat turns for one target (+ optional drafter) on the calling thread.

    A turn is `_prefill`, then rounds until a stop: a plain step (`_plain_step`, K = 1) or a
    speculative round (`_queue_round` builds and submits it, `_read_round` syncs once), each
    followed by `_commit` (trim the cache, carry b and h) and `_emit_round` (events, detokenizer,
    block-size controller). Both kinds are pipelined one round deep: the next plain step or
    speculative round is queued on the device before the host emits this round's tokens, so
    emission, detokenizing and the controller overlap device work. A queued round that turns
    out unwanted (a stop, cancel, a new block size, the drafter toggled) is dropped and its K/V
    trimmed; drafting writes nothing, so dropping costs only the wasted work.
    """

    def __init__(self, target, drafter=None, detokenizer=None, stop_ids=frozenset(), auto: AutoBlock | None = None):
        self.target = target
        self.drafter = drafter
        self.detok = detokenizer
        self.stop_ids = frozenset(stop_ids)
        if auto is None:
            # on Metal, auto block size stays where the fused attention kernel applies (core.model.memory)
            cap = target.metal_block_cap() if hasattr(target, "metal_block_cap") else None
            auto = AutoBlock(AutoBlockConfig(k_max=max(2, min(AutoBlockConfig.k_max, cap)))) if cap else AutoBlock()
        self.auto = auto
        self._wired_bytes: int | None = None

    def run(
        self,
        cache,
        prompt: Prompt,
        settings: GenerationSettings,
        emit: Callable[[object], None],
        controls: Controls | None = None,
        *,
        prompt_tokens: int | None = None,
        t_start: float | None = None,
    ) -> TurnResult:
        """One turn: prefill `prompt` into `cache`, then decode until a stop; events go to `emit`."""
        if not memory.on_metal():
            return self._run(cache, prompt, settings, emit, controls, prompt_tokens, t_start)
        if self._wired_bytes is None:
            self._wired_bytes = memory.model_bytes(getattr(self.target, "model", None), self.drafter)
        with memory.wired_limit(self._wired_bytes + cache.nbytes):
            return self._run(cache, prompt, settings, emit, controls, prompt_tokens, t_start)

    def _run(self, cache, prompt, settings, emit, controls, prompt_tokens, t_start) -> TurnResult:
        controls = controls or Controls(settings.block_size, settings.drafter_enabled)
        t_start = time.perf_counter() if t_start is None else t_start
        tg = self.target
        stats = TurnStats(
            prompt_tokens=prompt_tokens if prompt_tokens is not None else prompt.start + len(prompt.ids),
            reused_tokens=prompt.start,
            drafter_enabled=self.drafter is not None and controls.drafter_enabled,
        )
        if not prompt.ids:
            raise TurnError("empty prompt: nothing to generate from")
        if cache.offset != prompt.start:
            raise TurnError(f"internal: cache holds {cache.offset} tokens, prompt continues at {prompt.start}")
        too_long = context_error(prompt.start + len(prompt.ids), tg.context_length)
        if too_long:
            raise TurnError(too_long)
        keys = sampling.KeyStream(settings.seed) if settings.temperature > 0 else None
        if self.detok is not None:
            self.detok.reset()
        mx.reset_peak_memory()

        t0 = time.perf_counter()
        committed: list[int] = []
        done = self._prefill(cache, prompt, settings, keys, controls, committed)
        if done is None:
            return self._finish(stats, [], committed, "cancelled", t0, None)
        b_tok, h = done
        stats.prefill_tokens = len(prompt.ids)
        stats.prefill_s = time.perf_counter() - t0
        emit(PrefillDone(stats.prompt_tokens, stats.prefill_tokens, stats.reused_tokens, stats.prefill_s))

        t_first = time.perf_counter()
        stats.ttft_s = t_first - t_start
        turn = _Turn(cache, settings, stats, keys, b_tok, h, committed=committed, last_sync=t_first)
        reason = self._emit_token(b_tok, False, 0, turn.emitted, emit, settings)
        # Plain rounds keep one step queued (`pending`), as mlx-lm does: its input (the last emitted
        # token) is then already in the cache, one past the invariant, and is trimmed off again
        # whenever the step is not used. `queued` is a speculative round submitted the same way.
        pending = None
        queued: _Round | None = None
        plan: tuple[int, bool] | None = None  # (K, auto) of the round queued ahead, if any
        while reason is None:
            if controls.cancelled:
                reason = "cancelled"
                break
            P = cache.offset - (1 if pending is not None else 0) - (queued.K if queued is not None else 0)
            # the reply and the prompt together fit the context (P cached + the emitted token not yet in it)
            room = min(settings.max_tokens - len(turn.emitted), tg.context_length - P - 1)
            if room < 1:
                reason = "max_tokens" if len(turn.emitted) >= settings.max_tokens else "context_full"
                break
            if plan is not None and self._plan_holds(plan, controls, room):
                K, auto = plan
            else:  # the controls changed while a round was queued: drop it, decide again
                if queued is not None:
                    cache.trim_to(queued.P)
                    queued = None
                K, auto = self._block_size(controls, room)
            plan = None
            turn.round_no += 1

            if K == 1:
                if pending is None:
                    pending = self._plain_step(mx.array([turn.b_tok], dtype=mx.uint32), cache, settings, keys)
                t_arr, H = pending
                pending = None
                if room > 1 and P + 2 <= tg.context_length:
                    pending = self._plain_step(t_arr, cache, settings, keys)
                    mx.async_eval(pending[0])
                n_acc, round_tokens = 0, [int(t_arr.item())]  # the round's one host sync
                self._observe(turn, K, auto, n_acc)
                out, reason = self._emit_count(turn, round_tokens)
                if reason is not None:
                    pending = None
                self._commit(turn, P, round_tokens, out, H, trim=pending is None)
            else:
                if pending is not None:
                    cache.trim(1)
                    pending = None
                rnd = queued if queued is not None else self._queue_round(turn, K, auto)
                queued = None
                n_acc, round_tokens = self._read_round(rnd)
                self._observe(turn, K, auto, n_acc)
                out, reason = self._emit_count(turn, round_tokens)
                self._commit(turn, rnd.P, round_tokens, out, rnd.H, trim=True)
                next_room = min(settings.max_tokens - len(turn.emitted) - out, tg.context_length - cache.offset)
                if reason is None and not controls.cancelled and next_room >= 1:
                    # queue the next round before emitting this one: the host work below overlaps it
                    plan = self._block_size(controls, next_room)
                    if plan[0] > 1:
                        queued = self._queue_round(turn, *plan)
                    else:
                        pending = self._plain_step(mx.array([turn.b_tok], dtype=mx.uint32), cache, settings, keys)
                        mx.async_eval(pending[0])
            reason = self._emit_round(turn, K, auto, n_acc, round_tokens, out, emit, reason)
            if len(turn.emitted) // memory.CLEAR_CACHE_EVERY != (len(turn.emitted) - out) // memory.CLEAR_CACHE_EVERY:
                mx.clear_cache()  # keep the buffer cache from growing over a long reply (as mlx-lm)
        if pending is not None:  # a queued step whose token was never emitted
            cache.trim(1)
        if queued is not None:  # a queued round that was never read
            cache.trim_to(queued.P)
        return self._finish(stats, turn.emitted, turn.committed, reason, t0, t_first)

    # --- prefill ------------------------------------------------------------------------------

    def _prefill(self, cache, prompt: Prompt, settings, keys, controls, committed) -> tuple[int, mx.array] | None:
        """Run the prompt through the target in chunks; (first token, hidden at its last position),
        or None when cancelled between chunks.

        Every chunk but the last evaluates only the K/V it appends, and the last position runs as
        its own one-token step (as mlx-lm's generate_step does). MLX is lazy, so for the
        earlier positions nothing is computed that no cache keeps. On the E-series (KV-shared
        layers) that skips the shared layers and the final norm, more than half of E2B's layers.
        The one exception: a last position inside an image span stays in its span's chunk."""
        tg = self.target
        n = len(prompt.ids)
        rel_spans = [(a - prompt.start, b - prompt.start) for a, b in prompt.bidirectional]
        logits = hidden = None
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
            if prompt.embeddings is not None:
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
        h = hidden[-1]
        first = self._pick(logits[0], settings, keys)
        mx.eval(first, h)
        controls.prefilled = len(prompt.ids)
        return int(first.item()), h

    def _pick(self, logits: mx.array, settings: GenerationSettings, keys) -> mx.array:
        """One token from one row of logits [V]: the argmax, or a sample from the transformed distribution."""
        if settings.temperature > 0:
            lp = sampling.transform_logits_compiled(logits, settings.temperature, settings.top_k, settings.top_p)
            return sampling.sample(lp, keys.next())
        return mx.argmax(logits)

    # --- a plain step ---------------------------------------------------------------------------

    def _plain_step(self, b: mx.array, cache, settings: GenerationSettings, keys) -> tuple[mx.array, mx.array]:
        """Queue one plain decoding step on token b [1] (lazy): (next token [1], hidden [1, H])."""
        logits, H = self.target.forward(b, cache, logits="all", softcap=settings.temperature > 0)
        return self._pick(logits[0], settings, keys).reshape(1).astype(mx.uint32), H

    # --- a speculative round ------------------------------------------------------------------

    def _block_size(self, controls: Controls, room: int) -> tuple[int, bool]:
        """(K, auto) for the next round (an auto choice asks the controller, once per round)."""
        use_drafter = self.drafter is not None and controls.drafter_enabled
        auto = use_drafter and controls.block_size == "auto"
        if not use_drafter:
            K = 1
        elif auto:
            K = self.auto.choose()
        else:
            K = int(controls.block_size)
        return max(1, min(K, room)), auto

    def _plan_holds(self, plan: tuple[int, bool], controls: Controls, room: int) -> bool:
        """Whether a round decided ahead still matches the controls (they may change while it runs)."""
        K, auto = plan
        use_drafter = self.drafter is not None and controls.drafter_enabled
        if use_drafter and controls.block_size == "auto":
            return auto and K <= room  # the controller's choice stands
        want = max(1, min(int(controls.block_size), room)) if use_drafter else 1
        return not auto and K == want

    def _observe(self, turn: _Turn, K: int, auto: bool, n_acc: int) -> None:
        """Time the round from the previous round's sync to this one's and feed the controller."""
        now = time.perf_counter()
        round_s, turn.last_sync = now - turn.last_sync, now
        if K > 1 or auto:
            self.auto.observe(K, n_acc, round_s=round_s)

    def _queue_round(self, turn: _Turn, K: int, auto: bool) -> _Round:
        """Build round (draft K - 1, verify K) on the committed state and submit it; nothing waits.

        The drafts are submitted as soon as they are built, so the device drafts while the host
        builds the verify."""
        s, tg, cache = turn.settings, self.target, turn.cache
        temp = s.temperature
        P = cache.offset
        b = mx.array([turn.b_tok], dtype=mx.uint32)
        draft_keys = turn.keys.split(K - 1) if temp > 0 else None
        drafts, q_lp = self.drafter.draft(
            tg, cache, b, turn.h, K - 1, temperature=temp, top_k=s.top_k, top_p=s.top_p, keys=draft_keys
        )
        mx.async_eval(drafts)
        logits, H = tg.forward(mx.concatenate([b, drafts]), cache, logits="all", softcap=temp > 0)
        if temp > 0:
            p_lp = sampling.transform_logits_compiled(logits, temp, s.top_k, s.top_p)
            n, t = sampling.verify_speculative(drafts, q_lp, p_lp, turn.keys.next())
        else:
            n, t = sampling.verify_greedy(drafts, logits)
        packed = mx.concatenate([n.reshape(1).astype(mx.uint32), t.reshape(1).astype(mx.uint32), drafts])
        mx.async_eval(packed, H)
        return _Round(K, auto, P, drafts, packed, H)

    def _read_round(self, rnd: _Round) -> tuple[int, list[int]]:
        """The round's one host sync: (accepted drafts n, the tokens it decided: d1..dn, t)."""
        values: list[int] = rnd.packed.tolist()  # a 1-D uint32 array
        n = values[0]
        return n, values[2 : 2 + n] + [values[1]]

    # --- per-round bookkeeping -----------------------------------------------------------------

    def _emit_count(self, turn: _Turn, round_tokens: list[int]) -> tuple[int, str | None]:
        """How many of the round's tokens will be emitted, and the stop reason they end on (decided
        before emitting, so the next round can be queued first). Mirrors `_emit_token`."""
        s = turn.settings
        for j, tok in enumerate(round_tokens):
            if tok in self.stop_ids and not s.ignore_eos:
                return j + 1, "eos"
            if len(turn.emitted) + j + 1 >= s.max_tokens:
                return j + 1, "max_tokens"
        return len(round_tokens), None

    def _commit(self, turn: _Turn, P: int, round_tokens: list[int], out: int, H: mx.array, trim: bool) -> None:
        """Keep b and the accepted drafts before the last emitted token (next round's b) in the cache."""
        if trim:
            turn.cache.trim_to(P + out)
        turn.h = H[out - 1]
        turn.committed.append(turn.b_tok)
        turn.committed.extend(round_tokens[: out - 1])
        turn.b_tok = round_tokens[out - 1]

    def _emit_round(self, turn: _Turn, K, auto, n_acc, round_tokens, out, emit, reason) -> str | None:
        s, stats = turn.settings, turn.stats
        got = None
        for j, tok in enumerate(round_tokens[:out]):
            got = self._emit_token(tok, j < n_acc, turn.round_no, turn.emitted, emit, s)
        accepted = min(n_acc, out)
        stats.rounds += 1
        stats.drafted += K - 1
        stats.accepted += accepted
        stats.block_size_counts[K] = stats.block_size_counts.get(K, 0) + 1
        stats.decode_tokens += out
        emit(RoundEvent(turn.round_no, K - 1, accepted, K, auto, out))
        return got if got is not None else reason

    def _emit_token(self, tok: int, from_draft: bool, round_no: int, emitted: list[int], emit, settings) -> str | None:
        emitted.append(tok)
        text = self.detok.add(tok) if self.detok is not None else ""
        emit(TokenEvent(tok, text, from_draft, round_no))
        if tok in self.stop_ids and not settings.ignore_eos:
            return "eos"
        if len(emitted) >= settings.max_tokens:
            return "max_tokens"
        return None

    def _finish(self, stats, emitted, committed, reason, t0, t_first) -> TurnResult:
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
