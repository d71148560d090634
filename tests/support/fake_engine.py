"""A scripted stand-in for `core.engine.local.Engine`, with exactly its public API.

It owns one thread like the real engine, emits predetermined tokens with `from_draft` flags in rounds
shaped by the block size and the drafter switch, and records every control call together with the
round it arrived in, so tests can check that `set_block_size` mid-turn changes the NEXT round.

Like the real engine, the first token comes from the prefill (after PrefillDone, `round=0`, counted
in no RoundEvent and not in TurnStats.decode_tokens). Rounds: with block size K and the drafter on,
a round proposes K-1 drafts and accepts min(K-1, accept_pattern[round % len]) of them, then emits
those drafted tokens followed by one token of the target's own. With the drafter off every round
emits one target token. Auto block size is the engine's own controller (core.decode.autoblock),
fed the fake's virtual round times, and its choice and reason ride on the RoundEvent as the real
engine's do. Timing is virtual (`round_s` per plain round, `draft_cost` of it more per draft) so the
statistics in TurnDone are deterministic; `delay_s` is real sleep per round, for watching it stream.
`step=True` holds every round until `allow(n)` releases it.

Tool calls: when a chat is given `tools` (or `tools_always`), a scripted reply may hold calls written
as the model writes them, `<|tool_call>call:NAME{key:<|"|>v<|"|>}<tool_call|>`: the text around
them streams as tokens, then each call's tokens (no text; the call as the model writes it in their
`call_text`, some drafted) followed by ToolCallStarted, ToolCallDelta and ToolCall (or ToolCallError
for one that does not parse, raw text kept), and the turn ends with stop reason "tool_calls", as the
real engine's does.
"""

from __future__ import annotations

import concurrent.futures
import queue
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from core.decode.autoblock import AutoBlock
from core.decode.tool_calls import MALFORMED, Malformed, new_call_id, parse_call_text
from core.engine.contract import EngineFeatures, PairingInfo, PairingSpec
from core.engine.local import no_audio_message
from core.events import (
    LoadProgress,
    Notice,
    PrefillDone,
    PrefillStarted,
    RoundEvent,
    TokenEvent,
    ToolCall,
    ToolCallDelta,
    ToolCallError,
    ToolCallStarted,
    TurnDone,
    TurnStats,
)
from core.limits import BLOCK_SIZE_RANGE, DEFAULT_IMAGE_BUDGET, context_error, is_block_size
from core.settings import GenerationSettings

DEFAULT_REPLY = (
    "Speculative decoding lets a small **drafter** propose tokens that the target model checks "
    "in a single forward pass.\n\n"
    "```python\n"
    "def add(a, b):\n"
    "    return a + b\n"
    "```\n\n"
    "Every accepted draft is a token the target did not have to generate alone."
)

IMAGE_TOKENS = DEFAULT_IMAGE_BUDGET  # soft tokens per image
AUDIO_TOKENS = 25  # soft tokens per audio clip (a second of audio on E2B/E4B)
PEAK_MEMORY_BYTES = 123 * 1024 * 1024


CALL = re.compile(r"<\|tool_call>(.*?)<tool_call\|>", re.S)
CALL_PIECE = 3  # characters of a call per token (the call_text of each)


def split_calls(reply: str) -> tuple[str, list[str]]:
    """A scripted reply -> (its content, the text of each call between the markers)."""
    calls = CALL.findall(reply)
    return CALL.sub("", reply).replace("<|tool_response>", ""), calls


def split_tokens(text: str) -> list[str]:
    """Word-ish tokens that keep their leading whitespace, so "".join(tokens) == text."""
    return re.findall(r"\s*\S+|\s+", text)


@dataclass
class Call:
    name: str
    arg: object
    rounds_done: int | None  # rounds completed in the running turn when it arrived; None when idle


@dataclass
class _Control:
    block_size: int | str = "auto"
    drafter_enabled: bool = True
    cancel: bool = False


@dataclass
class FakeEngine:
    replies: list[str] = field(default_factory=lambda: [DEFAULT_REPLY])
    accept_pattern: tuple[int, ...] = (3, 1, 2, 0, 3, 2)
    round_s: float = 0.02  # virtual seconds per plain round (statistics and the auto controller only)
    draft_cost: float = 0.1  # virtual cost of one draft, in plain rounds
    delay_s: float = 0.0  # real seconds slept per round
    step: bool = False
    load_delay_s: float = 0.0
    hold_load: bool = False  # load waits for release_load()
    load_error: str | None = None
    chat_error: str | None = None  # the next chat fails with this message (TurnDone error), once
    name: str = "fake (scripted)"
    demo: bool = False
    has_vision: bool = True  # False: image items fail the turn, as on a pairing without a vision tower
    has_audio: bool = True  # False: audio items fail the turn, as on a pairing without an audio tower
    context_length: int = 4096  # each image counts IMAGE_TOKENS prompt tokens against it
    hold_prefill: bool = False  # each turn's prefill waits for release_prefill()
    prefill_done: int = 0  # what a held prefill reports as done so far (tests set it)
    tools_enabled: bool = True  # features.tools
    # a call's tokens carry its text (TokenEvent.call_text), as the local engine's do; False: one token
    # without text, then the call's events only, as a `--connect` server's stream gives them
    call_tokens: bool = True
    notices: tuple[str, ...] = ()  # every turn's Notice events, before its prefill (as the engine sends them)
    refuse_after_notices: str | None = None  # then the turn fails with this (an image the tower cannot encode)

    def __post_init__(self) -> None:
        self.calls: list[Call] = []
        self.chats: list[tuple[list[dict], GenerationSettings]] = []
        self.tools: list[list[dict] | None] = []  # the tools of each chat call
        # everything emitted, for tests to compare the screen against
        self.tokens: list[TokenEvent] = []
        self.rounds: list[RoundEvent] = []
        self.turns: list[TurnDone] = []
        self._info: PairingInfo | None = None
        self._control = _Control()
        self._lock = threading.Lock()
        self._rounds_done: int | None = None
        self._gate = threading.Semaphore(0)
        self._jobs: queue.Queue = queue.Queue()
        self._closed = False
        self._reply_index = 0
        self._prefill_gate = threading.Event()
        self.prefilling: PrefillStarted | None = None  # as the real engine's
        self._load_gate = threading.Event()
        if not self.hold_load:
            self._load_gate.set()
        self._thread = threading.Thread(target=self._serve, name="fake-engine", daemon=True)
        self._thread.start()

    # -- the Engine API -------------------------------------------------------------------------
    def release_prefill(self) -> None:
        """Let the held prefill (hold_prefill=True) finish."""
        self._prefill_gate.set()

    def load(
        self, spec: PairingSpec, on_event: Callable[[LoadProgress], None] | None
    ) -> concurrent.futures.Future[PairingInfo]:
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self._jobs.put(("load", spec, on_event, fut))
        return fut

    def chat(
        self,
        messages: list[dict],
        settings: GenerationSettings,
        on_event: Callable,
        tools: list[dict] | None = None,  # with tools, the script's calls come as tool-call events
    ) -> concurrent.futures.Future[TurnDone]:
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self.tools.append(tools)
        self.chats.append(([dict(m) for m in messages], settings))
        with self._lock:
            self._gate = threading.Semaphore(0)  # drop permits left by a cancel while idle
            self._control.cancel = False
            self._control.block_size = settings.block_size
            self._control.drafter_enabled = settings.drafter_enabled
        self._jobs.put(("chat", (messages, settings, tools), on_event, fut))
        return fut

    def cancel(self) -> None:
        self._record("cancel", None)
        with self._lock:
            self._control.cancel = True
        self._gate.release()  # a held round must see the cancel

    def set_block_size(self, k: int | str) -> None:
        if not is_block_size(k):
            raise ValueError(f"block size must be {BLOCK_SIZE_RANGE} or 'auto', got {k!r}")
        self._record("set_block_size", k)
        with self._lock:
            self._control.block_size = k

    def set_drafter_enabled(self, on: bool) -> None:
        self._record("set_drafter_enabled", bool(on))
        with self._lock:
            self._control.drafter_enabled = bool(on)

    def close(self) -> None:
        self._record("close", None)
        self._closed = True
        with self._lock:
            self._control.cancel = True
        self._gate.release()
        self._load_gate.set()
        self._jobs.put(None)
        self._thread.join(timeout=2.0)

    @property
    def info(self) -> PairingInfo | None:
        return self._info

    @property
    def features(self) -> EngineFeatures:
        info = self._info
        return EngineFeatures(
            images=info is not None and info.has_vision,
            audio=info is not None and info.has_audio,
            tools=info is not None and self.tools_enabled,
        )

    # -- test helpers ---------------------------------------------------------------------------
    def release_load(self) -> None:
        self._load_gate.set()

    def allow(self, rounds: int = 1) -> None:
        """In step mode, let `rounds` more rounds run."""
        for _ in range(rounds):
            self._gate.release()

    @property
    def rounds_done(self) -> int | None:
        return self._rounds_done

    def calls_named(self, name: str) -> list[Call]:
        return [c for c in self.calls if c.name == name]

    # -- the engine thread ----------------------------------------------------------------------
    def _record(self, name: str, arg: object) -> None:
        self.calls.append(Call(name, arg, self._rounds_done))

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            kind, arg, on_event, fut = job
            result: PairingInfo | TurnDone
            try:
                if kind == "load":
                    result = self._load(arg, on_event)
                else:
                    messages, settings, tools = arg
                    result = self._chat(messages, settings, on_event, tools)
            except Exception as e:  # a fake must never hang its caller
                fut.set_exception(e)
            else:
                fut.set_result(result)

    def _load(self, spec: PairingSpec, on_event: Callable) -> PairingInfo:
        for i, stage in enumerate(("tokenizer", "target", "drafter")):
            on_event(LoadProgress(stage, i / 3, f"loading {stage}"))
            if self.load_delay_s:
                time.sleep(self.load_delay_s / 3)
        self._load_gate.wait()
        if self.load_error:
            raise RuntimeError(self.load_error)
        self._info = PairingInfo(
            name=spec.name,
            target_path=spec.target,
            drafter_path=spec.drafter,
            has_vision=self.has_vision,
            has_audio=self.has_audio and not spec.demo,
            demo=spec.demo,
            context_length=self.context_length,
            vocab_size=262144,
            sliding_window=512,
            dtype="bfloat16",
            supports_thinking=False,
        )
        on_event(LoadProgress("ready", 1.0, "ready"))
        return self._info

    def _chat(
        self, messages: list[dict], settings: GenerationSettings, on_event: Callable, tools: list[dict] | None = None
    ) -> TurnDone:
        stats = TurnStats()
        if self._info is None:
            return self._fail(stats, "no model is loaded", on_event)
        if self.chat_error:
            err, self.chat_error = self.chat_error, None
            return self._fail(stats, err, on_event)
        reply = self.replies[self._reply_index % len(self.replies)]
        self._reply_index += 1
        if "{tool_result}" in reply:  # a scripted answer that quotes the last tool result it was given
            results = [str(m.get("content")) for m in messages if m.get("role") == "tool"]
            reply = reply.replace("{tool_result}", results[-1] if results else "(no tool result)")
        calls: list[str] = []
        if tools and self.tools_enabled:
            reply, calls = split_calls(reply)
        tokens = split_tokens(reply)
        prompt_tokens = sum(len(split_tokens(_text_of(m))) + 4 for m in messages)
        images, clips = _count_items(messages, "image"), _count_items(messages, "audio")
        if images and not self.has_vision:  # the real engine's messages
            return self._fail(stats, "this model does not take images (no vision tower loaded)", on_event)
        if clips and not self._info.has_audio:
            return self._fail(stats, no_audio_message(self._info.name), on_event)
        prompt_tokens += images * IMAGE_TOKENS + clips * AUDIO_TOKENS
        if too_long := context_error(prompt_tokens, self.context_length):
            return self._fail(stats, too_long, on_event)
        stats.prompt_tokens = stats.prefill_tokens = prompt_tokens
        for text in self.notices:
            on_event(Notice(text))
        if self.refuse_after_notices is not None:
            time.sleep(0.05)  # as the real encoding takes a while: the notices reach a listener first
            return self._fail(stats, self.refuse_after_notices, on_event)
        self.prefilling = PrefillStarted(
            prompt_tokens, prompt_tokens, time.monotonic(), done=lambda: min(self.prefill_done, prompt_tokens)
        )
        if self.hold_prefill:
            self._prefill_gate.wait()
            self._prefill_gate.clear()
        self.prefilling = None
        stats.prefill_s = prompt_tokens * 0.001
        on_event(PrefillDone(prompt_tokens, prompt_tokens, 0, stats.prefill_s))
        stats.ttft_s = stats.prefill_s  # like the real engine: the first token comes from the prefill
        self._rounds_done = 0
        emitted_ids: list[int] = []
        # one per turn, so every turn starts from the same state and tests can predict it: a controller
        # that has timed its plain steps, as the engine's has after its first turn
        controller = AutoBlock()
        for _ in range(3):
            controller.observe(1, 0, round_s=self.round_s)
        pos = 0
        # The first token is the prefill's: emitted before round 0, counted in no round.
        if tokens and settings.max_tokens > 0:
            first = TokenEvent(1000, tokens[0], from_draft=False, round=0)
            emitted_ids.append(first.id)
            self.tokens.append(first)
            on_event(first)
            pos = 1
        cancelled = False
        try:
            while pos < len(tokens) and len(emitted_ids) < settings.max_tokens:
                if self.step:
                    self._gate.acquire()  # the same object chat() installed: no chat runs meanwhile
                elif self.delay_s:
                    time.sleep(self.delay_s)
                with self._lock:
                    ctl = _Control(self._control.block_size, self._control.drafter_enabled, self._control.cancel)
                if ctl.cancel:
                    cancelled = True
                    break
                auto = ctl.block_size == "auto" and ctl.drafter_enabled
                choice = controller.decide() if auto else None
                k = choice.block_size if choice else int(ctl.block_size) if ctl.drafter_enabled else 1
                drafted = k - 1
                r = self._rounds_done
                accepted = min(drafted, self.accept_pattern[r % len(self.accept_pattern)])
                room = settings.max_tokens - len(emitted_ids)
                chunk = tokens[pos : pos + min(accepted + 1, room)]
                for i, text in enumerate(chunk):
                    tid = 1000 + pos + i
                    emitted_ids.append(tid)
                    tok = TokenEvent(tid, text, from_draft=i < accepted, round=r)
                    self.tokens.append(tok)
                    on_event(tok)
                pos += len(chunk)
                cost = self.round_s * (1 + self.draft_cost * drafted)
                if k > 1 or auto:
                    controller.observe(k, accepted, round_s=cost)
                reason, note = (choice.reason, choice.note) if choice else ("", "")
                round_event = RoundEvent(r, drafted, accepted, k, auto, len(chunk), reason=reason, note=note)
                self.rounds.append(round_event)
                on_event(round_event)
                stats.add_round(round_event)
                stats.decode_s += cost
                self._rounds_done = r + 1
        finally:
            self._rounds_done = None
        stop = "cancelled" if cancelled else "eos" if pos >= len(tokens) else "max_tokens"
        assert stats.decode_tokens == len(emitted_ids) - (1 if emitted_ids else 0)  # the rounds' tokens
        made: list[ToolCall | ToolCallError] = []
        if stop == "eos" and calls:
            before = len(emitted_ids)
            made = self._emit_calls(calls, emitted_ids, on_event)
            stats.decode_tokens += len(emitted_ids) - before  # one decoded token per call, outside the rounds
            stop = "tool_calls"
        stats.tokens = len(emitted_ids)
        stats.peak_memory_bytes = PEAK_MEMORY_BYTES
        stats.stop_reason = stop
        stats.drafter_enabled = ctl.drafter_enabled if stats.rounds else settings.drafter_enabled
        done = TurnDone(
            stats,
            "".join(tokens[:pos]),
            tuple(emitted_ids),
            tool_calls=tuple(c for c in made if isinstance(c, ToolCall)),
            tool_errors=tuple(c for c in made if isinstance(c, ToolCallError)),
        )
        self.turns.append(done)
        on_event(done)
        return done

    def _emit_calls(
        self, calls: list[str], emitted_ids: list[int], on_event: Callable
    ) -> list[ToolCall | ToolCallError]:
        """Each scripted call: its tokens (pieces of CALL_PIECE characters with their call_text, drafted and
        accepted by the `accept_pattern`'s turns; or one token without text when not `call_tokens`), then its
        events (as core.decode.tool_calls sends them)."""
        made: list[ToolCall | ToolCallError] = []
        for index, text in enumerate(calls):
            shown = text.replace('<|"|>', '"')
            pieces = [shown[i : i + CALL_PIECE] for i in range(0, len(shown), CALL_PIECE)] if self.call_tokens else [""]
            for i, piece in enumerate(pieces):
                tid = 2000 + len(emitted_ids)
                emitted_ids.append(tid)
                drafted = self.call_tokens and self.accept_pattern[i % len(self.accept_pattern)] > 0
                on_event(TokenEvent(tid, "", from_draft=drafted, round=self._rounds_done or 0, call_text=piece))
            raw = f"<|tool_call>{text}<tool_call|>"
            try:
                name, arguments, arguments_json = parse_call_text(text)
            except Malformed as e:
                made.append(ToolCallError(index, f"{MALFORMED}: {e}", raw))
                on_event(made[-1])
                continue
            call_id = new_call_id()
            on_event(ToolCallStarted(index, call_id, name))
            on_event(ToolCallDelta(index, arguments_json))
            made.append(ToolCall(index, call_id, name, arguments, arguments_json, raw))
            on_event(made[-1])
        return made

    def _fail(self, stats: TurnStats, message: str, on_event: Callable) -> TurnDone:
        stats.stop_reason = "error"
        done = TurnDone(stats, "", (), error=message)
        self.turns.append(done)
        on_event(done)
        return done


def _text_of(message: dict) -> str:
    content = message.get("content") or ""
    if isinstance(content, str):
        return content
    return " ".join(part.get("text", "") for part in content if isinstance(part, dict))


if TYPE_CHECKING:
    from core.engine.contract import ChatEngine

    _: type[ChatEngine] = FakeEngine  # mypy: the fake keeps the real engine's contract


def _count_items(messages: list[dict], kind: str) -> int:
    """The content items of `kind` ("image", "audio") in the messages."""
    return sum(
        1
        for m in messages
        if not isinstance(m.get("content"), str)
        for part in m.get("content") or ()
        if isinstance(part, dict) and part.get("type") == kind
    )
