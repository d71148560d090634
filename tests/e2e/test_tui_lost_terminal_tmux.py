"""A chat app whose terminal goes away ends promptly, whatever it is doing (issue 24 §15), and keeps what the
README promises: the partial reply saved as stopped. The tmux session is killed (the terminal is gone; the
app may or may not get a SIGHUP, depending on what sits between it and the terminal) while the scripted
fake engine holds a phase: the load, a prefill, a streaming reply. The real demo, killed while this
machine's kernels are still being prepared, is in test_tui_cold_kernels_tmux.py."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from tmux_session import FAKE_UI, Tmux, _ensure_tmux

from core.user.store import Store

GONE_WITHIN_S = 5.0


def descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        kids = subprocess.run(["pgrep", "-P", str(todo.pop())], capture_output=True, text=True).stdout.split()
        out += [int(k) for k in kids]
        todo += [int(k) for k in kids]
    return out


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone for our purpose (its parent, tmux's pane, is gone too and init reaps it)
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def kill_terminal_and_wait(t: Tmux) -> tuple[dict[int, str], float]:
    """Kill the tmux server (the terminal goes away); the processes that ran in it (pid: command line), and
    how long until the last of them was gone."""
    pane = int(t._run("display-message", "-p", "-t", "chat", "#{pane_pid}").stdout.strip())
    procs = {p: cmdline(p) for p in [pane, *descendants(pane)]}
    t0 = time.monotonic()
    t.kill()
    while time.monotonic() - t0 < 30 and any(alive(p) for p in procs):
        time.sleep(0.05)
    left = [p for p in procs if alive(p)]
    for p in left:  # do not leave them behind for the rest of the suite
        os.kill(p, 9)
    assert not left, f"still running {time.monotonic() - t0:.1f} s after the terminal went away: {left}"
    return procs, time.monotonic() - t0


def history(data: Path) -> list[tuple[str, str, bool]]:
    db = data / "history.sqlite3"
    if not db.exists():
        return []
    with Store(db) as store:
        return [(m.role, m.content, m.stopped) for c in store.list_chats() for m in store.load_chat(c.id).messages]


@pytest.mark.parametrize(
    ("phase", "flags", "shell"),
    [
        ("loading", ["--hold-load"], True),
        ("prefill", ["--hold-prefill"], True),
        ("streaming", ["--delay", "2"], True),
        ("streaming", ["--delay", "2"], False),
    ],
)
def test_a_lost_terminal_ends_the_app_promptly_and_keeps_the_reply(tmp_path, phase, flags, shell):
    env = {
        "TERM": "xterm-256color",
        "GEMMA_CHAT_CONFIG": str(tmp_path / "config.toml"),
        "GEMMA_CHAT_DATA_DIR": str(tmp_path / "data"),
        "GEMMA_CHAT_CACHE_DIR": str(tmp_path / "cache"),
        "HF_HUB_OFFLINE": "1",
        "PATH": os.environ.get("PATH", ""),
    }
    app = f"{FAKE_UI} {' '.join(flags)}"
    # with `shell`, a shell between the terminal and the app (as `python3 dev.py run` is): it takes the
    # hangup, and the app may never get a SIGHUP of its own
    command = ["sh", "-c", f"'{app}; true'"] if shell else [app]
    t = Tmux(_ensure_tmux(), env, command, (100, 30))
    try:
        if phase == "loading":
            t.wait(lambda: "loading" in t.text(), "the held load", 30)
        else:
            t.wait(lambda: "ready" in t.text(), "the fake engine to load", 30)
        t.keys("tell me something", literal=True)
        t.keys("Enter")
        if phase == "prefill":
            t.wait(lambda: "reading the prompt" in t.text(), "the held prefill", 15)
        elif phase == "streaming":
            t.wait(lambda: "streaming" in t.text() and "Speculative" in t.text(), "the reply to stream", 15)
        _, took = kill_terminal_and_wait(t)
    finally:
        t.kill()
    assert took < GONE_WITHIN_S, f"the app took {took:.1f} s to end after its terminal went away"
    saved = history(tmp_path / "data")
    if phase == "loading":
        assert saved == []  # nothing was sent: nothing to keep
    elif phase == "prefill":
        assert saved == [("user", "tell me something", False), ("assistant", "", True)]
    else:
        assert [(r, s) for r, _, s in saved] == [("user", False), ("assistant", True)]
        assert saved[1][1].startswith("Speculative"), saved
