"""Hostile conditions in the TUI (issue 15): an unusable chat history (damaged, locked, replaced by a
folder) never crashes the app or loses the conversation on screen; messages that could not be saved
are kept and written when the history works again, or put in a recovery file at exit.
Driven through `app.run_test()` with the scripted fake engine."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3

import pytest
from pilot import make_app as shared_make_app
from pilot import texts, turn, until
from support.fake_engine import FakeEngine, PairingSpec

from app.tui.app import GemmaChatApp
from app.tui.history import HistoryRecorder
from app.tui.screens.chat import ChatScreen
from app.tui.screens.chats import ChatListScreen
from core.user.store import Store

SIZE = (110, 34)
pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


def make_app(db, **kwargs) -> GemmaChatApp:
    return shared_make_app(history=HistoryRecorder(path=db), **kwargs)


def messages(app, severity: str | None = None) -> list[str]:
    return [n.message for n in app._notifications if severity is None or n.severity == severity]


async def settle(app) -> None:
    await asyncio.to_thread(app.history.flush)


def damage(db) -> None:
    db.write_bytes(os.urandom(8192))


async def test_chat_list_on_a_damaged_history_keeps_the_app_and_the_chat(tmp_path):
    db = tmp_path / "history.sqlite3"
    damage(db)
    app = make_app(db, replies=["an answer"])
    async with app.run_test(size=SIZE) as pilot:
        await turn(pilot, "hello")
        await settle(app)
        await pilot.press("ctrl+l")
        await until(pilot, lambda: isinstance(app.screen, ChatListScreen) and app.screen.loaded)
        assert "damaged" in (app.screen.error or "")
        await until(pilot, lambda: any("Chat history unavailable" in m for m in messages(app, "error")))
        await pilot.press("escape")
        await until(pilot, lambda: isinstance(app.screen, ChatScreen))
        assert texts(app) == ["U:hello", "A:an answer"]  # the conversation on screen is untouched
        assert any("Your messages are kept" in m for m in messages(app, "error"))
        assert app.is_running


async def test_kept_messages_are_saved_when_the_history_comes_back(tmp_path):
    db = tmp_path / "history.sqlite3"
    damage(db)
    app = make_app(db, replies=["one", "two"])
    async with app.run_test(size=SIZE) as pilot:
        await turn(pilot, "first")
        await settle(app)
        assert app.history.failed and len(app.history.backlog) == 2
        db.rename(tmp_path / "history.damaged")  # the user moves the damaged file aside
        await turn(pilot, "second")  # the next write brings the store back and writes everything in order
        await settle(app)
        assert not app.history.failed and not app.history.backlog
        await until(pilot, lambda: any("History saved again" in m for m in messages(app)))
    app.history.close()
    with Store(db) as store:
        [summary] = store.list_chats()
        assert [m.content for m in store.load_chat(summary.id).messages] == ["first", "one", "second", "two"]


async def test_a_locked_history_is_retried_on_a_timer(tmp_path, monkeypatch):
    db = tmp_path / "history.sqlite3"
    Store(db).close()
    monkeypatch.setattr(Store, "busy_timeout_s", 0.05)
    monkeypatch.setattr(HistoryRecorder, "RETRY_S", 0.2)
    other = sqlite3.connect(db, isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")  # another process holds the write lock
    app = make_app(db, replies=["answer"])
    try:
        async with app.run_test(size=SIZE) as pilot:
            await turn(pilot, "hello")
            await settle(app)
            assert app.history.failed
            assert any("locked by another program" in m for m in messages(app, "error"))
            await pilot.press("ctrl+l")
            await until(pilot, lambda: isinstance(app.screen, ChatListScreen) and app.screen.loaded)
            assert "locked" in (app.screen.error or "")
            await pilot.press("escape")
            other.execute("ROLLBACK")  # the other program lets go; nobody sends anything
            await until(pilot, lambda: not app.history.failed, timeout=10)
            assert texts(app) == ["U:hello", "A:answer"]
    finally:
        other.close()
    app.history.close()
    with Store(db) as store:
        [summary] = store.list_chats()
        assert [m.content for m in store.load_chat(summary.id).messages] == ["hello", "answer"]


async def test_unsaved_messages_go_to_a_recovery_file_at_exit(tmp_path):
    db = tmp_path / "history.sqlite3"
    db.mkdir()  # the history's path is a folder: nothing can ever be saved there
    app = make_app(db, replies=["kept answer"])
    async with app.run_test(size=SIZE) as pilot:
        await turn(pilot, "kept question")
        await settle(app)
        assert any("is a directory" in m for m in messages(app, "error"))
    recovery = app.history.close()
    assert recovery is not None and recovery.parent == tmp_path
    assert oct(recovery.stat().st_mode & 0o777) == "0o600"
    saved = json.loads(recovery.read_text())["messages"]
    assert [(m["role"], m["content"]) for m in saved] == [("user", "kept question"), ("assistant", "kept answer")]


# --- 7. SIGTERM / SIGHUP ------------------------------------------------------------------------------------
@pytest.mark.parametrize("signame", ["SIGTERM", "SIGHUP"])
async def test_quit_signal_keeps_the_partial_reply_as_stopped(tmp_path, signame):
    import signal

    db = tmp_path / "history.sqlite3"
    app = make_app(db, step=True)
    async with app.run_test(size=SIZE) as pilot:
        engine = app.engine
        await until(pilot, lambda: app.session.loaded)
        app.chat.prompt.text = "go"
        await pilot.press("enter")
        engine.allow(2)
        await until(pilot, lambda: engine.rounds_done == 2 and app.chat.reply is not None and app.chat.reply.plain)
        partial = app.chat.reply.plain
        sig = getattr(signal, signame)
        assert signal.getsignal(sig) is not signal.SIG_DFL, f"{signame} would kill the app (no handler)"
        os.kill(os.getpid(), sig)
        await until(pilot, lambda: app.quit_signal is not None and not app.is_running, timeout=10)
    assert app.quit_signal == signame
    app.history.close()
    with Store(db) as store:
        msgs = store.load_chat(store.list_chats()[0].id).messages
    assert [(m.role, m.stopped) for m in msgs] == [("user", False), ("assistant", True)]
    assert msgs[-1].content.startswith(partial)


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGHUP"])
def test_quit_signal_gives_the_terminal_back(tmp_path, signame):
    """The installed app in tmux, killed by a signal mid-reply: the pane leaves the alternate screen,
    mouse tracking is off, the cursor shows again, and the exit status is 128 + the signal."""
    import signal
    import subprocess
    import time

    from tmux_session import FAKE_UI, Tmux, _ensure_tmux

    env = {
        "TERM": "xterm-256color",
        "GEMMA_CHAT_CONFIG": str(tmp_path / "config.toml"),
        "GEMMA_CHAT_DATA_DIR": str(tmp_path / "data"),
        "GEMMA_CHAT_CACHE_DIR": str(tmp_path / "cache"),
        "HF_HUB_OFFLINE": "1",
        "PATH": os.environ.get("PATH", ""),
    }
    # a shell around the app keeps the pane (and its terminal state) after the app is gone
    t = Tmux(_ensure_tmux(), env, ["sh", "-c", f"'{FAKE_UI} --delay 0.5; echo EXIT=$?; sleep 60'"])
    try:
        t.wait(lambda: "ready" in t.text(), "the fake engine to load", 30)
        t.keys("tell me something", literal=True)
        t.keys("Enter")
        t.wait(lambda: "streaming" in t.text(), "the reply to stream", 10)
        shell = t._run("display-message", "-p", "-t", "chat", "#{pane_pid}").stdout.strip()
        app_pid = int(subprocess.run(["pgrep", "-P", shell], capture_output=True, text=True).stdout.split()[0])
        os.kill(app_pid, getattr(signal, signame))
        t.wait(lambda: "EXIT=" in t.text(), f"the app to exit on {signame}", 15)
        assert f"EXIT={128 + getattr(signal, signame)}" in t.text()
        assert "Traceback" not in t.text()
        time.sleep(0.2)
        flags = t._run(
            "display-message", "-p", "-t", "chat", "#{alternate_on} #{mouse_any_flag} #{cursor_flag}"
        ).stdout.split()
        assert flags == ["0", "0", "1"], f"alternate screen, mouse tracking, cursor: {flags}"
    finally:
        t.kill()
    with Store(tmp_path / "data" / "history.sqlite3") as store:
        msgs = store.load_chat(store.list_chats()[0].id).messages
    assert [(m.role, m.stopped) for m in msgs] == [("user", False), ("assistant", True)]


# --- a long prompt: the panel shows the prefill, not "ready" --------------------------------------------------
async def test_a_long_prefill_is_shown_with_tokens_and_an_estimate(tmp_path):
    app = GemmaChatApp(
        FakeEngine(hold_prefill=True, context_length=1_000_000), PairingSpec("fake", "target-dir", "drafter-dir")
    )
    async with app.run_test(size=SIZE) as pilot:
        engine = app.engine
        await until(pilot, lambda: app.session.loaded)
        app.chat.prompt.text = "short"
        await pilot.press("enter")
        await until(pilot, lambda: "prefill" in app.chat.panel.status_text)
        assert "ETA" not in app.chat.panel.status_text  # no rate measured yet: no guess
        engine.release_prefill()
        await until(pilot, lambda: not app.chat.generating)
        assert app.chat.panel.status_text.startswith("ready")
        app.chat.prompt.text = "word " * 20_000  # a 100 KB paste
        await pilot.press("enter")
        await until(pilot, lambda: "prefill" in app.chat.panel.status_text)
        status = app.chat.panel.status_text
        assert "prefill 20,0" in status and "ETA ~" in status, status
        assert "reading the prompt" in str(app.chat.reply.summary.render())
        engine.prefill_done = 5_000  # the engine reports tokens done: shown with the rate it runs at
        await until(pilot, lambda: "prefill 5,000/20,0" in app.chat.panel.status_text)
        assert "ETA ~" in app.chat.panel.status_text
        engine.release_prefill()
        await until(pilot, lambda: not app.chat.generating)
        assert app.chat.panel.status_text.startswith("ready")
