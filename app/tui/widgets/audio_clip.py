"""Audio clips in the chat: what an attached clip is (`AudioInfo`, read by `inspect_audio`), its
one-line waveform, and the rows that show a message's clips in the conversation (`AudioStrip`).

`inspect_audio` decodes the file with core.model.audio_input's reader (the engine's own: a file it
refuses here is refused with the same sentence), at most `DISPLAY_SECONDS` of it, and keeps the
clip's length and a peak per slice of the clip for the waveform. It does blocking I/O: callers run it
in a thread worker. The engine does the model's preprocessing (resampling, the 30 s cut, features).

The waveform is one character per slice, its height the slice's peak on a decibel scale from
-48 dBFS (the lowest block, silence) to 0 dBFS (a full block): a quiet clip still shows its shape,
a silent one is a flat line.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

from core.limits import MAX_UNIFIED_AUDIO_SECONDS
from core.units import format_bytes, format_duration

DISPLAY_SECONDS = MAX_UNIFIED_AUDIO_SECONDS  # the most any pairing hears of a clip; read no more for the picture
PEAKS = 64  # slices of the clip kept for the waveform
WAVE_CHARS = "▁▂▃▄▅▆▇█"
FLOOR_DB = -48.0
WAVE_WIDTH = 32  # the conversation's waveform, in cells (fits 80 columns with a long name)
NAME_WIDTH = 28  # longer file names are shortened in the middle


@dataclass(frozen=True)
class AudioInfo:
    """An attached audio clip, checked: what its chip and the conversation show."""

    path: str
    seconds: float  # the whole clip's length
    sample_rate: int
    size_bytes: int
    peaks: tuple[float, ...] = ()  # |sample| peak per slice of what was read, 0..1

    @property
    def name(self) -> str:
        return Path(self.path).name

    @property
    def duration(self) -> str:
        return format_duration(self.seconds)

    def chip_label(self) -> str:
        return f"♪ {short_name(self.name)} {self.duration}"


def short_name(name: str, width: int = NAME_WIDTH) -> str:
    if len(name) <= width:
        return name
    keep = width - 1
    return name[: keep - keep // 2] + "…" + name[len(name) - keep // 2 :]


def inspect_audio(path: str) -> AudioInfo:
    """Decode an audio file (at most DISPLAY_SECONDS of it) and measure it; raises
    core.model.audio_input.AudioError with the sentence to show (missing, a folder, empty, not audio,
    damaged, NaN samples)."""
    from core.model.audio_input import AudioError, decode_audio

    if not str(path).strip():
        raise AudioError("No audio path given.")
    p = Path(path).expanduser()
    samples, rate, seconds, _label = decode_audio(p, DISPLAY_SECONDS)
    return AudioInfo(str(p), seconds, rate, p.stat().st_size, peaks_of(samples))


def peaks_of(samples: Any, n: int = PEAKS) -> tuple[float, ...]:
    """The |sample| peak of each of `n` equal slices (fewer for a clip shorter than `n` samples)."""
    import numpy as np

    x = np.abs(np.asarray(samples, dtype=np.float32).reshape(-1))
    if x.size == 0:
        return ()
    edges = np.linspace(0, x.size, min(n, x.size) + 1).astype(np.int64)
    return tuple(float(min(1.0, x[a:b].max())) for a, b in zip(edges[:-1], edges[1:], strict=True))


def waveform_text(peaks: tuple[float, ...] | list[float], width: int = WAVE_WIDTH) -> str:
    """One line of `width` block characters (fewer when there are fewer peaks), each slice's loudest
    peak in decibels between FLOOR_DB (▁) and 0 dBFS (█)."""
    if not peaks:
        return ""
    width = min(width, len(peaks))
    out = []
    for i in range(width):
        a, b = i * len(peaks) // width, max((i + 1) * len(peaks) // width, i * len(peaks) // width + 1)
        peak = max(peaks[a:b])
        db = 20 * math.log10(peak) if peak > 0 else FLOOR_DB
        level = (min(0.0, max(FLOOR_DB, db)) - FLOOR_DB) / -FLOOR_DB  # 0..1
        out.append(WAVE_CHARS[min(len(WAVE_CHARS) - 1, int(level * (len(WAVE_CHARS) - 1) + 0.5))])
    return "".join(out)


def clip_line(info: AudioInfo) -> str:
    """'♪ clip.wav · 3.7 s  ▁▃▇█▅▂▁'."""
    return f"♪ {short_name(info.name)} · {info.duration}  {waveform_text(info.peaks)}"


class AudioClipRow(Static):
    """One clip of a user message: name, duration and waveform. Given only a path (a chat reopened
    from the history), it reads the file in a thread worker and says so if it is gone."""

    DEFAULT_CSS = "AudioClipRow { width: 1fr; height: 1; color: $text-muted; }"

    def __init__(self, info: AudioInfo | None = None, path: str | None = None) -> None:
        self.info = info
        self.path = info.path if info is not None else str(path or "")
        first = clip_line(info) if info is not None else f"♪ {short_name(Path(self.path).name)} · reading…"
        super().__init__(first, markup=False, classes="audio-clip")
        self.tooltip = self.path

    def on_mount(self) -> None:
        if self.info is None:
            self.run_worker(self._read, thread=True, group="audio-clip", exit_on_error=False)

    def _read(self) -> None:
        from core.model.audio_input import AudioError

        name = short_name(Path(self.path).name)
        try:
            info: AudioInfo | None = inspect_audio(self.path)
            text = clip_line(info) if info is not None else ""
        except AudioError as e:
            info = None
            text = f"♪ {name} · file missing" if "not found" in str(e) else f"♪ {name} · cannot be read"
        except Exception:  # anything the decoder throws: the row says it, the app goes on
            info, text = None, f"♪ {name} · cannot be read"
        self.app.call_from_thread(self._show, info, text)

    def _show(self, info: AudioInfo | None, text: str) -> None:
        self.info = info
        self.update(text)


class AudioStrip(Vertical):
    """The audio clips of a user message, one row each, shown above its text in the conversation."""

    DEFAULT_CSS = "AudioStrip { height: auto; }"

    def __init__(self, clips: list[AudioInfo] | None = None, paths: list[str] | None = None) -> None:
        super().__init__(classes="user-audio")
        self.clips = list(clips or [])
        self.paths = list(paths or [])

    def compose(self) -> ComposeResult:
        for info in self.clips:
            yield AudioClipRow(info)
        for path in self.paths:
            yield AudioClipRow(path=path)


def describe_audio(info: AudioInfo, no_audio: str | None = None) -> str:
    """Lines for the picker's preview pane: name, length, rate and size, the waveform, and why the
    pairing cannot take it (`no_audio`)."""
    lines = [
        info.name,
        f"audio {info.duration}, {info.sample_rate:,} Hz, {format_bytes(info.size_bytes)}",
        waveform_text(info.peaks, 30),
    ]
    if no_audio:
        lines.append(f"✗ {no_audio}")
    return "\n".join(lines)
