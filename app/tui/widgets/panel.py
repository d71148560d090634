"""The live side panel: pairing, tuning state and speed figures (refreshed at most ~2.5 Hz, on a drain tick)."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widget import Widget
from textual.widgets import Static

from app.tui.live_stats import LiveStats, Tuning, format_bytes
from core.hub.demo import demo_label, demo_short_label


class PanelText(Static):
    """A panel's block of text, shown only when it changes. Static.update lays the screen out again,
    so a new text only repaints while its height stays: the height the text takes once wrapped at the
    widget's width (a line wider than the panel wraps onto the next row, and a new wrapped row needs
    the layout, or the last rows would be cut off)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, markup=False, **kwargs)
        self.shown: str | None = None

    def show(self, text: str) -> None:
        if text == self.shown:
            return
        self.shown = text
        size = self.content_size
        if not size.width:  # not laid out yet (or hidden): the layout measures it anyway
            self.update(text)
            return
        self.update(text, layout=False)
        if self.get_content_height(size, size, size.width) != size.height:
            self.refresh(layout=True)


def _num(value: float | None, fmt: str) -> str:
    return "–" if value is None else format(value, fmt)


BARS = " ▁▂▃▄▅▆▇█"


def spark_rows(data: list[float], width: int, height: int, top: float | None = None) -> list[str]:
    """The last `width` values as columns of block characters, `height` rows tall, scaled so `top`
    (default: the largest value) fills the column (eighths of a row per step). Empty columns are spaces."""
    data = data[-width:] if width > 0 else []
    top = max(data, default=0.0) if top is None else max(top, max(data, default=0.0))
    levels = [round(v / top * height * 8) if top > 0 else 0 for v in data]
    rows = []
    for r in range(height):
        floor = (height - 1 - r) * 8
        rows.append("".join(BARS[min(max(level - floor, 0), 8)] for level in levels))
    return rows


class RoundSparkline(Widget):
    """Tokens emitted per round, most recent on the right, one column per round, scaled to the block
    size (a full column: every verified token emitted; one row in K: only the target's own), drawn as block
    characters (Textual's Sparkline blends a colour per bar: 1.5 ms per repaint against 0.6 ms)."""

    DEFAULT_CSS = "RoundSparkline { height: 3; color: $accent; }"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._data: list[float] = []
        self.top = 1.0  # the block size: a full column is a round that emitted all it verified

    @property
    def data(self) -> list[float]:
        return self._data

    @data.setter
    def data(self, values: list[float]) -> None:
        self._data = list(values)
        self.refresh()

    def render(self) -> Text:
        rows = spark_rows(self._data, self.content_size.width, self.content_size.height, self.top)
        return Text("\n".join(rows))


def context_text(s: LiveStats) -> str | None:
    if s.context_tokens is None or not s.context_length:
        return None
    return f"{s.context_tokens:,} / {s.context_length:,} tok ({s.context_tokens / s.context_length:.0%})"


def compact_line(s: LiveStats, tuning: Tuning, status: str, name: str = "") -> str:
    """The panel in two or three lines, for terminals too narrow for the side panel."""
    auto = tuning.block_size == "auto"
    block = f"auto → {s.last_block_size}" if auto and s.last_block_size else str(tuning.block_size)
    acc = "–" if s.acceptance is None else f"{s.acceptance * 100:.0f} %"
    parts = [
        status,
        f"block size {block}",
        f"accepted {acc}",
        f"{_num(s.tokens_per_round, '.2f')} tok/round",
        f"{_num(s.decode_tps, '.1f')} tok/s",
    ]
    if not tuning.drafting:
        parts[2] = "drafter " + ("none" if not tuning.has_drafter else "off")
    parts[0] = f"{name} · {status}" if name else status
    head, figures = parts[0], " · ".join(p for p in parts[1:] if p)
    note = s.auto_note(tuning)
    return "\n".join(x for x in (head, figures, note) if x)


class StatsPanel(Vertical):
    def __init__(self, compact: PanelText, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.compact_name = ""
        self.status_text = ""
        self.compact = compact  # the few-line panel (the chat screen shows it when narrow)
        self._last: tuple[LiveStats, Tuning] | None = None
        self.pairing = Static("", id="panel-pairing", markup=False)
        self.status = Static("", id="panel-status", markup=False)
        self.tuning = PanelText("", id="panel-tuning")
        self.auto = PanelText("", id="panel-auto")
        self.figures = PanelText("", id="panel-figures")
        self.spark = RoundSparkline(id="panel-spark")

    def compose(self) -> ComposeResult:
        yield self.pairing
        yield self.status
        yield self.tuning
        yield self.auto
        yield self.figures
        yield self.spark

    def show_pairing(self, name: str, demo: bool, served_by: str | None = None) -> None:
        """served_by: the server of a --connect pairing ("gemma-chat at HOST:PORT"), which `name` ends with."""
        t = Text(name, style="bold")
        if demo:
            t.append("\n" + demo_label(), style="bold reverse #E69F00")
        self.compact_name = name
        if demo:  # the demo's name says less than its label; a served one's says where it runs too
            self.compact_name = demo_short_label() + (f" ({served_by})" if served_by else "")
        self._update_compact()
        self.pairing.update(t)

    def show_status(self, text: str) -> None:
        self.status_text = text
        self.status.update(text)
        self._update_compact()

    def _update_compact(self) -> None:
        if self._last is not None:
            self.compact.show(compact_line(*self._last, self.status_text, self.compact_name))

    def show(self, s: LiveStats, tuning: Tuning) -> None:
        chose = f" → {s.last_block_size}" if s.last_block_size is not None else ""
        if tuning.by_server:
            block = f"server{chose}"
        elif tuning.block_size == "auto":
            block = f"auto{chose}"
        else:
            block = f"{tuning.block_size} (manual)"
        note = s.auto_note(tuning)
        self.auto.show(note or "")
        self.auto.display = bool(note)
        self._last = (s, tuning)
        self._update_compact()
        context = context_text(s)
        drafter = "none (plain decoding)" if not tuning.has_drafter else "on" if tuning.drafter_enabled else "off"
        self.tuning.show(f"Drafter     {drafter}\nBlock size  {block}")
        acc = None if s.acceptance is None else s.acceptance * 100
        self.figures.show(
            f"Acceptance  {_num(acc, '.0f')}{'' if acc is None else ' %'}\n"
            f"Tok/round   {_num(s.tokens_per_round, '.2f')}\n"
            f"Decode      {_num(s.decode_tps, '.1f')} tok/s\n"
            f"Prefill     {_num(s.prefill_tps, '.0f')} tok/s\n"
            f"TTFT        {_num(None if s.ttft_s is None else s.ttft_s * 1000, '.0f')}"
            f"{'' if s.ttft_s is None else ' ms'}\n"
            f"Peak mem    {format_bytes(s.peak_memory_bytes)}\n"
            f"Context     {context or '–'}\n"
            f"Tok/round, last {len(s.recent_per_round)} (1..{max(s.last_block_size or 1, 1)}):",
        )
        data = list(s.recent_per_round)
        top = float(max(s.last_block_size or 1, 1))
        if data != self.spark.data or top != self.spark.top:
            self.spark.top = top
            self.spark.data = data
