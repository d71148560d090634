"""What the live panels show, folded from engine events (no Textual here).

During a turn the numbers come from the events themselves (round summaries, push times); when the
turn ends they are replaced by the engine's own TurnStats, which are the authoritative figures.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from core import units
from core.events import PrefillDone, RoundEvent, TurnStats

SPARK_ROUNDS = 30  # one column per round: the side panel has 31 columns inside its border


@dataclass(frozen=True)
class LiveControls:
    """The controls that change a reply while it streams (from the engine's next round); the app's
    session (app.tui.session) holds the one current value."""

    block_size: int | str = "auto"  # core.limits: K in MIN_BLOCK_SIZE..MAX_BLOCK_SIZE, or "auto"
    drafter_enabled: bool = True


@dataclass(frozen=True)
class Tuning:
    """What the panels say about the tuning: the session's live controls (app.tui.session) and what
    the loaded pairing and engine allow."""

    block_size: int | str = "auto"
    drafter_enabled: bool = True
    has_drafter: bool = True  # False: the pairing has no drafter, plain decoding only
    by_server: bool = False  # a remote server fixes the block size (vLLM): the keys do nothing

    @property
    def drafting(self) -> bool:
        """The drafter is there and on."""
        return self.has_drafter and self.drafter_enabled


@dataclass
class LiveStats:
    # what the engine last did with the block size
    last_block_size: int | None = None
    last_auto: bool = False
    # this turn (or the last finished one)
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0  # tokens on screen (the first comes from the prefill, outside any round)
    round_tokens: int = 0  # tokens the rounds emitted (RoundEvent.emitted; TurnStats.decode_tokens)
    rounds: int = 0
    recent_per_round: deque[float] = field(default_factory=lambda: deque(maxlen=SPARK_ROUNDS))
    decode_tps: float | None = None
    prefill_tps: float | None = None
    ttft_s: float | None = None
    peak_memory_bytes: int | None = None
    # live timing (monotonic seconds)
    sent_at: float | None = None
    first_token_at: float | None = None
    dirty: bool = True
    # auto block size: what the engine's controller said about its last choice (RoundEvent.note)
    last_note: str = ""
    context_tokens: int | None = None  # the conversation's tokens in the model's context
    context_length: int | None = None

    def start_turn(self, now: float) -> None:
        self.drafted = self.accepted = self.emitted = self.round_tokens = self.rounds = 0
        self.decode_tps = None
        self.ttft_s = None
        self.sent_at = now
        self.first_token_at = None
        self.dirty = True

    def clear(self) -> None:
        """A new chat: forget the last turn's figures (the settings and what the engine can do stay)."""
        self.start_turn(0.0)
        self.sent_at = None
        self.recent_per_round.clear()
        self.prefill_tps = None
        self.peak_memory_bytes = None
        self.context_tokens = None

    def on_prefill(self, ev: PrefillDone) -> None:
        self.context_tokens = ev.prompt_tokens + 1  # the conversation so far, and the reply's first token
        self.prefill_tps = ev.prefill_tokens / ev.prefill_s if ev.prefill_s > 0 else None
        self.dirty = True

    def on_tokens(self, count: int, first_t: float, last_t: float) -> None:
        if count == 0:
            return
        if self.first_token_at is None:
            self.first_token_at = first_t
            if self.sent_at is not None:
                self.ttft_s = first_t - self.sent_at
        self.emitted += count
        if self.emitted > 1 and last_t > self.first_token_at:
            self.decode_tps = (self.emitted - 1) / (last_t - self.first_token_at)
        self.dirty = True

    def on_round(self, ev: RoundEvent) -> None:
        if ev.auto:
            self.last_note = ev.note
        if self.context_tokens is not None:
            self.context_tokens += ev.emitted
        self.rounds += 1
        self.drafted += ev.drafted
        self.accepted += ev.accepted
        self.round_tokens += ev.emitted
        self.last_block_size = ev.block_size
        self.last_auto = ev.auto
        self.recent_per_round.append(float(ev.emitted))
        self.dirty = True

    def on_done(self, stats: TurnStats) -> None:
        if stats.rounds:
            self.drafted, self.accepted, self.rounds = stats.drafted, stats.accepted, stats.rounds
            self.round_tokens = stats.decode_tokens
            self.decode_tps = stats.decode_tps or None
            self.ttft_s = stats.ttft_s or None
        if stats.prefill_s > 0:
            self.prefill_tps = stats.prefill_tps
        if stats.peak_memory_bytes:
            self.peak_memory_bytes = stats.peak_memory_bytes
        self.dirty = True

    def auto_note(self, tuning: Tuning) -> str | None:
        """Why auto block size chose what it did, in the controller's words, or None when it is not choosing."""
        if tuning.block_size != "auto" or not tuning.drafting:
            return None
        if self.last_block_size is None or not self.last_auto:
            return None
        return self.last_note or None

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def tokens_per_round(self) -> float | None:
        return self.round_tokens / self.rounds if self.rounds else None


def format_bytes(n: int | None) -> str:
    """Memory in binary units; "–" before anything is measured."""
    return units.format_bytes(n, binary=True) if n else "–"
