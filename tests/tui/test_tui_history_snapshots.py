"""SVG snapshots of the chat list, the settings screen and the chat parameters dialog.

Deterministic: the chats' times are fixed in the database and shown in UTC, the config file's
location (a tmp path) is replaced by its name. Update with
`pytest tests/tui/test_tui_history_snapshots.py --snapshot-update`, then LOOK at the SVGs.
"""

from __future__ import annotations

import time

import pytest
from pilot import make_app as shared_make_app

from app.tui.app import GemmaChatApp
from app.tui.history import HistoryRecorder
from app.tui.screens.chat_params import ChatParamsScreen
from app.tui.screens.chats import ChatListScreen
from app.tui.screens.settings import SettingsScreen
from core.user.config import load_config
from core.user.store import Store

SIZE = (110, 36)
DAY = 1_780_000_000.0  # 2026-05-28 UTC


@pytest.fixture
def utc(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def seeded_db(path) -> None:
    with Store(path) as store:
        chats = [
            (
                "How does speculative decoding work?",
                "E2B",
                ["How does speculative decoding work?", "A drafter proposes…"],
            ),
            ("Rust lifetimes", "E4B", ["Explain lifetimes in Rust", "A lifetime is…", "And with structs?", "Then…"]),
            ("Packing list", "demo (random weights)", ["What should I pack for a hike?"]),
        ]
        for i, (title, pairing, messages) in enumerate(chats):
            cid = store.create_chat(title, pairing=pairing)
            for j, text in enumerate(messages):
                store.append_message(cid, "user" if j % 2 == 0 else "assistant", text)
            ts = DAY + i * 3600 * 25
            store._con.execute("UPDATE chats SET created_at = ?, updated_at = ? WHERE id = ?", (ts, ts + 60, cid))


def make_app(tmp_path) -> GemmaChatApp:
    db = tmp_path / "h.sqlite3"
    seeded_db(db)
    config_path = tmp_path / "config.toml"
    config_path.write_text("# mine\nblock_size = 4\n\n[sampling]\ntemperature = 0.3\nseed = 5\n")
    config = load_config(config_path)
    return shared_make_app(
        name="E2B", settings=config.generation_settings(), history=HistoryRecorder(path=db), config=config, blink=False
    )


def _no_blink(screen) -> None:
    """A blinking cursor would make the shots depend on timing."""
    from textual.widgets import Input, TextArea

    for widget in screen.query(Input):
        widget.cursor_blink = False
    for widget in screen.query(TextArea):
        widget.cursor_blink = False


async def _until(pilot, predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await pilot.pause(0.02)


def test_chat_list(snap_compare, tmp_path, utc):
    async def run_before(pilot):
        await _until(pilot, lambda: pilot.app.session.loaded)
        await pilot.press("ctrl+l")
        await _until(pilot, lambda: isinstance(pilot.app.screen, ChatListScreen) and pilot.app.screen.loaded)
        _no_blink(pilot.app.screen)
        await pilot.wait_for_scheduled_animations()
        await pilot.pause(0.2)

    app = make_app(tmp_path)
    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)
    app.history.close()


def test_chat_list_search(snap_compare, tmp_path, utc):
    async def run_before(pilot):
        await _until(pilot, lambda: pilot.app.session.loaded)
        await pilot.press("ctrl+l")
        await _until(pilot, lambda: isinstance(pilot.app.screen, ChatListScreen) and pilot.app.screen.loaded)
        await pilot.press(*"struct")
        await _until(pilot, lambda: pilot.app.screen.loaded and pilot.app.screen.option_list.option_count == 1)
        _no_blink(pilot.app.screen)
        await pilot.wait_for_scheduled_animations()
        await pilot.pause(0.2)

    app = make_app(tmp_path)
    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)
    app.history.close()


def test_settings_screen(snap_compare, tmp_path):
    async def run_before(pilot):
        await _until(pilot, lambda: pilot.app.session.loaded)
        await pilot.press("f3")
        await _until(
            pilot, lambda: isinstance(pilot.app.screen, SettingsScreen) and pilot.app.screen.config is not None
        )
        pilot.app.screen.query_one("#settings-file").update("config.toml")  # the tmp path differs per run
        pilot.app.screen.query_one("#set-top_p").value = "2"
        await pilot.press("ctrl+s")  # a bad value: the message names the field
        screen = pilot.app.screen
        await _until(pilot, lambda: "Top-p" in str(screen.query_one("#settings-error").render()))
        _no_blink(pilot.app.screen)
        await pilot.wait_for_scheduled_animations()
        await pilot.pause(0.3)

    app = make_app(tmp_path)
    assert snap_compare(app, terminal_size=(110, 44), run_before=run_before)
    app.history.close()


def test_chat_params_dialog(snap_compare, tmp_path):
    async def run_before(pilot):
        await _until(pilot, lambda: pilot.app.session.loaded)
        await pilot.press("f9")
        await _until(pilot, lambda: isinstance(pilot.app.screen, ChatParamsScreen))
        _no_blink(pilot.app.screen)
        await pilot.wait_for_scheduled_animations()
        await pilot.pause(0.2)

    app = make_app(tmp_path)
    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)
    app.history.close()


def test_reopened_chat_with_tool_calls(snap_compare, tmp_path, utc):
    """A chat whose reply called get_current_time (allowed, its result saved) and convert_time (denied),
    reopened from the chat list: the calls redraw as in the live chat, the result collapsed."""
    from core.user.store import TOOL_CALLS, TOOL_RESULTS

    db = tmp_path / "h.sqlite3"
    calls = [
        {
            "id": "c1",
            "type": "function",
            "function": {"name": "get_current_time", "arguments": '{"timezone": "Asia/Tokyo"}'},
        },
        {
            "id": "c2",
            "type": "function",
            "function": {
                "name": "convert_time",
                "arguments": '{"source_timezone": "Asia/Tokyo", "time": "21:04", "target_timezone": "Europe/Paris"}',
            },
        },
    ]
    result = '{"timezone": "Asia/Tokyo", "datetime": "2026-05-28T21:04:00+09:00", "is_dst": false}'
    results = [
        {"tool_call_id": "c1", "name": "get_current_time", "content": result, "shown": "done", "server": "time"},
        {
            "tool_call_id": "c2",
            "name": "convert_time",
            "content": '{"error": "denied"}',
            "shown": "the user denied this call",
        },
    ]
    with Store(db) as store:
        cid = store.create_chat("What time is it in Tokyo?", pairing="E2B")
        store.append_message(cid, "user", "What time is it in Tokyo?")
        store.append_message(cid, "assistant", "Let me check.", stats={TOOL_CALLS: calls, TOOL_RESULTS: results})
        store.append_message(cid, "assistant", "It is 21:04 in Tokyo.")
        store._con.execute("UPDATE chats SET created_at = ?, updated_at = ? WHERE id = ?", (DAY, DAY + 60, cid))

    async def run_before(pilot):
        await _until(pilot, lambda: pilot.app.session.loaded)
        await pilot.app.chat.open_chat(cid)
        _no_blink(pilot.app.screen)
        await pilot.wait_for_scheduled_animations()
        await pilot.pause(0.2)

    app = shared_make_app(name="E2B", history=HistoryRecorder(path=db), blink=False)
    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)
    app.history.close()
