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


@dataclass
class LiveStats:
    # the user's setting and what the engine last did with it
    block_setting: int | str = "auto"
    drafter_enabled: bool = True
    has_drafter: bool = True  # False: the pairing has no drafter, plain decoding only
    last_block_size: int | None = None
    last_auto: bool = False
    # this turn (or the last finished one)
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0  # tokens on screen (the first comes from the prefill, outside any round)
    round_tokens: int = 0  # tokens the rounds emitted (RoundEvent.emitted; TurnStats.decode_tokens)
    rounds: int = 0
    recent_per_round: deque = field(default_factory=lambda: deque(maxlen=SPARK_ROUNDS))
    decode_tps: float | None = None
    prefill_tps: float | None = None
    ttft_s: float | None = None
    peak_memory_bytes: int | None = None
    # live timing (monotonic seconds)
    sent_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    dirty: bool = True

    def start_turn(self, now: float) -> None:
        self.drafted = self.accepted = self.emitted = self.round_tokens = self.rounds = 0
        self.decode_tps = None
        self.ttft_s = None
        self.sent_at = now
        self.first_token_at = self.last_token_at = None
        self.dirty = True

    def on_prefill(self, ev: PrefillDone) -> None:
        self.prefill_tps = ev.prefill_tokens / ev.prefill_s if ev.prefill_s > 0 else None
        self.dirty = True

    def on_tokens(self, count: int, first_t: float, last_t: float) -> None:
        if count == 0:
            return
        if self.first_token_at is None:
            self.first_token_at = first_t
            if self.sent_at is not None:
                self.ttft_s = first_t - self.sent_at
        self.last_token_at = last_t
        self.emitted += count
        if self.emitted > 1 and last_t > self.first_token_at:
            self.decode_tps = (self.emitted - 1) / (last_t - self.first_token_at)
        self.dirty = True

    def on_round(self, ev: RoundEvent) -> None:
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

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def tokens_per_round(self) -> float | None:
        return self.round_tokens / self.rounds if self.rounds else None


def summary_line(stats: TurnStats, tokens: int | None = None) -> str:
    """The one-line summary under a finished reply; `tokens` is the whole reply's count (the
    engine's decode_tokens leaves out the first token, which comes from the prefill)."""
    count = stats.decode_tokens if tokens is None else tokens
    parts = [f"{count} tokens", f"{stats.decode_tps:.1f} tok/s"]
    if stats.drafted:
        parts.append(f"acceptance {stats.acceptance:.0%}")
    else:
        parts.append("drafter off" if not stats.drafter_enabled else "no drafts")
    parts.append(f"{stats.tokens_per_round:.2f} tok/round")
    return " · ".join(parts)


def format_bytes(n: int | None) -> str:
    """Memory in binary units; "–" before anything is measured."""
    return units.format_bytes(n, binary=True) if n else "–"
