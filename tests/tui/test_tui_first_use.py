"""Issue 12: what a new user tripped over in the first five minutes (Textual pilot, scripted fake
engine). Each test here failed on the code before its fix."""

from __future__ import annotations

import shutil

import pytest
from pilot import ready, until
from support.fake_engine import FakeEngine, PairingSpec
from textual import events

from app.resources import assets_dir
from app.tui.app import GemmaChatApp

pytestmark = pytest.mark.anyio
SMALL = (80, 24)
LARGE = (120, 40)


@pytest.fixture
def anyio_backend():
    return "asyncio"


def make_app(engine: FakeEngine | None = None, **kwargs) -> tuple[GemmaChatApp, FakeEngine]:
    engine = engine or FakeEngine()
    spec = PairingSpec("fake", "target-dir", "drafter-dir")
    return GemmaChatApp(engine, spec, **kwargs), engine


async def send(pilot, app: GemmaChatApp, text: str) -> None:
    app.chat.prompt.focus()
    app.chat.prompt.text = text
    await pilot.press("enter")


# -- pasting a path to a missing image --------------------------------------------------------------
async def test_paste_with_a_missing_image_path_keeps_the_path_in_the_text(tmp_path):
    shutil.copy(assets_dir() / "images" / "chart.png", tmp_path / "chart.png")
    missing = tmp_path / "gone.png"
    app, _ = make_app()
    async with app.run_test(size=LARGE) as pilot:
        await ready(pilot, app)
        app.chat.prompt.focus()
        app.post_message(events.Paste(f"look at {missing} and {tmp_path / 'chart.png'} please"))
        await until(pilot, lambda: len(app.chat.attachments.query("AttachmentChip")) == 1)
        await until(pilot, lambda: str(missing) in app.chat.prompt.text)
        assert app.chat.prompt.text == f"look at {missing} and please"
        # the file that is there became a chip; the one that is not was left where it was, and said so
        await until(pilot, lambda: any("gone.png" in str(n.message) for n in app._notifications))


# -- Ctrl+Q mid-reply ------------------------------------------------------------------------------
async def test_quit_mid_reply_keeps_the_partial_reply_marked_stopped(tmp_path):
    from app.tui.history import HistoryRecorder
    from core.user.store import Store

    db = tmp_path / "h.db"
    recorder = HistoryRecorder(path=db)
    app, engine = make_app(FakeEngine(step=True), history=recorder)
    async with app.run_test(size=LARGE) as pilot:
        await ready(pilot, app)
        await send(pilot, app, "hello")
        engine.allow(3)
        await until(pilot, lambda: app.chat.reply is not None and app.chat.reply.token_count >= 4)
        partial = app.chat.reply.plain
        await pilot.press("ctrl+q")
    recorder.close()
    with Store(db) as store:
        (chat,) = store.list_chats()
        messages = store.load_chat(chat.id).messages
    assert [m.role for m in messages] == ["user", "assistant"]
    assert messages[1].stopped and messages[1].content.startswith(partial) and partial
    assert messages[1].origins  # its colours too


# -- panel: status while streaming, numbers after Ctrl+N ----------------------------------------------
def panel_text(app) -> str:
    panel = app.chat.panel
    return "\n".join(str(w.render()) for w in (panel.status, panel.tuning, panel.figures))


async def test_panel_says_generating_while_a_reply_streams_and_ctrl_n_clears_the_numbers():
    app, engine = make_app(FakeEngine(step=True))
    async with app.run_test(size=LARGE) as pilot:
        await ready(pilot, app)
        await send(pilot, app, "hello")
        engine.allow(2)
        await until(pilot, lambda: app.chat.reply is not None and app.chat.reply.token_count > 1)
        await pilot.pause(0.5)
        assert "ready" not in str(app.chat.panel.status.render())
        assert "generating" in str(app.chat.panel.status.render())
        engine.allow(1000)
        await until(pilot, lambda: app.chat.reply is None)
        await until(pilot, lambda: "ready" in str(app.chat.panel.status.render()))
        await until(pilot, lambda: "Acceptance  –" not in panel_text(app))
        await pilot.press("ctrl+n")
        await until(pilot, lambda: "Acceptance  –" in panel_text(app))
        assert "Tok/round   –" in panel_text(app) and "Decode      – tok/s" in panel_text(app)
        assert app.chat.panel.spark.data == []


# -- help fits and scrolls ------------------------------------------------------------------------------
@pytest.mark.parametrize("size", [SMALL, LARGE])
async def test_help_shows_its_close_hint_and_scrolls_to_its_end(size):
    from app.tui.screens.help import HelpScreen

    app, _ = make_app()
    async with app.run_test(size=size) as pilot:
        await ready(pilot, app)
        await pilot.press("f1")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen))
        await pilot.pause(0.1)
        screen = app.screen
        footer = screen.query_one("#help-footer")
        box = screen.query_one("#help-box")
        assert box.region.right <= size[0] and box.region.bottom <= size[1]
        assert footer.region.height >= 1 and footer.region.bottom <= box.region.bottom  # the close hint shows
        body = screen.query_one("#help-body")
        notes = screen.query_one("#help-notes")
        await pilot.press("end")
        await until(pilot, lambda: body.scroll_y == body.max_scroll_y)
        await pilot.pause(0.1)
        # the notes' last line (the colour legend) is inside the visible part of the body
        assert notes.region.bottom <= body.region.bottom
        if body.max_scroll_y:
            await pilot.press("home")
            await until(pilot, lambda: body.scroll_y == 0)
            await pilot.press("pagedown")
            await until(pilot, lambda: body.scroll_y > 0)
        await pilot.press("escape")
        await until(pilot, lambda: app.screen is app.chat)


# -- reopened replies: no blank rows, their colours, the same token count --------------------------------
THINKING_REPLY = "Sure.\n<|channel>thought\nThe user greets me; answer briefly.<channel|>Hello there, how can I help?"


async def test_reopened_reply_keeps_colours_and_count_without_blank_rows(tmp_path):
    from app.tui.history import HistoryRecorder, RestoredReply
    from app.tui.widgets.conversation import origin_runs
    from core.user.store import decode_origins, encode_origins

    db = tmp_path / "h.db"
    app, _ = make_app(history=HistoryRecorder(path=db))
    async with app.run_test(size=SMALL) as pilot:
        await ready(pilot, app)
        await send(pilot, app, "hello")
        await until(pilot, lambda: app.chat.last_reply is not None)
        live = app.chat.last_reply
        live_runs = origin_runs(live.tokens.text)
        live_summary = str(live.summary.render())
        chat_id = app.history.current_id()
    app.history.close()
    assert {k for k, _ in live_runs} == {"d", "t"}

    app, _ = make_app(history=HistoryRecorder(path=db))
    async with app.run_test(size=SMALL) as pilot:
        await ready(pilot, app)
        await app.chat.open_chat(chat_id)
        await until(pilot, lambda: list(app.chat.conversation.query(RestoredReply)))
        reply = app.chat.conversation.query_one(RestoredReply)
        await pilot.pause(0.2)
        assert reply.tokens.size.height == reply.tokens.line_count  # no rows reserved below it
        # drafted / own colours as they streamed (runs of one origin merged, as stored)
        assert origin_runs(reply.tokens.text) == decode_origins(encode_origins(live_runs))
        assert str(reply.summary.render()).split(" · ")[0] == live_summary.split(" · ")[0]  # "N tokens"
    app.history.close()


async def test_reply_with_thinking_keeps_its_answer_colours_and_they_are_stored(tmp_path):
    from app.tui.history import HistoryRecorder
    from core.user.store import Store, decode_origins

    db = tmp_path / "h.db"
    engine = FakeEngine(replies=[THINKING_REPLY])
    app, _ = make_app(engine, history=HistoryRecorder(path=db))
    async with app.run_test(size=LARGE) as pilot:
        await ready(pilot, app)
        await send(pilot, app, "hi")
        await until(pilot, lambda: app.chat.last_reply is not None)
        reply = app.chat.last_reply
        assert reply.plain == "Sure.\nHello there, how can I help?"  # the text around the channel
        assert reply.tokens.text.plain == reply.plain
        styles = {str(s.style) for s in reply.tokens.text.spans}
        assert len(styles) == 2  # both origins still coloured (it was plain text before)
    app.history.close()
    with Store(db) as store:
        (summary,) = store.list_chats()
        m = store.load_chat(summary.id).messages[-1]
    assert m.thinking and m.content == "Sure.\nHello there, how can I help?"
    assert decode_origins(m.origins, len(m.content))


# -- the settings dialog fits 80x24, its hints are whole sentences; the demo's vision ---------------------
async def test_settings_fit_80x24_with_buttons_and_whole_hints(tmp_path):
    from app.tui.screens.settings import SettingsScreen

    app, _ = make_app(config=None)
    async with app.run_test(size=SMALL) as pilot:
        await ready(pilot, app)
        app.push_screen(SettingsScreen(tmp_path / "config.toml"))
        await until(pilot, lambda: isinstance(app.screen, SettingsScreen))
        await pilot.pause(0.3)
        save = app.screen.query_one("#settings-save")
        assert 0 < save.region.bottom <= SMALL[1] and save.region.height >= 1
        notes = [str(w.render()) for w in app.screen.query(".form-note")]
        assert notes and not any(n.rstrip().endswith(" can") for n in notes)


def test_models_screen_says_the_demo_takes_images():
    from app.tui.screens.models import COLUMNS, demo_row

    assert str(demo_row().cells[[key for key, _ in COLUMNS].index("vision")]) == "yes"


# -- 80x24: compact panel, F10, a footer that fits ----------------------------------------------------------
async def test_the_compact_panel_says_a_connected_demo_runs_on_a_server():
    """At 80 columns the compact panel named a demo served elsewhere (`--connect`) "DEMO — tiny model", as if
    it ran here; the side panel (wide terminals) said where it runs, and now the compact one does too."""
    from core.engine.contract import PairingSpec as RealSpec
    from core.engine.remote import RemoteEngine
    from core.frontends.server import BackgroundServer, ServerConfig, create_app

    served = FakeEngine()
    served.load(PairingSpec("demo (random weights)", "t", "d", demo=True), lambda e: None).result(timeout=5)
    with BackgroundServer(create_app(served, ServerConfig(model_id="demo-model"))) as url:
        remote = RemoteEngine(url)
        spec = RealSpec(name=f"server at {remote.base}", target=remote.url, drafter=None)
        app = GemmaChatApp(remote, spec)
        async with app.run_test(size=SMALL) as pilot:
            await ready(pilot, app)
            chat = app.chat
            await send(pilot, app, "hello")
            await until(pilot, lambda: "tok/round" in str(chat.compact_panel.render()))
            head = str(chat.compact_panel.render()).splitlines()[0]
            where = url.removeprefix("http://")
            assert head.startswith("DEMO — tiny model") and f"(gemma-chat at {where})" in head, head
        remote.close()
    served.close()


async def test_narrow_terminal_gets_a_compact_panel_f10_hides_it_and_the_footer_fits():
    from app.tui.widgets.key_hints import fit_hints

    app, _ = make_app()
    async with app.run_test(size=SMALL) as pilot:
        await ready(pilot, app)
        chat = app.chat
        assert not chat.panel.display and chat.compact_panel.display
        await send(pilot, app, "hello")
        await until(pilot, lambda: chat.last_reply is not None)
        await until(pilot, lambda: "tok/round" in str(chat.compact_panel.render()))
        assert chat.conversation.region.width >= 78  # the conversation has the whole width
        shown = " ".join(
            f"{h.key} {h.label}" for h in fit_hints(chat.key_hints.hints, chat.key_hints.content_size.width)
        )
        for wanted in ("^O image", "^L chats", "F2 models", "F1 help"):
            assert wanted in shown
        assert len(shown) <= SMALL[0] - 2
        await pilot.press("f10")
        assert not chat.compact_panel.display and not chat.panel.display
        await pilot.press("f10")
        assert chat.compact_panel.display
    app, _ = make_app()
    async with app.run_test(size=LARGE) as pilot:
        await ready(pilot, app)
        assert app.chat.panel.display and not app.chat.compact_panel.display
        await pilot.press("f10")
        assert not app.chat.panel.display
        assert app.chat.prompt.placeholder == "Enter send · Shift+Enter new line · ^O image · F1 help"


# -- auto block size explains itself; the sparkline is scaled to the block size; context use -----------
def test_auto_note_shows_what_the_controller_said():
    # the panel re-derives nothing: it shows the note of the last auto round, as the engine sent it
    from app.tui.live_stats import LiveStats, Tuning
    from core.events import RoundEvent

    auto = Tuning("auto")
    s = LiveStats()
    assert s.auto_note(auto) is None
    s.on_round(RoundEvent(1, 3, 0, 4, True, 1, reason="drafting", note="auto → 4: drafting pays"))
    assert s.auto_note(auto) == "auto → 4: drafting pays"
    s.on_round(RoundEvent(2, 0, 0, 1, True, 1, reason="parked", note="auto → 1: trying again in 11 rounds"))
    assert s.auto_note(auto) == "auto → 1: trying again in 11 rounds"
    s.on_round(RoundEvent(3, 2, 1, 3, False, 2))  # a manual round: no controller, no note
    assert s.auto_note(auto) is None
    s.on_round(RoundEvent(4, 1, 0, 2, True, 1, reason="probe", note="auto → 2: one round to see"))
    assert s.auto_note(auto) == "auto → 2: one round to see"
    assert s.auto_note(Tuning(3)) is None
    assert s.auto_note(Tuning("auto", drafter_enabled=False)) is None


def test_sparkline_is_scaled_to_the_block_size():
    from app.tui.widgets.panel import spark_rows

    # one token per round at block size 4 is a quarter column, not a full one
    assert spark_rows([1.0, 4.0], 2, 1, top=4.0) == ["▂█"]
    assert spark_rows([1.0, 1.0], 2, 1, top=4.0) == ["▂▂"]


async def test_panel_shows_context_use():
    app, _ = make_app(FakeEngine(context_length=4096))
    async with app.run_test(size=LARGE) as pilot:
        await ready(pilot, app)
        await send(pilot, app, "hello")
        await until(pilot, lambda: app.chat.last_reply is not None)
        await until(pilot, lambda: "/ 4,096 tok" in str(app.chat.panel.figures.render()))


async def test_chat_parameters_dialog_fits_80x24():
    from app.tui.screens.chat_params import ChatParamsScreen

    app, _ = make_app()
    async with app.run_test(size=SMALL) as pilot:
        await ready(pilot, app)
        await pilot.press("f9")
        await until(pilot, lambda: isinstance(app.screen, ChatParamsScreen))
        await pilot.pause(0.3)
        save = app.screen.query_one("#params-save")
        assert save.region.height >= 1 and save.region.bottom <= SMALL[1]


# -- regenerate keeps the earlier variants -------------------------------------------------------------
async def test_regenerate_keeps_variants_and_alt_arrows_switch_between_them(tmp_path):
    from app.tui.history import HistoryRecorder
    from core.user.store import Store

    db = tmp_path / "h.db"
    engine = FakeEngine(replies=["First answer here.", "Second, different answer."])
    app, _ = make_app(engine, history=HistoryRecorder(path=db))
    async with app.run_test(size=LARGE) as pilot:
        await ready(pilot, app)
        await send(pilot, app, "hi")
        await until(pilot, lambda: app.chat.last_reply is not None)
        await pilot.press("ctrl+r")
        await until(pilot, lambda: app.chat.last_reply is not None and "Second" in app.chat.last_reply.plain)
        reply = app.chat.last_reply
        assert [v.text for v in reply.variants] == ["First answer here.", "Second, different answer."]
        assert "2/2" in str(reply.header.render())
        await pilot.press("alt+left")
        assert reply.plain == "First answer here." and "1/2" in str(reply.header.render())
        assert reply.tokens.text.plain == "First answer here." and reply.tokens.text.spans  # its colours
        assert app.chat.history[-1] == {"role": "assistant", "content": "First answer here."}
        await pilot.press("ctrl+l")  # (any later turn continues from the variant shown)
        await pilot.press("escape")
    app.history.close()
    with Store(db) as store:
        (summary,) = store.list_chats()
        messages = store.load_chat(summary.id).messages
    assert [m.content for m in messages] == ["hi", "First answer here."]  # the variant shown is the one saved


async def test_regenerate_at_temperature_zero_says_the_variant_is_identical():
    app, _ = make_app(FakeEngine(replies=["Always the same."]))
    async with app.run_test(size=LARGE) as pilot:
        await ready(pilot, app)
        await send(pilot, app, "hi")
        await until(pilot, lambda: app.chat.last_reply is not None)
        await pilot.press("ctrl+r")
        await until(pilot, lambda: app.chat.last_reply is not None and len(app.chat.last_reply.variants) == 2)
        assert "identical: temperature 0" in str(app.chat.last_reply.header.render())
        # App.notify posts a message: the notification is in the list once the app has handled it
        await until(pilot, lambda: any("temperature 0" in str(n.message) for n in app._notifications))
