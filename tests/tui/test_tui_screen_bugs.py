"""Issue 23: what the screens got wrong (Textual pilot, scripted fake engine). Each test here failed
on the code before its fix, and reads the screen the way a user does where it can (the rendered
rows, the regions things are drawn in)."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from pilot import make_app, ready, until
from support.fake_engine import FakeEngine
from textual.widgets._toast import Toast

from app.tui.history import HistoryRecorder
from app.tui.widgets.conversation import DRAFT_STYLE
from core.settings import GenerationSettings
from core.user.store import Store

pytestmark = pytest.mark.anyio
SMALL = (80, 24)
LARGE = (120, 40)
WIDE = (110, 34)  # the side panel shows from 100 columns


@pytest.fixture
def anyio_backend():
    return "asyncio"


def screen_rows(app) -> list[str]:
    """The screen as drawn, one string per row."""
    return [strip.text for strip in app.screen._compositor.render_strips()]


def rows_of(app, widget) -> list[str]:
    """What `widget` shows on screen, row by row (its region of the rendered screen)."""
    r = widget.region
    return [row[r.x : r.right].rstrip() for row in screen_rows(app)[r.y : r.bottom]]


async def send(pilot, app, text: str) -> None:
    app.chat.prompt.focus()
    app.chat.prompt.text = text
    await pilot.press("enter")


async def reply_done(pilot, app, count: int = 1) -> None:
    """Wait until `count` replies have finished in this chat."""
    await until(pilot, lambda: len([m for m in app.chat.history if m["role"] == "assistant"]) >= count)
    await pilot.pause(0.05)


# -- the side panel: soft-wrapped lines were cut off -----------------------------------------------


async def test_panel_text_that_wraps_is_shown_whole():
    # A context of 131,072 tokens makes "Context     51 / 131,072 tok (0%)" wider than the panel: it
    # wraps onto a second row. The panel re-laid a text out only when its count of newlines changed,
    # so the last row of the figures (the sparkline's caption) was cut off.
    app = make_app(FakeEngine(context_length=131072))
    async with app.run_test(size=WIDE) as pilot:
        await ready(pilot, app)
        await send(pilot, app, "hello")
        await reply_done(pilot, app)
        figures = app.chat.panel.figures
        await until(pilot, lambda: "131,072" in str(figures.render()))
        await pilot.pause(0.6)  # the panel's next repaint
        shown = "\n".join(rows_of(app, figures))
        assert "131,072 tok" in shown and "(0%)" in shown
        assert "Tok/round, last" in shown  # the caption, below the wrapped line
        assert shown.endswith(":")  # ... whole


# -- the line under a reply after a mid-reply drafter toggle ---------------------------------------


def first_token_of_round(engine: FakeEngine, r: int) -> int:
    """1-based: the prefill's token is 1, then each round's tokens in turn."""
    return 2 + sum(ev.emitted for ev in engine.rounds[:r])


async def rounds(pilot, app, engine: FakeEngine, n: int) -> None:
    target = len(engine.rounds) + n
    engine.allow(n)
    await until(pilot, lambda: len(engine.rounds) == target and app.chat.reply.token_count == len(engine.tokens))


async def test_a_mid_reply_drafter_switch_is_in_the_reply_line_live_saved_and_reopened(tmp_path):
    db = tmp_path / "h.sqlite3"
    settings = GenerationSettings(drafter_enabled=False)
    app = make_app(FakeEngine(step=True), settings=settings, history=HistoryRecorder(path=db))
    engine = app.engine
    async with app.run_test(size=WIDE) as pilot:
        await ready(pilot, app)
        await send(pilot, app, "go")
        await until(pilot, lambda: app.chat.reply is not None)
        await rounds(pilot, app, engine, 3)  # drafter off: plain rounds
        reply = app.chat.reply
        await pilot.press("f8")  # on, mid-reply
        await rounds(pilot, app, engine, 2)
        on_from = first_token_of_round(engine, 3)
        assert engine.rounds[3].drafted > 0 and engine.rounds[2].drafted == 0
        # blue (drafted) tokens only from the first round after the switch on
        drafted = [s.style == DRAFT_STYLE for s in reply.tokens.text.spans]
        assert not any(drafted[: on_from - 1]) and any(drafted[on_from - 1 :])
        engine.allow(1000)
        await reply_done(pilot, app)
        line = str(reply.summary.render())
        assert f"drafter on from token {on_from}" in line and "drafter off" not in line
        await asyncio.to_thread(app.history.flush)
    app.history.close()
    with Store(db) as store:
        chat = store.load_chat(store.list_chats()[0].id)
    saved = chat.messages[1].stats
    from core.user.export import stats_line

    assert f"drafter on from token {on_from}" in stats_line(saved)
    # reopened: the same line under the reply
    app2 = make_app(history=HistoryRecorder(path=db))
    async with app2.run_test(size=WIDE) as pilot:
        await ready(pilot, app2)
        await app2.chat.open_chat(chat.id)
        await pilot.pause(0.1)
        assert f"drafter on from token {on_from}" in str(app2.chat.last_reply.summary.render())
    app2.history.close()


async def test_switching_the_drafter_off_and_on_again_leaves_both_in_the_line():
    app = make_app(FakeEngine(step=True))
    engine = app.engine
    async with app.run_test(size=WIDE) as pilot:
        await ready(pilot, app)
        await send(pilot, app, "go")
        await until(pilot, lambda: app.chat.reply is not None)
        await rounds(pilot, app, engine, 2)
        reply = app.chat.reply
        await pilot.press("f8")  # off
        await rounds(pilot, app, engine, 2)
        await pilot.press("f8")  # on again
        await rounds(pilot, app, engine, 1)
        engine.allow(1000)
        await reply_done(pilot, app)
        off_from, on_from = first_token_of_round(engine, 2), first_token_of_round(engine, 4)
        assert engine.rounds[2].drafted == engine.rounds[3].drafted == 0 < engine.rounds[4].drafted
        line = str(reply.summary.render())
        assert f"drafter off from token {off_from}, on from token {on_from}" in line


# -- notifications over the prompt -----------------------------------------------------------------


@pytest.mark.parametrize("size", [SMALL, LARGE])
async def test_notifications_cover_nothing_being_typed(size):
    app = make_app()
    async with app.run_test(size=size, notifications=True) as pilot:
        await ready(pilot, app)
        app.chat.prompt.focus()
        await pilot.press("h", "i")
        await pilot.press("ctrl+r")  # "Nothing to regenerate yet", while typing
        await until(pilot, lambda: app.screen.query(Toast))
        await pilot.pause(0.1)
        toast = app.screen.query(Toast).first().region
        assert toast.area > 0
        assert not toast.overlaps(app.chat.prompt.region)
        assert not toast.overlaps(app.chat.key_hints.region)


async def test_notifications_leave_the_chat_lists_search_and_keys_alone(tmp_path):
    app = make_app(history=HistoryRecorder(path=tmp_path / "h.sqlite3"))
    async with app.run_test(size=SMALL, notifications=True) as pilot:
        await ready(pilot, app)
        await pilot.press("ctrl+l")
        await until(pilot, lambda: app.screen.query("#chats-help"))
        app.notify("Could not delete: the chat history is locked by another program (database is locked)")
        await until(pilot, lambda: app.screen.query(Toast))
        await pilot.pause(0.1)
        toast = app.screen.query(Toast).first().region
        for name in ("#chats-help", "#chats-search"):
            assert not toast.overlaps(app.screen.query_one(name).region), name
    app.history.close()


# -- a click in the conversation --------------------------------------------------------------------


async def test_typing_after_a_click_in_the_conversation_goes_to_the_prompt():
    app = make_app()
    engine = app.engine
    async with app.run_test(size=WIDE) as pilot:
        await ready(pilot, app)
        await send(pilot, app, "hello")
        await reply_done(pilot, app)
        await pilot.click("#conversation")
        await pilot.press("x", "minus", "y", "space", "a", "d")
        assert app.chat.prompt.text == "x-y ad"  # nothing dropped
        assert app.chat.prompt.has_focus
        # and no plain key acted as a shortcut (`-` changed the block size, `a`/`d` auto and the drafter)
        assert [c.name for c in engine.calls if c.name.startswith("set_")] == []


async def test_keys_typed_fast_after_the_conversation_took_the_focus_all_reach_the_prompt():
    """With the conversation focused (Tab), its plain-key shortcuts act, but once a key is text the keys
    right behind it (typed fast, pasted: on their way before the focus moves) are text too: "What a day"
    keeps its a and d instead of toggling auto and the drafter."""
    from textual import events

    app = make_app()
    engine = app.engine
    async with app.run_test(size=WIDE) as pilot:
        await ready(pilot, app)
        app.chat.conversation.focus()
        await pilot.pause()
        for ch in "What a day":  # all at once, as a terminal delivers them
            app.post_message(events.Key("space" if ch == " " else ch, ch))
        await pilot.pause()
        assert app.chat.prompt.text == "What a day"
        assert [c.name for c in engine.calls if c.name.startswith("set_")] == []
        app.chat.conversation.focus()  # focused again: its shortcuts act again
        await pilot.pause()
        await pilot.press("a")
        assert [c.name for c in engine.calls if c.name.startswith("set_")] != []
        assert app.chat.prompt.text == "What a day"


# -- Up/Down: a global input history ----------------------------------------------------------------


async def test_up_recalls_other_chats_messages_after_this_chats(tmp_path):
    db = tmp_path / "h.sqlite3"
    app = make_app(replies=["one", "two"], history=HistoryRecorder(path=db))
    async with app.run_test(size=WIDE) as pilot:
        await ready(pilot, app)
        await send(pilot, app, "alpha")
        await reply_done(pilot, app)
        await pilot.press("ctrl+n")
        await send(pilot, app, "beta")
        await reply_done(pilot, app)
        app.chat.prompt.focus()
        await pilot.press("up")
        assert app.chat.prompt.text == "beta"  # this chat's first
        await pilot.press("up")
        assert app.chat.prompt.text == "alpha"  # then the other chat's
        await asyncio.to_thread(app.history.flush)
    app.history.close()
    # like a shell's history, it outlives the process
    app2 = make_app(history=HistoryRecorder(path=db))
    async with app2.run_test(size=WIDE) as pilot:
        await ready(pilot, app2)
        await pilot.pause(0.2)
        app2.chat.prompt.focus()
        await pilot.press("up")
        assert app2.chat.prompt.text == "beta"
        await pilot.press("up")
        assert app2.chat.prompt.text == "alpha"
    app2.history.close()


# -- 80 columns ---------------------------------------------------------------------------------------


async def test_the_80_column_footer_keeps_the_drafter_key_and_regenerate():
    app = make_app()
    async with app.run_test(size=SMALL) as pilot:
        await ready(pilot, app)
        footer = screen_rows(app)[-1]
        for wanted in ("F8 drafter", "^R regen", "^O image", "^L chats", "F2 models", "F1 help", "^Q quit"):
            assert wanted in footer, (wanted, footer)


async def test_the_models_table_shows_fit_at_80_columns(tmp_path):
    from app.tui.screens.models import ModelsOptions, ModelsScreen
    from core.hub import fit

    machine = fit.MachineMemory(16 * 10**9, 16 * 10**9, "test machine")
    app = make_app(models_options=ModelsOptions(cache_dir=str(tmp_path), machine=machine))
    async with app.run_test(size=SMALL) as pilot:
        await ready(pilot, app)
        await pilot.press("f2")
        await until(pilot, lambda: isinstance(app.screen, ModelsScreen) and app.screen.loaded_once)
        await pilot.pause(0.2)
        table = rows_of(app, app.screen.table)
        assert "Fit" in table[0] and "Memory" in table[0]
        e2b = next(row for row in table if row.lstrip().startswith("e2b "))
        assert " ok " in f"{e2b} "  # the e2b row's fit, without scrolling sideways


# -- thinking on the demo --------------------------------------------------------------------------


async def test_thinking_on_the_demo_says_it_was_not_trained_for_it():
    app = make_app(demo=True)
    engine = app.engine
    async with app.run_test(size=WIDE) as pilot:
        await ready(pilot, app)
        engine._info = dataclasses.replace(engine.info, supports_thinking=True)  # as the real demo's template
        await pilot.press("f4")
        await pilot.pause(0.1)
        notes = [str(n.message) for n in app._notifications]
        assert any("not trained to think" in n for n in notes), notes
        assert app.chat.settings.thinking


# -- a failed send leaves no empty chat ---------------------------------------------------------------


async def test_a_failed_first_send_leaves_no_empty_chat_in_the_list(tmp_path):
    db = tmp_path / "h.sqlite3"
    # what --connect gets when the server went away: the turn fails with the client's message
    engine = FakeEngine(chat_error="cannot reach the server at http://127.0.0.1:9 (connection refused)")
    app = make_app(engine, history=HistoryRecorder(path=db))
    async with app.run_test(size=WIDE) as pilot:
        await ready(pilot, app)
        await send(pilot, app, "are you there?")
        await until(pilot, lambda: engine.turns and app.chat.reply is None)
        await pilot.pause(0.1)
        assert app.chat.prompt.text == "are you there?"  # given back
        await asyncio.to_thread(app.history.flush)
        with Store(db) as store:
            assert store.list_chats() == []
        # the next send (the server is back) makes the chat, with its messages
        await send(pilot, app, "are you there?")
        await reply_done(pilot, app)
        await asyncio.to_thread(app.history.flush)
    app.history.close()
    with Store(db) as store:
        [summary] = store.list_chats()
        assert summary.message_count == 2


# -- one default pairing, shown the same everywhere -------------------------------------------------


async def test_the_default_pairing_is_the_configs_on_the_models_screen_and_in_models_list(tmp_path, capsys):
    import os

    from app.commands.models import list_pairings
    from app.tui.screens.models import DEMO_KEY, ModelsOptions, ModelsScreen
    from core.hub import fit
    from core.user.config import DEFAULT_CONFIG_TEXT, save_config

    config = save_config({"default_pairing": "demo"}, os.environ["GEMMA_CHAT_CONFIG"])
    assert config.default_pairing == "demo"
    assert 'default_pairing = "e2b"' not in DEFAULT_CONFIG_TEXT  # the template named a third one
    list_pairings()
    listed = capsys.readouterr().out
    starred = [line.split()[0] for line in listed.splitlines() if line.split()[1:2] == ["*"]]
    assert starred == ["demo"], listed
    assert "built" not in listed and "shipped" in listed
    machine = fit.MachineMemory(16 * 10**9, 16 * 10**9, "test machine")
    app = make_app(models_options=ModelsOptions(cache_dir=str(tmp_path), machine=machine))
    async with app.run_test(size=LARGE) as pilot:
        await ready(pilot, app)
        await pilot.press("f2")
        await until(pilot, lambda: isinstance(app.screen, ModelsScreen) and app.screen.loaded_once)
        screen = app.screen
        marked = [r.key for r in screen.rows if str(r.cells[0]).rstrip().endswith("*")]
        assert marked == [DEMO_KEY]
