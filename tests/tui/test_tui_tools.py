"""Tool calls in the chat (issue 26 §3), app.run_test() on the scripted FakeEngine with a real MCP hub:
tests/support/mcp_test_server.py as a stdio server (one hub for the module: a server takes seconds to
start here). The fake's replies write calls as the model does; `{tool_result}` quotes the last result
it was given, so a reply shows that the result reached the model."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from pilot import make_app, ready, until

from app.tui.screens.tools import ToolApprovalScreen, ToolsScreen
from app.tui.widgets.tool_call import ToolCallView
from core.user.mcp_client import McpHub
from core.user.mcp_config import McpServerConfig

SERVER = str(Path(__file__).parents[1] / "support" / "mcp_test_server.py")
ECHO = '<|tool_call>call:echo{text:<|"|>hi there<|"|>}<tool_call|>'
SLOW = "<|tool_call>call:slow{seconds:30}<tool_call|>"
CRASH = "<|tool_call>call:crash{}<tool_call|>"
ANSWER = "Result: {tool_result}"

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


def _wait_ready(hub: McpHub, name: str) -> None:
    deadline = time.monotonic() + 90
    while hub.state(name).status != "ready":
        assert time.monotonic() < deadline and hub.state(name).status != "failed", hub.state(name)
        time.sleep(0.1)


@pytest.fixture(scope="module")
def hub():
    h = McpHub([McpServerConfig("t", command=sys.executable, args=(SERVER,), timeout_s=2.0)], start_timeout_s=60.0)
    h.start()
    _wait_ready(h, "t")
    yield h
    h.close()


def views(app) -> list[ToolCallView]:
    return list(app.chat.conversation.query(ToolCallView))


def replies_text(app) -> list[str]:
    from app.tui.widgets.conversation import ReplyView

    return [w.plain for w in app.chat.conversation.query(ReplyView)]


async def send(pilot, text: str) -> None:
    app = pilot.app
    await ready(pilot, app)
    app.chat.prompt.text = text
    await pilot.press("enter")


async def approval(pilot) -> ToolApprovalScreen:
    await until(pilot, lambda: isinstance(pilot.app.screen, ToolApprovalScreen), timeout=10)
    return pilot.app.screen


async def test_allowed_call_runs_shows_its_result_and_the_model_continues(hub):
    app = make_app(replies=["Checking." + ECHO, ANSWER], tools_hub=hub)
    async with app.run_test(size=(100, 40)) as pilot:
        await send(pilot, "say hi")
        dialog = await approval(pilot)
        assert dialog.tool_name == "echo" and dialog.arguments == {"text": "hi there"}
        await pilot.press("y")
        await until(pilot, lambda: len(replies_text(app)) == 2 and not app.chat.generating, timeout=20)
        [view] = views(app)
        assert view.state_text == "done" and "echo: hi there" in (view.result_text or "")
        assert "echo: hi there" in replies_text(app)[1]  # the model got the result
        roles = [m["role"] for m in app.chat.history]
        assert roles == ["user", "assistant", "assistant", "tool", "assistant"]
        call = app.chat.history[2]["tool_calls"][0]
        assert call["function"]["name"] == "echo" and json.loads(call["function"]["arguments"]) == {"text": "hi there"}
        assert app.chat.history[3]["tool_call_id"] == call["id"]
        [tools] = [t for t in app.engine.tools if t][:1]  # the turn offered the hub's tools
        assert {t["function"]["name"] for t in tools} == {"echo", "add", "slow", "crash"}


async def test_deny_tells_the_model_and_always_stops_asking(hub):
    app = make_app(replies=[ECHO, ANSWER], tools_hub=hub)
    async with app.run_test(size=(100, 40)) as pilot:
        await send(pilot, "one")
        await approval(pilot)
        await pilot.press("n")
        await until(pilot, lambda: len(replies_text(app)) == 2 and not app.chat.generating, timeout=20)
        assert "the user denied this call" in replies_text(app)[1] and views(app)[0].result_text is None
        await send(pilot, "two")
        await approval(pilot)
        await pilot.press("a")  # always for this tool
        await until(pilot, lambda: len(replies_text(app)) == 4 and not app.chat.generating, timeout=20)
        await send(pilot, "three")  # no dialog this time
        await until(pilot, lambda: len(replies_text(app)) == 6 and not app.chat.generating, timeout=20)
        assert not isinstance(app.screen, ToolApprovalScreen)
        assert [v.state_text for v in views(app)] == ["denied: the model is told so", "done", "done"]


async def test_esc_in_the_dialog_stops_without_a_reply(hub):
    app = make_app(replies=[ECHO], tools_hub=hub)  # every reply calls
    async with app.run_test(size=(100, 40)) as pilot:
        await send(pilot, "x")
        await approval(pilot)
        await pilot.press("escape")
        await until(pilot, lambda: not app.chat.tools.active)
        await pilot.pause(0.2)
        assert len(replies_text(app)) == 1 and app.chat.history[-1]["role"] == "tool"
        assert "stopped by the user" in app.chat.history[-1]["content"]
        await send(pilot, "again")  # the chat goes on
        await approval(pilot)


async def test_a_call_past_its_timeout_is_one_line_and_the_chat_goes_on(hub):
    app = make_app(replies=[SLOW, ANSWER], tools_hub=hub)
    async with app.run_test(size=(100, 40)) as pilot:
        await send(pilot, "slow")
        await approval(pilot)
        await pilot.press("y")
        await until(pilot, lambda: len(replies_text(app)) == 2 and not app.chat.generating, timeout=20)
        [view] = views(app)
        assert view.state_text == "t: slow did not answer within 2 s" and view.has_class("-failed")
        assert "did not answer within 2 s" in replies_text(app)[1]


async def test_esc_while_a_call_runs_cancels_it(hub):
    app = make_app(replies=[SLOW, ANSWER], tools_hub=hub)
    async with app.run_test(size=(100, 40)) as pilot:
        await send(pilot, "slow")
        await approval(pilot)
        await pilot.press("y")
        await until(pilot, lambda: views(app) and views(app)[0].state_text.startswith("running"))
        await pilot.press("escape")
        await until(pilot, lambda: not app.chat.tools.active)
        assert "cancelled while running" in views(app)[0].state_text and len(replies_text(app)) == 1


async def test_the_tools_screen_lists_servers_and_turns_one_off(hub):
    app = make_app(tools_hub=hub)
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot, app)
        await pilot.press("f12")
        await until(pilot, lambda: isinstance(app.screen, ToolsScreen))
        row = app.screen.table.get_row_at(0)
        assert row[:2] == ["t", "ready"] and "echo" in row[2]
        await pilot.press("enter")
        await until(pilot, lambda: hub.state("t").status == "off", timeout=10)
        assert app.chat.tools.offered(True) is None  # nothing offered while it is off
        await pilot.press("enter")
        await until(pilot, lambda: hub.state("t").status == "ready", timeout=90)
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, ToolsScreen))


async def test_a_server_that_dies_mid_call_is_one_line_and_the_chat_goes_on(hub):
    app = make_app(replies=[CRASH, ANSWER, "plain text"], tools_hub=hub)
    async with app.run_test(size=(100, 40)) as pilot:
        await send(pilot, "crash")
        await approval(pilot)
        await pilot.press("y")
        await until(pilot, lambda: len(replies_text(app)) == 2 and not app.chat.generating, timeout=20)
        [view] = views(app)
        assert view.state_text.startswith("t: crash failed") and "\n" not in view.state_text
        assert hub.state("t").status == "failed"
        await send(pilot, "still there?")
        await until(pilot, lambda: len(replies_text(app)) == 3 and not app.chat.generating, timeout=20)
        assert replies_text(app)[2] == "plain text"
    hub.set_enabled("t", True)  # for any test after this one
    _wait_ready(hub, "t")


async def test_the_calls_and_results_are_saved_with_the_reply(hub, tmp_path):
    from app.tui.history import HistoryRecorder
    from core.user.store import Store

    db = tmp_path / "history.db"
    recorder = HistoryRecorder(path=db)
    app = make_app(replies=["Checking." + ECHO, ANSWER], tools_hub=hub, history=recorder)
    async with app.run_test(size=(100, 40)) as pilot:
        await send(pilot, "say hi")
        await approval(pilot)
        await pilot.press("y")
        await until(pilot, lambda: len(replies_text(app)) == 2 and not app.chat.generating, timeout=20)
        history = list(app.chat.history)
    recorder.flush()
    recorder.close()
    with Store(db) as store:
        [summary] = store.list_chats()
        messages = store.load_chat(summary.id).engine_messages()
    assert messages == history  # reopened, the model is sent what it saw


async def test_a_reopened_chat_redraws_its_tool_calls(hub, tmp_path):
    """The chat is saved live (an allowed call, then a denied one), then reopened from the history in a
    new app: each call is a ToolCallView again (name, arguments, what happened; the result collapsed
    for the one that ran, none for the denied one), not plain text, and the model is sent the same."""
    from textual.widgets import Collapsible

    from app.tui.history import HistoryRecorder
    from core.user.store import Store

    db = tmp_path / "history.db"
    recorder = HistoryRecorder(path=db)
    add = "<|tool_call>call:add{a:2,b:40}<tool_call|>"
    app = make_app(replies=["Checking." + ECHO, add, ANSWER], tools_hub=hub, history=recorder)
    async with app.run_test(size=(100, 40)) as pilot:
        await send(pilot, "say hi")
        await approval(pilot)
        await pilot.press("y")
        await approval(pilot)
        await pilot.press("n")
        await until(pilot, lambda: len(replies_text(app)) == 3 and not app.chat.generating, timeout=20)
        history = list(app.chat.history)
    recorder.flush()
    recorder.close()
    with Store(db) as store:
        [summary] = store.list_chats()
    again = make_app(replies=["more"], history=HistoryRecorder(path=db))
    async with again.run_test(size=(100, 40)) as pilot:
        await ready(pilot, again)
        await again.chat.open_chat(summary.id)
        await pilot.pause()
        echo, denied = views(again)
        assert (echo.tool_name, echo.arguments, echo.state_text) == ("echo", {"text": "hi there"}, "done")
        assert echo.server == denied.server == "t"  # the server it ran on, saved with the result
        assert "echo: hi there" in (echo.result_text or "")
        [box] = echo.query(Collapsible)
        assert box.collapsed and box.title.startswith("result: ")
        assert (denied.tool_name, denied.arguments) == ("add", {"a": 2, "b": 40})
        assert denied.state_text == "the user denied this call" and denied.result_text is None
        assert not denied.query(Collapsible) and not denied.has_class("-failed")
        # in order: the first reply, its call, the second reply (the denied call), that call, the answer
        order = [type(w).__name__ for w in again.chat.conversation.children if type(w).__name__ != "UserMessage"]
        assert order[-5:] == ["RestoredReply", "ToolCallView", "RestoredReply", "ToolCallView", "RestoredReply"]
        assert "echo: hi there" not in replies_text(again)[0]  # the call is a widget, not the reply's text
        assert again.chat.history == history
        again.history.close()


def _slow_hub(mode: str, *args: str, start_timeout_s: float = 60.0) -> McpHub:
    config = McpServerConfig("slow", command=sys.executable, args=(SERVER, mode, *args))
    h = McpHub([config], start_timeout_s=start_timeout_s)
    h.start()
    return h


def _starting_line(app) -> str | None:
    from textual.widgets import Static

    lines = list(app.chat.conversation.query(".tools-starting").results(Static))
    return str(lines[0].render()) if lines else None


async def test_a_message_sent_while_a_server_starts_waits_for_its_tools():
    """Sent before the server is ready: a "starting MCP servers" line, no turn yet; once it is ready
    the line goes and the turn offers its tools."""
    h = _slow_hub("slow-start", "3")
    try:
        app = make_app(replies=["Hello."], tools_hub=h)
        async with app.run_test(size=(100, 40)) as pilot:
            await send(pilot, "hi")
            await pilot.pause()
            assert h.state("slow").status == "starting"
            assert "starting MCP servers (slow)" in (_starting_line(app) or "")
            assert app.engine.chats == []  # the turn waits
            await until(pilot, lambda: len(replies_text(app)) == 1 and not app.chat.generating, timeout=60)
            assert _starting_line(app) is None
            [tools] = app.engine.tools
            assert {t["function"]["name"] for t in tools or ()} == {"echo", "add", "slow", "crash"}
    finally:
        h.close()


async def test_esc_or_a_server_too_slow_sends_without_its_tools_and_says_so(monkeypatch):
    from app.tui.screens import chat_tools

    h = _slow_hub("hang")  # never answers initialize: "starting" until the hub's start timeout
    try:
        app = make_app(replies=["One.", "Two."], tools_hub=h)
        async with app.run_test(size=(100, 40)) as pilot:
            await send(pilot, "first")
            await until(pilot, lambda: _starting_line(app) is not None, timeout=10)
            await pilot.press("escape")
            await until(pilot, lambda: len(replies_text(app)) == 1 and not app.chat.generating, timeout=20)
            assert "still starting (sent at once with Esc)" in (_starting_line(app) or "")
            assert app.engine.tools == [None]
            monkeypatch.setattr(chat_tools, "STARTING_WAIT_S", 1.0)
            await send(pilot, "second")
            await until(pilot, lambda: len(replies_text(app)) == 2 and not app.chat.generating, timeout=20)
            shown = [str(w.render()) for w in app.chat.conversation.query(".tools-starting")]
            assert "tools not available yet: slow still starting (waited 1 s)" in shown[-1]
            assert app.engine.tools == [None, None]
    finally:
        h.close()


async def test_a_server_that_fails_while_a_message_waits_is_named_with_why():
    h = _slow_hub("hang", start_timeout_s=4.0)  # fails at the hub's start timeout, within the wait
    try:
        app = make_app(replies=["One."], tools_hub=h)
        async with app.run_test(size=(100, 40)) as pilot:
            await send(pilot, "first")
            await until(pilot, lambda: _starting_line(app) is not None, timeout=10)
            await until(pilot, lambda: len(replies_text(app)) == 1 and not app.chat.generating, timeout=30)
            line = _starting_line(app) or ""
            assert "tools not available yet: slow failed (did not answer within 4 s" in line, line
            assert app.engine.tools == [None]
    finally:
        h.close()
