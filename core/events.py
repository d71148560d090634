"""What the engine tells its listeners. Plain dataclasses: the UI never sees an mx.array.

One chat turn yields, in order:
  Notice*                          what the user should know about the input (a clip was cut)
  PrefillDone                      once, when the prompt is in the cache
  (TokenEvent* RoundEvent)*        per round: the round's emitted tokens, then its summary
  TurnDone                         once, with the turn's statistics (also after cancel or error)

With tools, each TokenEvent is followed by the tool-call events its token completes
(core.decode.tool_calls): ToolCallStarted, ToolCallDelta*, then ToolCall or ToolCallError; a call's
own tokens carry no text. A malformed or unfinished call may end in ToolCallError just before TurnDone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class TokenLogprob:
    """The target's log-probability of an emitted token and its most likely alternatives at that position
    (core.decode.logprobs; only when GenerationSettings.logprobs asks)."""

    logprob: float
    token: bytes  # the token's bytes in the reply text (b"" for a token that leaves none: the end of turn)
    top: tuple[tuple[int, bytes, float], ...] = ()  # (id, its bytes as shown, logprob), most likely first


@dataclass(frozen=True)
class TokenEvent:
    id: int
    text: str  # decoded text delta (UTF-8 safe: may be "" while a multi-byte char is incomplete)
    from_draft: bool | None  # True: drafted and accepted; False: the target's own; None: unknown (remote)
    round: int
    logprob: TokenLogprob | None = None
    # with tools: the token's part of a tool call as the model writes it (its `text` is then ""), with
    # the call markers left out and a `<|"|>` shown as '"' (core.decode.tool_calls.ReplySplitter), so a
    # chat can show a call while it streams, each token in its origin's colour
    call_text: str = ""


@dataclass(frozen=True)
class RoundEvent:
    round: int
    drafted: int  # drafts proposed this round (block_size - 1, or 0 with the drafter off)
    accepted: int  # drafts the target accepted
    block_size: int  # K used this round (drafts + 1)
    auto: bool  # whether auto mode chose K
    emitted: int  # tokens emitted this round (accepted + 1, fewer at a stop)
    # auto mode only (core.decode.autoblock): why the controller chose this K ("drafting", "parked",
    # "probe", "room": the reply's end cut the block), and what it believed, in words for the user
    reason: str = ""
    note: str = ""


@dataclass(frozen=True)
class Notice:
    """Something the user should know about this turn's input, before it runs (e.g. an audio clip
    longer than the model hears was cut). Sent before PrefillDone; listeners may ignore it."""

    text: str


@dataclass(frozen=True)
class PrefillStarted:
    """The prompt is tokenized and running through the target: a long paste can take minutes, and the
    UI says so (with an estimate from the last prefill's rate) instead of "ready". Not an event of the
    turn's stream (that begins with PrefillDone): the engine's `prefilling` attribute, polled by the UI."""

    prompt_tokens: int  # whole prompt length
    prefill_tokens: int  # tokens that will run through the target (cache reuse skips the rest)
    started: float  # time.monotonic() when it began
    # of prefill_tokens, how many have run through the target so far (read from any thread); None: unknown
    done: Callable[[], int] | None = None


@dataclass(frozen=True)
class PrefillDone:
    prompt_tokens: int  # whole prompt length
    prefill_tokens: int  # tokens actually run through the target (cache reuse skips the rest)
    reused_tokens: int
    prefill_s: float


@dataclass
class TurnStats:
    """One turn's figures. Token counts, one definition everywhere (CLI text and JSON, the TUI's
    summaries live and reopened, exports): `tokens` is every token of the reply, the first one
    included (the prefill decides it, outside any round). `decode_tokens` is the rounds' tokens,
    i.e. all but that first one: the rates divide it (decode tok/s over decode_s, which starts at the
    first token; tokens per round over rounds), so it is a rate's numerator, not the reply's length."""

    prompt_tokens: int = 0
    prefill_tokens: int = 0
    reused_tokens: int = 0
    prefill_s: float = 0.0
    ttft_s: float = 0.0  # request start -> first emitted token
    tokens: int = 0  # the reply's tokens, the prefill's first one included
    decode_tokens: int = 0  # the rounds' tokens (tokens - 1 once any token is out)
    decode_s: float = 0.0
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    peak_memory_bytes: int = 0
    # "eos" | "tool_calls" (ended on <|tool_response>) | "max_tokens" | "context_full" | "cancelled" | "error"
    stop_reason: str = ""
    drafter_enabled: bool = True
    block_size_counts: dict[int, int] = field(default_factory=dict)

    def add_round(self, ev: RoundEvent) -> None:
        """Fold one round's summary into the turn's figures (the one place every engine does it)."""
        self.rounds += 1
        self.drafted += ev.drafted
        self.accepted += ev.accepted
        self.decode_tokens += ev.emitted
        self.block_size_counts[ev.block_size] = self.block_size_counts.get(ev.block_size, 0) + 1

    @property
    def prefill_tps(self) -> float:
        return self.prefill_tokens / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def decode_tps(self) -> float:
        return self.decode_tokens / self.decode_s if self.decode_s > 0 else 0.0

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_round(self) -> float:
        return self.decode_tokens / self.rounds if self.rounds else 0.0

    def as_dict(self) -> dict:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d.update(
            prefill_tps=self.prefill_tps,
            decode_tps=self.decode_tps,
            acceptance=self.acceptance,
            tokens_per_round=self.tokens_per_round,
        )
        return d


def reply_tokens(stats: dict) -> int:
    """TurnStats.tokens from a stored TurnStats.as_dict(); stats saved before that field existed had
    only decode_tokens, which leaves out the first token (there is one whenever ttft_s was measured)."""
    if "tokens" in stats:
        return int(stats["tokens"])
    decode = int(stats.get("decode_tokens", 0) or 0)
    return decode + 1 if decode or stats.get("ttft_s") else 0


@dataclass(frozen=True)
class ToolCallStarted:
    """A call's name is complete; its arguments follow as ToolCallDelta."""

    index: int  # the call's place in the reply (0, 1, ...), shared by all of its events
    id: str  # "call_..." (OpenAI's tool_call id; a tool result answers it with tool_call_id)
    name: str


@dataclass(frozen=True)
class ToolCallDelta:
    index: int
    arguments: str  # the next piece of the arguments' JSON text (provisional until ToolCall)


@dataclass(frozen=True)
class ToolCall:
    """A complete, decoded call."""

    index: int
    id: str
    name: str
    arguments: dict[str, Any]
    arguments_json: str  # json.dumps(arguments): what the call's deltas concatenate to
    raw: str  # the model's own text of the call, markers included

    def openai(self) -> dict[str, Any]:
        """As an OpenAI `tool_calls` item (also what `--messages` and the history take back)."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments_json}}


@dataclass(frozen=True)
class ToolCallError:
    """A call that could not be decoded: "the model produced a malformed tool call: ..."."""

    index: int
    message: str
    raw: str  # the model's text of the call, kept whole


@dataclass(frozen=True)
class TurnDone:
    stats: TurnStats
    text: str  # the whole reply (with tools: its content, the calls left out; thinking channels kept)
    token_ids: tuple[int, ...]
    error: str | None = None  # a clear message when stop_reason == "error"
    tool_calls: tuple[ToolCall, ...] = ()  # the reply's decoded calls, in order
    tool_errors: tuple[ToolCallError, ...] = ()  # the calls the model wrote malformed


@dataclass(frozen=True)
class LoadProgress:
    stage: str  # "target" | "drafter" | "vision" | "tokenizer" | "ready"
    fraction: float  # 0..1
    message: str = ""


@dataclass(frozen=True)
class KernelProgress:
    """The CPU kernels of the loaded pairing are being prepared (first run on a machine only; see
    core.engine.kernels). Sent to the load's listener, from a helper thread, after the load: replies work
    meanwhile, uncompiled. `done` ends it; `error` says why the kernels stay uncompiled this session."""

    fraction: float  # 0..1 of the preparation's steps
    done: bool = False
    error: str | None = None
    steps_done: int = 0  # warm-up steps finished (of `steps`; 0 steps: the child is still loading the pairing)
    steps: int = 0
    kernels: int = 0  # kernels the C++ compiler has built so far: moves within a long step, on a busy machine too


ToolEvent = ToolCallStarted | ToolCallDelta | ToolCall | ToolCallError

Event = TokenEvent | RoundEvent | PrefillDone | TurnDone | LoadProgress | KernelProgress | ToolEvent
