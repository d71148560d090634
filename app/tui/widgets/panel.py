"""The live side panel: pairing, tuning state and speed figures (refreshed at most ~4 Hz)."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Sparkline, Static

from app.tui.live_stats import LiveStats, format_bytes


def _set(widget: Static, text: str) -> None:
    # Static.update lays the screen out again: skip it when nothing changed, and repaint only
    # while the line count stays (the panel has a fixed width, so the height follows the lines)
    old = getattr(widget, "_shown", None)
    if old != text:
        widget._shown = text
        widget.update(text, layout=old is None or old.count("\n") != text.count("\n"))


def _num(value: float | None, fmt: str) -> str:
    return "–" if value is None else format(value, fmt)


class StatsPanel(Vertical):
    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.pairing = Static("", id="panel-pairing", markup=False)
        self.status = Static("", id="panel-status", markup=False)
        self.tuning = Static("", id="panel-tuning", markup=False)
        self.figures = Static("", id="panel-figures", markup=False)
        self.spark = Sparkline([], id="panel-spark")

    def compose(self) -> ComposeResult:
        yield self.pairing
        yield self.status
        yield self.tuning
        yield self.figures
        yield self.spark

    def show_pairing(self, name: str, demo: bool) -> None:
        t = Text(name, style="bold")
        if demo:
            t.append("\nDEMO — random weights", style="bold reverse #E69F00")
        self.pairing.update(t)

    def show_status(self, text: str) -> None:
        self.status.update(text)

    def show(self, s: LiveStats) -> None:
        if s.block_setting == "auto":
            chose = f" → {s.last_block_size}" if s.last_block_size is not None else ""
            block = f"auto{chose}"
        else:
            block = f"{s.block_setting} (manual)"
        _set(self.tuning,
            f"Drafter     {'none (plain decoding)' if not s.has_drafter else 'on' if s.drafter_enabled else 'off'}\n"
            f"Block size  {block}"
        )
        acc = None if s.acceptance is None else s.acceptance * 100
        _set(self.figures,
            f"Acceptance  {_num(acc, '.0f')}{'' if acc is None else ' %'}\n"
            f"Tok/round   {_num(s.tokens_per_round, '.2f')}\n"
            f"Decode      {_num(s.decode_tps, '.1f')} tok/s\n"
            f"Prefill     {_num(s.prefill_tps, '.0f')} tok/s\n"
            f"TTFT        {_num(None if s.ttft_s is None else s.ttft_s * 1000, '.0f')}"
            f"{'' if s.ttft_s is None else ' ms'}\n"
            f"Peak mem    {format_bytes(s.peak_memory_bytes)}\n"
            f"Tok/round, last {len(s.recent_per_round)} rounds:"
        )
        data = list(s.recent_per_round)
        if data != self.spark.data:
            self.spark.data = data
