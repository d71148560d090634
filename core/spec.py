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
from core.autoblock import AutoBlock
from core.events import PrefillDone, RoundEvent, TokenEvent, TurnStats
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


class Decoder:
    """Runs chat turns for one target (+ optional drafter) on the calling thread."""

    def __init__(self, target, drafter=None, detokenizer=None, stop_ids=frozenset(), auto: AutoBlock | None = None):
        self.target = target
        self.drafter = drafter
        self.detok = detokenizer
        self.stop_ids = frozenset(stop_ids)
        self.auto = auto if auto is not None else AutoBlock()

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
        total = prompt.start + len(prompt.ids)
        if total >= tg.context_length:
            raise TurnError(
                f"the prompt is {total} tokens, the model's context is {tg.context_length}: shorten the conversation"
            )
        temp, top_k, top_p = settings.temperature, settings.top_k, settings.top_p
        keys = sampling.KeyStream(settings.seed) if temp > 0 else None
        if self.detok is not None:
            self.detok.reset()
        mx.reset_peak_memory()

        # --- prefill ------------------------------------------------------------------------
        t0 = time.perf_counter()
        rel_spans = [(a - prompt.start, b - prompt.start) for a, b in prompt.bidirectional]
        committed: list[int] = []
        logits = hidden = None
        for a, b in prefill_chunks(len(prompt.ids), rel_spans):
            if controls.cancelled:
                return self._finish(stats, [], committed, "cancelled", t0, None)
            last = b == len(prompt.ids)
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
            )
            if not last:
                mx.eval(hidden)  # bound the graph (and memory) per chunk
            committed.extend(prompt.ids[a:b])
        h = hidden[-1]
        if temp > 0:
            first = sampling.sample(sampling.transform_logits(logits[0], temp, top_k, top_p), keys.next())
        else:
            first = mx.argmax(logits[0])
        mx.eval(first, h)
        b_tok = int(first.item())
        stats.prefill_tokens = len(prompt.ids)
        stats.prefill_s = time.perf_counter() - t0
        emit(PrefillDone(stats.prompt_tokens, stats.prefill_tokens, stats.reused_tokens, stats.prefill_s))

        emitted: list[int] = []
        t_first = time.perf_counter()
        stats.ttft_s = t_first - t_start
        reason = self._emit_token(b_tok, False, 0, emitted, emit, settings)
        round_no = 0
        # Plain (K = 1) rounds are pipelined one step deep, as mlx-lm does: the next forward is
        # queued on the lazy token before the host reads it. `pending` is that queued step; its
        # input (the last emitted token) is then already in the cache, one past the invariant,
        # and is trimmed off again whenever the step is not used (stop, cancel, drafting resumes).
        pending = None
        while reason is None:
            if controls.cancelled:
                reason = "cancelled"
                break
            P = cache.offset - (1 if pending is not None else 0)
            room = min(settings.max_tokens - len(emitted), tg.context_length - P)
            if room < 1:
                reason = "max_tokens" if len(emitted) >= settings.max_tokens else "context_full"
                break
            use_drafter = self.drafter is not None and controls.drafter_enabled
            auto = use_drafter and controls.block_size == "auto"
            if not use_drafter:
                K = 1
            elif auto:
                K = self.auto.choose()
            else:
                K = int(controls.block_size)
            K = max(1, min(K, room))
            round_no += 1
            t_round = time.perf_counter()

            if K == 1:
                if pending is None:
                    pending = self._plain_step(mx.array([b_tok], dtype=mx.uint32), cache, settings, keys)
                t_arr, H = pending
                pending = None
                if room > 1 and P + 2 <= tg.context_length:
                    pending = self._plain_step(t_arr, cache, settings, keys)
                    mx.async_eval(pending[0])
                n_acc, round_tokens = 0, [int(t_arr.item())]  # the round's one host sync
            else:
                if pending is not None:
                    cache.trim(1)
                    pending = None
                b = mx.array([b_tok], dtype=mx.uint32)
                draft_keys = keys.split(K - 1) if temp > 0 else None
                drafts, q_lp = self.drafter.draft(
                    tg, cache, b, h, K - 1, temperature=temp, top_k=top_k, top_p=top_p, keys=draft_keys
                )
                logits, H = tg.forward(mx.concatenate([b, drafts]), cache, logits="all")
                if temp > 0:
                    p_lp = sampling.transform_logits(logits, temp, top_k, top_p)
                    n, t = sampling.verify_speculative(drafts, q_lp, p_lp, keys.next())
                else:
                    n, t = sampling.verify_greedy(drafts, logits)
                packed = mx.concatenate([n.reshape(1).astype(mx.uint32), t.reshape(1).astype(mx.uint32), drafts])
                values = packed.tolist()  # the round's one host sync
                n_acc, round_tokens = values[0], values[2 : 2 + values[0]] + [values[1]]

            out = 0
            for j, tok in enumerate(round_tokens):
                out += 1
                reason = self._emit_token(tok, j < n_acc, round_no, emitted, emit, settings)
                if reason is not None:
                    break
            # keep b and the accepted drafts before the last emitted token; that one is next round's b
            if pending is None or reason is not None:
                if pending is not None:
                    pending = None
                cache.trim_to(P + out)
            h = H[out - 1]
            committed.append(b_tok)
            committed.extend(round_tokens[: out - 1])
            b_tok = round_tokens[out - 1]

            accepted = min(n_acc, out)
            stats.rounds += 1
            stats.drafted += K - 1
            stats.accepted += accepted
            stats.block_size_counts[K] = stats.block_size_counts.get(K, 0) + 1
            stats.decode_tokens += out
            round_s = time.perf_counter() - t_round
            if K > 1 or auto:
                self.auto.observe(K, n_acc, round_s=round_s)
            emit(RoundEvent(round_no, K - 1, accepted, K, auto, out))
        if pending is not None:  # a queued step whose token was never emitted
            cache.trim(1)
        return self._finish(stats, emitted, committed, reason, t0, t_first)

    def _plain_step(self, b: mx.array, cache, settings: GenerationSettings, keys) -> tuple[mx.array, mx.array]:
        """Queue one plain decoding step on token b [1] (lazy): (next token [1], hidden [1, H])."""
        logits, H = self.target.forward(b, cache, logits="all")
        if settings.temperature > 0:
            lp = sampling.transform_logits(logits[0], settings.temperature, settings.top_k, settings.top_p)
            t = sampling.sample(lp, keys.next())
        else:
            t = mx.argmax(logits[0])
        return t.reshape(1).astype(mx.uint32), H

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
