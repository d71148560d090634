"""Clipboard: OSC 52 sequences and the system copy tools (fake executables on PATH)."""

from __future__ import annotations

import base64
import sys
import time
from pathlib import Path

import pytest

from core.user.clipboard import clipboard_commands, copy_text, osc52, system_copy

TEXT = "héllo\nworld ✓"


def test_osc52_plain():
    seq = osc52(TEXT, tmux=False)
    assert seq == "\x1b]52;c;" + base64.b64encode(TEXT.encode()).decode() + "\x07"
    assert base64.b64decode(seq[len("\x1b]52;c;") : -1]).decode() == TEXT


def test_osc52_tmux_passthrough():
    inner = osc52(TEXT, tmux=False)
    seq = osc52(TEXT, tmux=True)
    assert seq.startswith("\x1bPtmux;\x1b\x1b]52;c;") and seq.endswith("\x07\x1b\\")
    assert seq == "\x1bPtmux;" + inner.replace("\x1b", "\x1b\x1b") + "\x1b\\"


def test_osc52_detects_tmux(monkeypatch):
    monkeypatch.setenv("TMUX", "/tmp/tmux-0/default,1,0")
    assert osc52("x").startswith("\x1bPtmux;")
    monkeypatch.delenv("TMUX")
    assert osc52("x").startswith("\x1b]52;")


@pytest.fixture
def bin_dir(tmp_path) -> Path:
    d = tmp_path / "bin"
    d.mkdir()
    return d


def fake(bin_dir: Path, name: str, body: str) -> Path:
    out = bin_dir.parent / f"{name}.out"
    script = bin_dir / name
    script.write_text(f"#!/bin/sh\nPATH=/usr/bin:/bin\n{body.replace('OUT', str(out))}\n")
    script.chmod(0o755)
    return out


RECORD = 'cat > OUT; echo "$@" > OUT.args'


def env_with(bin_dir: Path, **extra: str) -> dict[str, str]:
    return {"PATH": str(bin_dir), **extra}


@pytest.mark.skipif(sys.platform == "darwin", reason="the X11/Wayland order is for Linux")
def test_order_and_arguments(bin_dir):
    xclip_out = fake(bin_dir, "xclip", RECORD)
    xsel_out = fake(bin_dir, "xsel", RECORD)
    assert [Path(c[0]).name for c in clipboard_commands(env_with(bin_dir))] == []  # no display: nothing usable
    env = env_with(bin_dir, DISPLAY=":0")
    assert [Path(c[0]).name for c in clipboard_commands(env)] == ["xclip", "xsel"]
    assert system_copy(TEXT, env=env)
    assert xclip_out.read_text(encoding="utf-8") == TEXT
    assert Path(str(xclip_out) + ".args").read_text().strip() == "-selection clipboard"
    assert not xsel_out.exists()  # the first tool that worked was the only one run

    wl_out = fake(bin_dir, "wl-copy", RECORD)
    pb_out = fake(bin_dir, "pbcopy", RECORD)
    env = env_with(bin_dir, DISPLAY=":0", WAYLAND_DISPLAY="wayland-0")
    assert [Path(c[0]).name for c in clipboard_commands(env)] == ["pbcopy", "wl-copy", "xclip", "xsel"]
    assert system_copy("second", env=env)
    assert pb_out.read_text() == "second" and not wl_out.exists()


@pytest.mark.skipif(sys.platform == "darwin", reason="the X11/Wayland order is for Linux")
def test_falls_through_failing_and_hanging_tools(bin_dir):
    fake(bin_dir, "wl-copy", "cat > /dev/null; exit 1")  # e.g. no compositor
    fake(bin_dir, "xclip", "exec sleep 5")  # hangs
    xsel_out = fake(bin_dir, "xsel", RECORD)
    env = env_with(bin_dir, DISPLAY=":0", WAYLAND_DISPLAY="wayland-0")
    start = time.monotonic()
    assert system_copy(TEXT, env=env, timeout=0.5)
    assert time.monotonic() - start < 3
    assert xsel_out.read_text(encoding="utf-8") == TEXT


def test_forking_tool_does_not_block(bin_dir):
    # xclip forks a child that keeps serving the selection with the parent's stdout/stderr open
    out = fake(bin_dir, "pbcopy", "cat > OUT; (sleep 1.5 &) ; exit 0")
    start = time.monotonic()
    assert system_copy("x", env=env_with(bin_dir), timeout=3)
    assert time.monotonic() - start < 1.0  # a pipe kept open by the child would hold us for 1.5 s
    assert out.read_text() == "x"


def test_nothing_available(bin_dir):
    assert clipboard_commands(env_with(bin_dir, DISPLAY=":0")) == []
    assert not system_copy("x", env=env_with(bin_dir, DISPLAY=":0"))
    written: list[str] = []
    assert copy_text("x", written.append, env=env_with(bin_dir)) == "osc52"
    assert written == [osc52("x")]
    assert copy_text("x", None, env=env_with(bin_dir)) == ""


def test_copy_text_prefers_system(bin_dir):
    out = fake(bin_dir, "pbcopy", RECORD)
    written: list[str] = []
    assert copy_text("y", written.append, env=env_with(bin_dir)) == "system"
    assert out.read_text() == "y" and written == []
