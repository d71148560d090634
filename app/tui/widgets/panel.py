"""The live side panel: pairing, tuning state and speed figures (refreshed at most ~2.5 Hz, on a drain tick)."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widget import Widget
from textual.widgets import Static

from app.tui.live_stats import LiveStats, format_bytes
from core.demo import demo_label


def _set(widget: Static, text: str) -> None:
    # Static.update lays the screen out again: skip it when nothing changed, and repaint only
    # while the line count stays (the panel has a fixed width, so the height follows the lines)
    old = getattr(widget, "_shown", None)
    if old != text:
        widget._shown = text
        widget.update(text, layout=old is None or old.count("\n") != text.count("\n"))


def _num(value: float | None, fmt: str) -> str:
    return "–" if value is None else format(value, fmt)


BARS = " ▁▂▃▄▅▆▇█"


def spark_rows(data: list[float], width: int, height: int) -> list[str]:
    """The last `width` values as columns of block characters, `height` rows tall, scaled so the
    largest value fills the column (eighths of a row per step). Empty columns are spaces."""
    data = data[-width:] if width > 0 else []
    top = max(data, default=0.0)
    levels = [round(v / top * height * 8) if top > 0 else 0 for v in data]
    rows = []
    for r in range(height):
        floor = (height - 1 - r) * 8
        rows.append("".join(BARS[min(max(level - floor, 0), 8)] for level in levels))
    return rows


class RoundSparkline(Widget):
    """Tokens emitted per round, most recent on the right, one column per round, drawn as block
    characters (Textual's Sparkline blends a colour per bar: 1.5 ms per repaint against 0.6 ms)."""

    DEFAULT_CSS = "RoundSparkline { height: 3; color: $accent; }"

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._data: list[float] = []

    @property
    def data(self) -> list[float]:
        return self._data

    @data.setter
    def data(self, values: list[float]) -> None:
        self._data = list(values)
        self.refresh()

    def render(self) -> Text:
        return Text("\n".join(spark_rows(self._data, self.content_size.width, self.content_size.height)))


class StatsPanel(Vertical):
    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.pairing = Static("", id="panel-pairing", markup=False)
        self.status = Static("", id="panel-status", markup=False)
        self.tuning = Static("", id="panel-tuning", markup=False)
        self.figures = Static("", id="panel-figures", markup=False)
        self.spark = RoundSparkline(id="panel-spark")

    def compose(self) -> ComposeResult:
        yield self.pairing
        yield self.status
        yield self.tuning
        yield self.figures
        yield self.spark

    def show_pairing(self, name: str, demo: bool) -> None:
        t = Text(name, style="bold")
        if demo:
            t.append("\n" + demo_label(), style="bold reverse #E69F00")
        self.pairing.update(t)

    def show_status(self, text: str) -> None:
        self.status.update(text)

    def show(self, s: LiveStats) -> None:
        if s.block_setting == "auto":
            chose = f" → {s.last_block_size}" if s.last_block_size is not None else ""
            block = f"auto{chose}"
        else:
            block = f"{s.block_setting} (manual)"
        _set(
            self.tuning,
            f"Drafter     {'none (plain decoding)' if not s.has_drafter else 'on' if s.drafter_enabled else 'off'}\n"
            f"Block size  {block}",
        )
        acc = None if s.acceptance is None else s.acceptance * 100
        _set(
            self.figures,
            f"Acceptance  {_num(acc, '.0f')}{'' if acc is None else ' %'}\n"
            f"Tok/round   {_num(s.tokens_per_round, '.2f')}\n"
            f"Decode      {_num(s.decode_tps, '.1f')} tok/s\n"
            f"Prefill     {_num(s.prefill_tps, '.0f')} tok/s\n"
            f"TTFT        {_num(None if s.ttft_s is None else s.ttft_s * 1000, '.0f')}"
            f"{'' if s.ttft_s is None else ' ms'}\n"
            f"Peak mem    {format_bytes(s.peak_memory_bytes)}\n"
            f"Tok/round, last {len(s.recent_per_round)} rounds:",
        )
        data = list(s.recent_per_round)
        if data != self.spark.data:
            self.spark.data = data
