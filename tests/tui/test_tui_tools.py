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
from support.mcp_test_server import TOOL_NAMES

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


async def answered(pilot, app) -> None:
    """Wait until the model has answered after its call: two replies, nothing generating."""
    await until(pilot, lambda: len(replies_text(app)) == 2 and not app.chat.generating, timeout=20)


async def approval(pilot) -> ToolApprovalScreen:
    """The dialog, once its keys answer (ToolApprovalScreen.ARM_SECONDS after it opens)."""
    await until(pilot, lambda: isinstance(pilot.app.screen, ToolApprovalScreen), timeout=10)
    await until(pilot, lambda: pilot.app.screen.armed, timeout=10)
    return pilot.app.screen


async def test_keys_typed_as_the_dialog_opens_do_not_answer_it(hub, monkeypatch):
    # the dialog opens while the model writes, often mid-word: the "a" of "What's" must not allow the tool
    # for good, nor Enter allow it once; Esc, the safe answer, is taken at once
    monkeypatch.setattr(ToolApprovalScreen, "ARM_SECONDS", 30.0)
    app = make_app(replies=[ECHO, ANSWER], tools_hub=hub)
    async with app.run_test(size=(100, 40)) as pilot:
        await send(pilot, "one")
        await until(pilot, lambda: isinstance(pilot.app.screen, ToolApprovalScreen), timeout=10)
        dialog = app.screen
        for key in ("a", "enter", "y", "n"):
            await pilot.press(key)
        await pilot.pause()
        assert app.screen is dialog and not any(v.result_text for v in views(app))  # still asking, nothing ran
        monkeypatch.setattr(ToolApprovalScreen, "ARM_SECONDS", 0.0)
        await pilot.press("n")
        await answered(pilot, app)
        assert "the user denied this call" in replies_text(app)[1]
    monkeypatch.setattr(ToolApprovalScreen, "ARM_SECONDS", 30.0)
    app = make_app(replies=[ECHO], tools_hub=hub)
    async with app.run_test(size=(100, 40)) as pilot:
        await send(pilot, "x")
        await until(pilot, lambda: isinstance(pilot.app.screen, ToolApprovalScreen), timeout=10)
        await pilot.press("escape")  # taken at once
        await until(pilot, lambda: not app.chat.tools.active)
        assert "stopped by the user" in app.chat.history[-1]["content"]


async def test_allowed_call_runs_shows_its_result_and_the_model_continues(hub):
    app = make_app(replies=["Checking." + ECHO, ANSWER], tools_hub=hub)
    async with app.run_test(size=(100, 40)) as pilot:
        await send(pilot, "say hi")
        dialog = await approval(pilot)
        assert dialog.tool_name == "echo" and dialog.arguments == {"text": "hi there"}
        await pilot.press("y")
        await answered(pilot, app)
        [view] = views(app)
        assert view.state_text == "done" and "echo: hi there" in (view.result_text or "")
        assert "echo: hi there" in replies_text(app)[1]  # the model got the result
        roles = [m["role"] for m in app.chat.history]
        assert roles == ["user", "assistant", "assistant", "tool", "assistant"]
        call = app.chat.history[2]["tool_calls"][0]
        assert call["function"]["name"] == "echo" and json.loads(call["function"]["arguments"]) == {"text": "hi there"}
        assert app.chat.history[3]["tool_call_id"] == call["id"]
        [tools] = [t for t in app.engine.tools if t][:1]  # the turn offered the hub's tools
        assert {t["function"]["name"] for t in tools} == set(TOOL_NAMES)


async def test_deny_tells_the_model_and_always_stops_asking(hub):
    app = make_app(replies=[ECHO, ANSWER], tools_hub=hub)
    async with app.run_test(size=(100, 40)) as pilot:
        await send(pilot, "one")
        await approval(pilot)
        await pilot.press("n")
        await answered(pilot, app)
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
        await answered(pilot, app)
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
        row = [str(cell) for cell in app.screen.table.get_row_at(0)]
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
        await answered(pilot, app)
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
        await answered(pilot, app)
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
        written = [(d.tool_name, d.body.plain, origin_code(d.body), d.state) for d in drafts(app)]
        assert [name for name, *_ in written] == ["echo", "add"]
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
        order = [w for w in again.chat.conversation.children if type(w).__name__ != "UserMessage"]
        names = [type(w).__name__ for w in order[-5:]]
        assert names == ["RestoredReply", "ToolCallView", "RestoredReply", "ToolCallView", "RestoredReply"]
        # each call as it was written, in the same colours as in the live chat, inside its reply (above
        # the reply's summary line, as the live chat shows it)
        assert [(d.tool_name, d.body.plain, origin_code(d.body), d.state) for d in drafts(again)] == written
        for reply, draft in zip((order[-5], order[-3]), drafts(again)):
            assert draft.parent is reply and reply.children.index(draft) < reply.children.index(reply.summary)
        assert all("d" in code and "t" in code for _, _, code, _ in written)
        assert "echo: hi there" not in replies_text(again)[0]  # the call is a widget, not the reply's text
        assert again.chat.history == history
        again.history.close()


def drafts(app) -> list:
    from app.tui.widgets.conversation import CallDraft

    return list(app.chat.conversation.query(CallDraft))


def origin_code(text) -> str:
    """A Text's origin colours as stored ("d9t3d14": characters per run)."""
    from app.tui.widgets.conversation import origin_runs
    from core.user.store import encode_origins

    return encode_origins(origin_runs(text))


def origins(text) -> set[str]:
    """The origin colours a Text's spans carry: "d" drafted + accepted, "t" the target's own."""
    from app.tui.widgets.conversation import origin_runs

    return {kind for kind, _ in origin_runs(text)}


async def test_a_call_shows_in_its_reply_as_written_each_token_in_its_origins_colour(hub):
    """Issue 26 §1/§5: a call's tokens are shown as a call (not as text), with the drafted ones in the
    drafter's colour, and the call box with the approval follows."""
    app = make_app(replies=["Checking." + ECHO, ANSWER], tools_hub=hub)
    async with app.run_test(size=(100, 40)) as pilot:
        await send(pilot, "say hi")
        await approval(pilot)
        [draft] = drafts(app)
        assert draft.body.plain == 'call:echo{text:"hi there"}'
        assert origins(draft.body) == {"d", "t"}  # the fake drafted some of the call's tokens, not all
        assert (draft.tool_name, draft.state, draft.failed) == ("echo", "", False)
        assert "call:echo" not in replies_text(app)[0]  # not in the reply's text
        assert draft.parent is app.chat.conversation.query("ReplyView").first()
        await pilot.press("y")
        await answered(pilot, app)
        assert len(drafts(app)) == 1  # the answer wrote no call


async def test_a_malformed_call_is_shown_with_its_text_saved_reopened_and_exported(hub, tmp_path):
    """Issue 26 §1: "the model produced a malformed tool call" with the raw text kept: in the reply, in
    the history (a reopened chat shows it again) and in the export. Nothing runs, nothing is asked."""
    from app.tui.history import HistoryRecorder
    from core.decode.tool_calls import MALFORMED
    from core.user.export import chat_to_markdown
    from core.user.store import Store

    db = tmp_path / "history.db"
    recorder = HistoryRecorder(path=db)
    bad = "<|tool_call>call:echo{text:}<tool_call|>"
    app = make_app(replies=["Let me see." + bad], tools_hub=hub, history=recorder)
    async with app.run_test(size=(100, 40)) as pilot:
        await send(pilot, "say hi")
        await until(pilot, lambda: not app.chat.generating and bool(drafts(app)), timeout=20)
        [draft] = drafts(app)
        assert draft.failed and draft.has_class("-failed")
        assert draft.state.startswith(f"✗ {MALFORMED}: ") and "a value is missing" in draft.state
        assert draft.body.plain == "call:echo{text:}" and origins(draft.body) == {"d", "t"}
        assert not isinstance(app.screen, ToolApprovalScreen) and not views(app)
        assert replies_text(app) == ["Let me see."]
    recorder.flush()
    recorder.close()
    with Store(db) as store:
        [summary] = store.list_chats()
        chat = store.load_chat(summary.id)
    exported = chat_to_markdown(chat)
    assert f"**Malformed tool call**: {MALFORMED}: " in exported and bad in exported
    again = make_app(replies=["more"], history=HistoryRecorder(path=db))
    async with again.run_test(size=(100, 40)) as pilot:
        await ready(pilot, again)
        await again.chat.open_chat(summary.id)
        await pilot.pause()
        [shown] = drafts(again)
        assert shown.failed and shown.has_class("-failed") and shown.state == draft.state
        assert shown.body.plain == draft.body.plain and origin_code(shown.body) == origin_code(draft.body)
        again.history.close()


async def test_a_reply_saved_before_call_drafts_were_kept_still_shows_its_malformed_call():
    """An older record has TOOL_ERRORS only (no CALL_DRAFTS): the reopened reply shows the malformed call's
    message and the model's raw text."""
    from app.tui.history import restored_call_drafts
    from core.user.store import TOOL_ERRORS

    raw = "<|tool_call>call:echo{text:}<tool_call|>"
    async with make_app().run_test(size=(100, 40)):
        [shown] = restored_call_drafts({TOOL_ERRORS: [{"message": "malformed: a value is missing", "raw": raw}]})
        assert shown.failed and shown.state == "✗ malformed: a value is missing" and shown.body.plain == raw
        assert restored_call_drafts({}) == []


async def test_a_call_from_a_server_without_call_tokens_shows_its_arguments(hub):
    """Over `--connect` a call comes as its events only (no call text per token): the reply still shows
    it, built from the name and the argument JSON, uncoloured (the origin is not known)."""
    app = make_app(replies=["Checking." + ECHO, ANSWER], tools_hub=hub, call_tokens=False)
    async with app.run_test(size=(100, 40)) as pilot:
        await send(pilot, "say hi")
        await approval(pilot)
        [draft] = drafts(app)
        assert draft.body.plain == 'call:echo{"text": "hi there"}'
        assert origins(draft.body) == {"u"} and draft.state == ""


async def test_a_call_draft_says_it_is_being_written_until_its_call_is_decoded():
    """While its tokens stream the call reads "writing…"; a reply that stops inside it says so."""
    from app.tui.widgets.conversation import ReplyView
    from core.events import TokenEvent, ToolCall, ToolCallStarted, TurnDone, TurnStats

    app = make_app()
    async with app.run_test(size=(100, 40)) as pilot:
        await ready(pilot, app)
        reply = ReplyView()
        await app.chat.conversation.mount(reply)
        reply.append_tokens([TokenEvent(1, "Hm.", False, 0), TokenEvent(2, "", True, 0, call_text="call:w{")])
        await pilot.pause()
        [draft] = drafts(app)
        assert draft.state == "writing…" and draft.index is None and draft.body.plain == "call:w{"
        reply.on_tool_event(ToolCallStarted(0, "call_1", "w"))
        reply.append_tokens([TokenEvent(3, "", False, 0, call_text="a:1}")])
        assert (draft.index, draft.tool_name, draft.body.plain) == (0, "w", "call:w{a:1}")
        assert "writing…" in draft.render_text().plain
        reply.on_tool_event(ToolCall(0, "call_1", "w", {"a": 1}, '{"a": 1}', "<|tool_call>call:w{a:1}<tool_call|>"))
        assert draft.state == ""
        # a second call, cut off by a stop before it closed
        reply.append_tokens([TokenEvent(4, "", True, 1, call_text="call:v{b:")])
        reply.finish(TurnDone(TurnStats(stop_reason="cancelled"), "Hm.", (1, 2, 3, 4)))
        await pilot.pause()
        first, second = drafts(app)
        assert first is draft and second.body.plain == "call:v{b:" and second.state == "(not finished)"


def _shown_text(widget) -> str:
    """What a Static puts on the screen, as characters."""
    rendered = widget.render()
    return rendered.plain if hasattr(rendered, "plain") else str(rendered)


async def test_a_hostile_result_is_shown_as_characters_never_as_markup_or_escapes(hub):
    """Nothing from a tool result is executed (issue 26, security): a result holding Rich markup and a
    terminal's escape sequences is shown as plain characters, its ESC as the control picture ␛."""
    hostile = "\x1b[2J\x1b]0;pwned\x07[bold red]loud[/] [@click=app.quit]click[/]"
    call = '<|tool_call>call:say{text:<|"|>' + hostile + '<|"|>}<tool_call|>'
    app = make_app(replies=["Checking." + call, "ok"], tools_hub=hub)
    async with app.run_test(size=(100, 40)) as pilot:
        await send(pilot, "say hi")
        await approval(pilot)
        await pilot.press("y")
        await answered(pilot, app)
        [view] = views(app)
        assert view.state_text == "done" and "\x1b" in (view.result_text or "")  # the server did send it
        result = view.query_one("#tool-result")
        shown = _shown_text(result)
        assert "\x1b" not in shown and "\x07" not in shown and "␛[2J" in shown
        assert "[bold red]loud[/] [@click=app.quit]click[/]" in shown  # the markup as written, not applied


async def test_the_tools_screen_shows_a_servers_tool_names_as_characters():
    """A server names its own tools: a name that is markup (an action on click) or holds escape sequences
    is listed as plain characters."""
    from core.user.mcp_client import McpTool, ServerState

    class Hub:
        def __init__(self) -> None:
            tools = (McpTool("evil", "[@click=app.quit]x[/]", "", {}), McpTool("evil", "a\x1b[31mb", "", {}))
            self.state = ServerState("evil", "evil-server --serve", "failed", error="\x1b]0;t\x07boom", tools=tools)

        def states(self):
            return [self.state]

        def set_enabled(self, name, on):
            pass

    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot, app)
        app.push_screen(ToolsScreen(Hub()))  # type: ignore[arg-type]
        await until(pilot, lambda: isinstance(app.screen, ToolsScreen) and app.screen.table.row_count == 1)
        cells = app.screen.table.get_row_at(0)
        assert [c.plain for c in cells] == ["evil", "failed", "[@click=app.quit]x[/], a␛[31mb"]
        assert not any(span.style and "@click" in str(span.style) for c in cells for span in c.spans)
        detail = _shown_text(app.screen.query_one("#tools-detail"))
        assert detail == "evil-server --serve\n␛]0;t␇boom"


async def test_a_trusted_servers_tools_run_without_asking(monkeypatch):
    """`trusted = true` in config.toml: its calls run at once, with no approval dialog, and the model goes on."""
    asked: list[str] = []
    real_init = ToolApprovalScreen.__init__

    def spy(self, name, server, arguments):
        asked.append(name)
        real_init(self, name, server, arguments)

    monkeypatch.setattr(ToolApprovalScreen, "__init__", spy)
    trusted = McpHub([McpServerConfig("t", command=sys.executable, args=(SERVER,), trusted=True)], start_timeout_s=60.0)
    trusted.start()
    try:
        _wait_ready(trusted, "t")
        app = make_app(replies=["Checking." + ECHO, ANSWER], tools_hub=trusted)
        async with app.run_test(size=(100, 40)) as pilot:
            await send(pilot, "say hi")
            await until(pilot, lambda: len(replies_text(app)) == 2 and not app.chat.generating, timeout=30)
            [view] = views(app)
            assert view.state_text == "done" and "echo: hi there" in (view.result_text or "")
            assert "echo: hi there" in replies_text(app)[1] and asked == []
    finally:
        trusted.close()


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
            assert {t["function"]["name"] for t in tools or ()} == set(TOOL_NAMES)
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
            await answered(pilot, app)
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
