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
from pilot import until

from app.tui.app import GemmaChatApp
from app.tui.fake_engine import FakeEngine, PairingSpec
from app.tui.history import HistoryRecorder
from app.tui.screens.chat import ChatScreen
from app.tui.screens.chats import ChatListScreen
from app.tui.widgets.conversation import ReplyView, UserMessage
from core.store import Store

SIZE = (110, 34)
pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


def make_app(db, **kwargs) -> GemmaChatApp:
    recorder = HistoryRecorder(path=db)
    return GemmaChatApp(FakeEngine(**kwargs), PairingSpec("fake", "target-dir", "drafter-dir"), history=recorder)


def texts(app) -> list[str]:
    out = []
    for w in app.chat.conversation.children:
        if isinstance(w, UserMessage):
            out.append("U:" + w.message_text)
        elif isinstance(w, ReplyView):
            out.append("A:" + w.plain)
    return out


def messages(app, severity: str | None = None) -> list[str]:
    return [n.message for n in app._notifications if severity is None or n.severity == severity]


async def turn(pilot, text: str) -> None:
    app = pilot.app
    await until(pilot, lambda: app.chat.loaded and not app.chat.generating)
    n = len(app.chat.history)
    app.chat.prompt.focus()
    app.chat.prompt.text = text
    await pilot.press("enter")
    await until(pilot, lambda: len(app.chat.history) == n + 2)


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
