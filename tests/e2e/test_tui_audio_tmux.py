"""An audio clip attached in a real terminal (tmux, 80x24, the app on the scripted fake engine):
`/audio PATH` shows the chip with the clip's name and length, a dropped path (a bracketed paste, as a
terminal delivers a dropped file) too, and once sent the conversation shows the clip with its
one-line waveform above the message. tmux must be installed (see tests/tmux_session.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

from tmux_session import _session
from tmux_session import term_env as term_env  # noqa: F401 (a fixture, used by name)

CLIPS = Path(__file__).resolve().parents[1] / "data" / "pack" / "references" / "audio" / "inputs"


def test_a_wav_is_attached_shown_as_a_chip_and_sent_at_80x24(term_env, tmp_path):
    tone, chirp = tmp_path / "tone.wav", tmp_path / "chirp.wav"
    shutil.copy(CLIPS / "sine_1s.pcm16.wav", tone)
    shutil.copy(CLIPS / "chirp_3p7s.pcm16.wav", chirp)
    t = _session(term_env, {}, ["--delay", "0.05"], (80, 24), fake=True)
    try:
        t.wait(lambda: "ready" in t.text(), "the fake engine to load", 30)
        t.keys(f"/audio {tone}", literal=True)
        t.keys("Enter")
        t.wait(lambda: "♪ tone.wav 1.0 s ✕" in t.text(), "the clip's chip", 15)
        # a dropped file arrives as a bracketed paste: its path becomes a chip, the rest is text
        t._run("set-buffer", "-b", "drop", f"{chirp} compare them")
        t._run("paste-buffer", "-p", "-b", "drop", "-t", "chat")
        t.wait(lambda: "♪ chirp.wav 3.7 s ✕" in t.text(), "the dropped clip's chip", 15)
        assert "♪ tone.wav 1.0 s ✕" in t.text() and "compare them" in t.text()
        t.keys("Enter")
        t.wait(lambda: "♪ chirp.wav · 3.7 s" in t.text() and " tok/s · TTFT" in t.text(), "the reply", 30)
        screen = t.text()
        # the reply fills 24 rows: the last clip's line is in view, with its waveform (a steady chirp)
        row = next(line for line in screen.splitlines() if "♪ chirp.wav · 3.7 s" in line)
        assert "▇" * 32 in row
        assert "♪ tone.wav 1.0 s ✕" not in screen  # the chips went with the message
        t.keys("C-q")
        t.wait(lambda: not t.alive(), "Ctrl+Q to quit", 10)
    finally:
        t.kill()
