"""Chat screen behaviour with the scripted fake engine (Textual pilot, headless)."""

from __future__ import annotations

import threading
import time

import pytest
from pilot import make_app as shared_make_app
from pilot import ready, until
from support.fake_engine import FakeEngine, PairingSpec, split_tokens
from textual.command import CommandPalette
from textual.widgets import Input

from app.tui.app import GemmaChatApp
from app.tui.bridge import EventBridge
from app.tui.screens.help import HelpScreen
from app.tui.widgets.conversation import DRAFT_STYLE, TARGET_STYLE, ReplyView, UserMessage, displayable
from core.events import LoadProgress, RoundEvent, TokenEvent

SIZE = (110, 34)
pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


def make_app(engine: FakeEngine | None = None, *, demo: bool = False) -> tuple[GemmaChatApp, FakeEngine]:
    app = shared_make_app(engine, demo=demo)
    return app, app.engine


async def send(pilot, app: GemmaChatApp, text: str) -> None:
    """Put `text` in the prompt and press Enter (typing key by key is covered once, and slow)."""
    app.chat.prompt.focus()
    app.chat.prompt.text = text
    await pilot.press("enter")


def text_of(widget) -> str:
    content = widget.content
    return content if isinstance(content, str) else content.plain


# -- bridge ---------------------------------------------------------------------------------------


def test_bridge_keeps_every_token_in_order_across_threads():
    bridge = EventBridge()
    on_event = bridge.listener(1)
    n = 20000

    def produce():
        for i in range(n):
            on_event(TokenEvent(i, "x", i % 2 == 0, i))

    thread = threading.Thread(target=produce)
    thread.start()
    got = []
    while thread.is_alive() or bridge.pending():
        got.extend(bridge.drain())
    thread.join()
    got.extend(bridge.drain())
    assert [s.event.id for s in got] == list(range(n))
    assert all(s.turn == 1 for s in got)
    assert all(a.t <= b.t for a, b in zip(got, got[1:]))


def test_bridge_coalesces_load_progress_but_not_tokens():
    bridge = EventBridge()
    load, turn = bridge.listener(0), bridge.listener(3)
    load(LoadProgress("target", 0.1))
    load(LoadProgress("target", 0.5))
    load(LoadProgress("drafter", 0.9))
    turn(TokenEvent(1, "a", True, 0))
    turn(TokenEvent(2, "b", False, 0))
    turn(RoundEvent(0, 3, 1, 4, True, 2))
    load(LoadProgress("ready", 1.0))
    events = [s.event for s in bridge.drain()]
    assert events == [
        LoadProgress("drafter", 0.9),
        TokenEvent(1, "a", True, 0),
        TokenEvent(2, "b", False, 0),
        RoundEvent(0, 3, 1, 4, True, 2),
        LoadProgress("ready", 1.0),
    ]
    assert bridge.drain() == []


# -- sending and streaming ------------------------------------------------------------------------


async def test_reply_streams_with_spans_matching_from_draft():
    app, engine = make_app(FakeEngine(step=True))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        await send(pilot, app, "hello there")
        chat = app.chat
        assert chat.prompt.text == ""  # accepted: the prompt clears
        await until(pilot, lambda: chat.reply is not None)
        reply = chat.reply
        engine.allow(1)
        await until(pilot, lambda: reply.token_count == len(engine.tokens) and engine.rounds)
        # mid-stream: the first round is on screen, the turn is not over
        assert reply.streaming and 0 < reply.token_count < len(split_tokens(engine.replies[0]))
        engine.allow(100)
        await until(pilot, lambda: chat.reply is None)
        done = engine.turns[-1]
        assert reply.plain == done.text == engine.replies[0]
        # one span per token, styled by origin, nothing else
        spans = reply.tokens.text.spans
        nonempty = [t for t in engine.tokens if t.text]
        assert len(spans) == len(nonempty)
        offset = 0
        for span, tok in zip(spans, nonempty):
            assert (span.start, span.end) == (offset, offset + len(tok.text))
            assert span.style == (DRAFT_STYLE if tok.from_draft else TARGET_STYLE)
            offset = span.end
        assert {t.from_draft for t in nonempty} == {True, False}
        assert DRAFT_STYLE.underline and not TARGET_STYLE.underline  # the cue besides colour
        assert chat.history == [
            {"role": "user", "content": "hello there"},
            {"role": "assistant", "content": done.text},
        ]
        assert engine.chats[0][0] == [{"role": "user", "content": "hello there"}]
        summary = text_of(reply.summary)
        assert f"{len(done.token_ids)} tokens" in summary
        assert f"acceptance {done.stats.acceptance:.0%}" in summary
        assert f"{done.stats.tokens_per_round:.2f} tokens/round" in summary


async def test_shift_enter_and_ctrl_j_add_newlines_enter_sends():
    app, engine = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        app.chat.prompt.focus()
        await pilot.press("a", "ctrl+j", "b", "shift+enter", "c")
        assert app.chat.prompt.text == "a\nb\nc"
        assert engine.chats == []
        await pilot.press("enter")
        await until(pilot, lambda: engine.chats)
        assert engine.chats[0][0][-1]["content"] == "a\nb\nc"


async def test_a_paste_the_terminal_sends_as_keys_goes_in_as_a_few_edits():
    """Without bracketed paste a terminal sends a paste as keys, one message each. TextArea re-wraps the
    whole line on every edit, so key by key a 36 KB one-line paste took minutes; the keys queued behind
    each other now go in together, newlines included, and the Enter after them sends all of it."""
    from textual import events

    app, engine = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        prompt = app.chat.prompt
        prompt.focus()
        await pilot.pause()
        edits: list[str] = []
        replace = prompt.replace

        def counted(text, *args, **kwargs):
            edits.append(text)
            return replace(text, *args, **kwargs)

        prompt.replace = counted
        text = "word " * 2000 + "\nthe second line: {x} [y] ~!"
        for ch in text:  # as the driver posts them, all at once
            key = "ctrl+j" if ch == "\n" else "space" if ch == " " else ch
            app.post_message(events.Key(key, None if ch == "\n" else ch))
        app.post_message(events.Key("enter", "\r"))
        await until(pilot, lambda: engine.chats, timeout=30)
        assert engine.chats[0][0][-1]["content"] == text
        assert "".join(edits) == text and len(edits) <= 10, len(edits)
        # a key typed alone still goes in at once
        edits.clear()
        await until(pilot, lambda: not app.chat.generating and not prompt.text)
        await pilot.press("h", "i")
        assert prompt.text == "hi" and edits == ["h", "i"]


@pytest.mark.parametrize(
    ("keys", "sent"),
    [
        (["a", "b", "c", "backspace", "d"], "abd"),
        (["x", "y", "ctrl+u", "W", "h", "o"], "Who"),  # the line cleared, then retyped
        (["o", "l", "d", "space", "w", "o", "r", "d", "ctrl+w", "n", "e", "w"], "old new"),
        (["a", "b", "left", "X"], "aXb"),
    ],
)
async def test_editing_keys_queued_among_typed_ones_apply_in_order(keys, sent):
    """Keys that come faster than the app reads them (quick typing, a paste sent as keys, tmux send-keys)
    queue up. An editing key (Backspace, Ctrl+U, Ctrl+W, an arrow) is a binding of the prompt's, which
    Textual runs once the key has bubbled up to the app: after the keys queued behind it had typed, and
    after the Enter had sent the text as it was. Seen in tmux: "C-u 'Who are you?' Enter" sent nothing."""
    from textual import events

    app, engine = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        prompt = app.chat.prompt
        prompt.focus()
        await pilot.pause()
        for key in keys:  # as the driver posts them, all at once
            app.post_message(events.Key(key, " " if key == "space" else key if len(key) == 1 else None))
        app.post_message(events.Key("enter", "\r"))
        await until(pilot, lambda: engine.chats)
        assert engine.chats[0][0][-1]["content"] == sent
        await pilot.pause()
        assert prompt.text == ""  # nothing ran after the Enter


async def test_view_toggle_shows_markdown_with_code_block():
    app, engine = make_app(FakeEngine(step=True))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        await send(pilot, app, "show me code")
        await until(pilot, lambda: app.chat.reply is not None)
        reply = app.chat.reply
        engine.allow(3)
        await until(pilot, lambda: len(engine.rounds) == 3 and reply.token_count == len(engine.tokens))
        assert reply.tokens.display and not reply.markdown.display
        await pilot.press("ctrl+t")
        # rendered while streaming: the Markdown follows the text (at a lower rate)
        await until(pilot, lambda: reply.markdown.source == reply.plain)
        assert app.chat.view_mode == "rendered" and reply.streaming
        assert reply.markdown.display and not reply.tokens.display
        assert not app.chat.legend.display
        before = reply.markdown.source
        engine.allow(3)
        await until(pilot, lambda: len(engine.rounds) == 6 and reply.markdown.source == reply.plain != before)
        engine.allow(1000)
        await until(pilot, lambda: app.chat.reply is None)
        await until(pilot, lambda: reply.markdown.source == reply.plain == engine.replies[0])
        await pilot.pause(0.1)
        fences = reply.markdown.query("MarkdownFence")
        assert len(fences) == 1 and "return a + b" in fences.first().code
        await pilot.press("ctrl+t")
        await pilot.pause()
        assert reply.tokens.display and not reply.markdown.display and app.chat.legend.display


async def test_follows_the_stream_only_at_the_bottom():
    long_reply = "\n".join(f"line {i} of a long reply" for i in range(120))
    app, engine = make_app(FakeEngine(replies=[long_reply], step=True))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        await send(pilot, app, "long")
        conv = app.chat.conversation
        engine.allow(100)
        await until(pilot, lambda: len(engine.rounds) == 100 and app.chat.reply.token_count == len(engine.tokens))
        await pilot.pause(0.1)
        assert conv.max_scroll_y > 0 and conv.scroll_y == conv.max_scroll_y  # following
        conv.scroll_home(animate=False, immediate=True)
        await pilot.pause(0.1)
        assert conv.scroll_y == 0
        engine.allow(20)
        await until(pilot, lambda: len(engine.rounds) == 120 and app.chat.reply.token_count == len(engine.tokens))
        await pilot.pause(0.1)
        assert conv.scroll_y == 0  # the user scrolled up: not yanked back
        conv.scroll_end(animate=False, immediate=True)
        await pilot.pause(0.1)
        engine.allow(1000)
        await until(pilot, lambda: app.chat.reply is None)
        await pilot.pause(0.1)
        assert conv.scroll_y == conv.max_scroll_y  # back at the bottom: following again


# -- control --------------------------------------------------------------------------------------


async def test_escape_stops_and_keeps_partial_reply():
    app, engine = make_app(FakeEngine(step=True))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        await send(pilot, app, "go")
        engine.allow(2)
        await until(
            pilot,
            lambda: (
                app.chat.reply is not None
                and app.chat.reply.token_count == len(engine.tokens) > 0
                and len(engine.rounds) == 2
            ),
        )
        reply = app.chat.reply
        await pilot.press("escape")
        await until(pilot, lambda: app.chat.reply is None)
        assert [c.name for c in engine.calls] == ["cancel"]
        done = engine.turns[-1]
        assert done.stats.stop_reason == "cancelled"
        assert reply.stopped and reply.has_class("-stopped")
        assert "stopped" in text_of(reply.header)
        partial = "".join(t.text for t in engine.tokens)
        assert reply.plain == partial == done.text
        assert 0 < len(partial) < len(engine.replies[0])
        assert app.chat.history[-1] == {"role": "assistant", "content": partial}


async def test_regenerate_replaces_the_last_reply():
    app, engine = make_app(FakeEngine(replies=["first answer", "second answer"]))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        await send(pilot, app, "question")
        await until(pilot, lambda: app.chat.last_reply is not None)
        await pilot.press("ctrl+r")
        await until(pilot, lambda: len(engine.chats) == 2 and app.chat.reply is None)
        await pilot.pause()
        assert engine.chats[1][0] == [{"role": "user", "content": "question"}]
        replies = list(app.chat.conversation.query(ReplyView))
        assert len(replies) == 1 and replies[0].plain == "second answer"
        assert len(app.chat.conversation.query(UserMessage)) == 1
        assert app.chat.history == [
            {"role": "user", "content": "question"},
            {"role": "assistant", "content": "second answer"},
        ]


async def test_failed_send_keeps_the_prompt_text():
    # engine failed to load: nothing is sent, the text stays
    app, engine = make_app(FakeEngine(load_error="no weights here"))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.session.load_error is not None)
        await send(pilot, app, "keep me")
        await pilot.pause(0.1)
        assert app.chat.prompt.text == "keep me"
        assert engine.chats == []
        assert "no weights here" in text_of(app.chat.panel.status)
    # the engine reports an error for the turn: the text comes back, the history forgets it
    app, engine = make_app(FakeEngine(chat_error="out of memory"))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        await send(pilot, app, "try this")
        await until(pilot, lambda: engine.turns and app.chat.reply is None)
        await pilot.pause()
        assert app.chat.prompt.text == "try this"
        assert app.chat.history == []
        assert len(app.chat.conversation.query(UserMessage)) == 0
        assert "out of memory" in text_of(app.chat.conversation.query_one(ReplyView).header)


async def test_what_the_engine_says_about_the_input_shows_as_a_warning():
    # the engine's Notice (a clip cut to what the model hears, a `--connect` server that takes no tools, an
    # image sent to the demo) came to the chat and was dropped: the user never learnt it
    cut = "[bold]clip.wav is 45 s long; the model hears only its first 30 s"
    app, engine = make_app(FakeEngine(replies=["a tone"], notices=(cut,)))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        await send(pilot, app, "what do you hear?")
        await until(pilot, lambda: engine.turns and app.chat.reply is None)
        await pilot.pause()
        warnings = [n for n in app._notifications if n.severity == "warning"]
        assert [n.message for n in warnings] == [cut]  # word for word: a file name is not markup
        assert not warnings[0].markup
        assert "a tone" in app.chat.conversation.query_one(ReplyView).plain  # and the turn went on


async def test_send_while_loading_keeps_the_prompt_text():
    app, engine = make_app(FakeEngine(hold_load=True))
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "early")
        await pilot.pause(0.05)
        assert not app.session.loaded and app.chat.prompt.text == "early" and engine.chats == []
        assert "loading" in text_of(app.chat.panel.status)
        engine.release_load()
        await ready(pilot, app)
        await pilot.press("enter")
        await until(pilot, lambda: app.chat.last_reply is not None)
        assert engine.chats[0][0] == [{"role": "user", "content": "early"}]


# -- tuning keys ----------------------------------------------------------------------------------


async def test_tuning_keys_reach_the_engine_mid_generation():
    app, engine = make_app(FakeEngine(step=True))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        await send(pilot, app, "tune")
        chat = app.chat

        async def rounds(n):
            engine.allow(n)
            target = len(engine.rounds) + n
            await until(pilot, lambda: len(engine.rounds) == target and chat.stats.rounds == target)

        await rounds(2)
        assert engine.rounds[1].auto
        auto_k = engine.rounds[1].block_size
        assert chat.prompt.has_focus and chat.prompt.text == ""
        chat.conversation.focus()  # Tab to it: the plain keys act there
        await pilot.press("plus")
        call = engine.calls[-1]
        assert (call.name, call.arg, call.rounds_done) == ("set_block_size", auto_k + 1, 2)
        await rounds(1)
        assert (engine.rounds[2].block_size, engine.rounds[2].auto) == (auto_k + 1, False)
        await pilot.press("minus", "minus")
        assert [(c.arg, c.rounds_done) for c in engine.calls[-2:]] == [(auto_k, 3), (auto_k - 1, 3)]
        await rounds(1)
        assert engine.rounds[3].block_size == auto_k - 1
        await pilot.press("d")
        assert (engine.calls[-1].name, engine.calls[-1].arg, engine.calls[-1].rounds_done) == (
            "set_drafter_enabled",
            False,
            4,
        )
        await rounds(1)
        assert engine.rounds[4].drafted == 0 and engine.rounds[4].emitted == 1
        await pilot.press("a")
        assert (engine.calls[-1].name, engine.calls[-1].arg) == ("set_block_size", "auto")
        await pilot.press("d")
        await rounds(1)
        assert engine.rounds[5].auto and engine.rounds[5].drafted > 0
        # in the prompt the same keys are text, even while it is empty; the F-keys still act
        chat.prompt.focus()
        n_calls = len(engine.calls)
        await pilot.press("plus", "minus", "a", "d")
        assert chat.prompt.text == "+-ad" and len(engine.calls) == n_calls
        n_calls = len(engine.calls)
        await pilot.press("f6")
        assert len(engine.calls) == n_calls + 1 and engine.calls[-1].name == "set_block_size"
        await pilot.press("f8")
        assert engine.calls[-1].name == "set_drafter_enabled" and engine.calls[-1].arg is False
        assert chat.prompt.text == "+-ad"
        await pilot.press("enter")  # a reply is streaming: not sent, the text stays
        assert chat.prompt.text == "+-ad" and len(engine.chats) == 1
        engine.allow(1000)
        await until(pilot, lambda: chat.reply is None)
        await until(pilot, lambda: "Drafter     off" in text_of(chat.panel.tuning))  # panels refresh at 4 Hz
        tuning = text_of(chat.panel.tuning)
        assert "Drafter     off" in tuning and f"{engine.calls[-2].arg} (manual)" in tuning


async def test_panels_show_the_engine_numbers_and_demo_label():
    app, engine = make_app(demo=True)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        assert "DEMO — tiny model trained on" in text_of(app.chat.panel.pairing)
        await send(pilot, app, "numbers")
        await until(pilot, lambda: app.chat.last_reply is not None)
        stats = engine.turns[-1].stats
        # the panels refresh at 4 Hz
        await until(pilot, lambda: f"Decode      {stats.decode_tps:.1f} tok/s" in text_of(app.chat.panel.figures))
        figures = text_of(app.chat.panel.figures)
        assert f"Acceptance  {stats.acceptance * 100:.0f} %" in figures
        assert f"Tok/round   {stats.tokens_per_round:.2f}" in figures
        assert f"Decode      {stats.decode_tps:.1f} tok/s" in figures
        assert f"Prefill     {stats.prefill_tps:.0f} tok/s" in figures
        assert f"TTFT        {stats.ttft_s * 1000:.0f} ms" in figures
        assert "Peak mem    123.0 MiB" in figures
        assert app.chat.panel.spark.data == [float(r.emitted) for r in engine.rounds]
        assert f"auto → {engine.rounds[-1].block_size}" in text_of(app.chat.panel.tuning)


# -- help, palette, quit --------------------------------------------------------------------------


async def test_help_screen_from_f1_and_question_mark():
    app, engine = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        await pilot.press("f1")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        assert app.screen is app.chat
        app.chat.conversation.focus()
        await pilot.press("question_mark")  # a plain key of the focused conversation
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("q")
        assert app.screen is app.chat
        app.chat.prompt.focus()
        await pilot.press("question_mark", "w", "h", "y", "question_mark")  # in the prompt: just a character
        assert app.chat.prompt.text == "?why?" and app.screen is app.chat


async def test_palette_commands():
    app, engine = make_app(FakeEngine(replies=["one", "two"]))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)

        async def palette(query: str) -> None:
            await pilot.press("ctrl+p")
            assert isinstance(app.screen, CommandPalette)
            app.screen.query_one(Input).value = query  # typing key by key is slow under pilot
            await pilot.pause(0.3)
            await pilot.press("enter")
            await pilot.pause(0.05)

        await palette("drafter")
        assert (engine.calls[-1].name, engine.calls[-1].arg) == ("set_drafter_enabled", False)
        await palette("size +")
        assert (engine.calls[-1].name, engine.calls[-1].arg) == ("set_block_size", 5)
        await send(pilot, app, "q")
        await until(pilot, lambda: app.chat.last_reply is not None)
        await palette("regen")
        await until(pilot, lambda: len(engine.chats) == 2 and app.chat.last_reply is not None)
        assert app.chat.last_reply.plain == "two"
        # what the palette says regenerate does (issue 23 §4: it said "drops the last reply") is what it does
        from core.user.keymap import ACTIONS

        [regen] = [a for a in ACTIONS if a.name == "regenerate"]
        assert regen.palette is not None and "kept" in regen.palette[1] and "drop" not in regen.palette[1]
        assert [v.text for v in app.chat.last_reply.variants] == ["one", "two"]


async def test_quit_mid_generation_is_prompt():
    app, engine = make_app(FakeEngine(step=True))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        await send(pilot, app, "long")
        engine.allow(1)
        await until(pilot, lambda: app.chat.reply is not None and app.chat.reply.token_count > 0)
        start = time.monotonic()
        await pilot.press("ctrl+q")
        await pilot.pause(0.05)
        assert time.monotonic() - start < 1.0
    assert [c.name for c in engine.calls][:2] == ["cancel", "cancel"] or "close" in [c.name for c in engine.calls]
    assert "close" in [c.name for c in engine.calls]
    assert not engine._thread.is_alive()


async def test_plain_keys_type_in_the_prompt_and_act_in_the_focused_conversation():
    app, engine = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        app.chat.prompt.focus()
        await pilot.press("plus", "d", "a", "minus")  # in the prompt, empty or not, every key types
        assert app.chat.prompt.text == "+da-" and engine.calls == []
        # with the conversation focused (Tab) the plain keys act, and the footer says so
        await pilot.press("tab")
        assert app.chat.conversation.has_focus and app.chat.key_hints.focused
        await pilot.press("plus")
        assert [(c.name, c.arg) for c in engine.calls] == [("set_block_size", 5)]
        await pilot.press("d")
        assert (engine.calls[-1].name, engine.calls[-1].arg) == ("set_drafter_enabled", False)
        # any other printable key goes on into the prompt, where the focus returns
        await pilot.press("x")
        assert app.chat.prompt.has_focus and app.chat.prompt.text == "+da-x" and len(engine.calls) == 2
        assert not app.chat.key_hints.focused


# -- the real engine on a factory pairing ---------------------------------------------------------


class RecordingEngine:
    """The real Engine, with every event of every chat kept for comparison with the screen."""

    def __init__(self, engine):
        self._engine = engine
        self.events: list = []

    def chat(self, messages, settings, on_event):
        def record(ev):
            self.events.append(ev)
            on_event(ev)

        return self._engine.chat(messages, settings, record)

    def __getattr__(self, name):
        return getattr(self._engine, name)


async def test_real_engine_send_stream_stop(factory_checkpoints):
    from core.engine.contract import PairingSpec as RealSpec
    from core.engine.local import Engine
    from core.events import TurnDone
    from core.settings import GenerationSettings

    target, drafter = factory_checkpoints.pairing("e-style")
    engine = RecordingEngine(Engine())
    settings = GenerationSettings(max_tokens=24, ignore_eos=True)
    app = shared_make_app(engine, spec=RealSpec("factory e-style", str(target), str(drafter)), settings=settings)
    async with app.run_test(size=SIZE) as pilot:
        chat = app.chat
        await until(pilot, lambda: app.session.loaded or app.session.load_error, timeout=60)
        assert app.session.load_error is None
        await send(pilot, app, "hello")
        await until(pilot, lambda: chat.last_reply is not None, timeout=60)
        reply = chat.last_reply
        tokens = [e for e in engine.events if isinstance(e, TokenEvent) and e.text]
        done = [e for e in engine.events if isinstance(e, TurnDone)][-1]
        assert done.stats.stop_reason == "max_tokens"
        assert reply.plain == done.text and reply.token_count == len(done.token_ids)
        spans = reply.tokens.text.spans
        assert [s.style for s in spans[: len(tokens)]] == [
            DRAFT_STYLE if t.from_draft else TARGET_STYLE for t in tokens
        ]
        streamed = "".join(t.text for t in tokens)
        assert reply.tokens.text.plain.startswith(displayable(streamed)) and done.text.startswith(streamed)
        assert chat.history[-1] == {"role": "assistant", "content": done.text}
        # a long reply, stopped with Esc: the partial text stays, marked
        chat.settings.max_tokens = 4000
        engine.events.clear()
        await send(pilot, app, "more")
        await until(pilot, lambda: chat.reply is not None and chat.reply.token_count >= 4, timeout=60)
        stopping = chat.reply
        await pilot.press("escape")
        await until(pilot, lambda: chat.reply is None, timeout=10)
        done = [e for e in engine.events if isinstance(e, TurnDone)][-1]
        assert done.stats.stop_reason == "cancelled"
        assert stopping.stopped and stopping.plain == done.text and 4 <= stopping.token_count < 4000
        await pilot.press("ctrl+q")


# -- which pairing `gemma-chat` opens -------------------------------------------------------------


def _args(**kw):
    import argparse

    base = dict(demo=False, model=None, drafter=None, pairing=None)
    return argparse.Namespace(**{**base, **kw})


def test_pairing_spec_from_paths_repo_ids_and_errors(tmp_path, monkeypatch):
    import huggingface_hub.constants

    from app.commands import tui

    # the hub reads HF_HUB_CACHE at import time: point its constant at an empty cache
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    target, drafter = tmp_path / "my-target", tmp_path / "my-drafter"
    target.mkdir()
    drafter.mkdir()
    spec, notice = tui.pairing_spec(_args(model=str(target), drafter=str(drafter)))
    assert (spec.name, spec.target, spec.drafter, spec.demo, notice) == (
        "my-target",
        str(target.resolve()),
        str(drafter.resolve()),
        False,
        None,
    )
    spec, _ = tui.pairing_spec(_args(model=str(target)))
    assert spec.drafter is None
    # a repo id that is not in the (empty) cache: a clear message, no network
    with pytest.raises(tui.PairingError, match="not in the local Hugging Face cache"):
        tui.pairing_spec(_args(model="google/gemma-4-E2B-it"))
    # a repo id that is in the cache resolves to its snapshot directory
    snap = tmp_path / "hub" / "models--someone--tiny" / "snapshots" / ("a" * 40)
    snap.mkdir(parents=True)
    (snap / "config.json").write_text("{}")
    (tmp_path / "hub" / "models--someone--tiny" / "refs").mkdir()
    (tmp_path / "hub" / "models--someone--tiny" / "refs" / "main").write_text("a" * 40)
    spec, _ = tui.pairing_spec(_args(model="someone/tiny"))
    assert spec.target == str(snap)
    with pytest.raises(tui.PairingError, match="needs --model"):
        tui.pairing_spec(_args(drafter=str(drafter)))
    with pytest.raises(tui.PairingError, match="no such checkpoint directory"):
        tui.pairing_spec(_args(model=str(tmp_path / "missing")))


def test_no_pairing_configured_opens_the_demo(monkeypatch):
    from app.commands import tui

    monkeypatch.setattr(tui, "demo_spec", lambda **_: PairingSpec("demo (random weights)", "t", "d", demo=True))
    spec, notice = tui.pairing_spec(_args())
    assert spec.demo and "demo" in notice
    spec, notice = tui.pairing_spec(_args(), default_pairing="no-such-pairing")
    assert spec.demo and "unknown pairing" in notice
    with pytest.raises(tui.PairingError, match="unknown pairing"):
        tui.pairing_spec(_args(pairing="no-such-pairing"))


async def test_control_characters_never_reach_the_terminal():
    raw = "red \x1b[31m bell\x07 tab\tline\nend\x7f"
    assert displayable(raw) == "red ␛[31m bell␇ tab\tline\nend␡"
    app, engine = make_app(FakeEngine(replies=[raw]))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        await send(pilot, app, "x")
        await until(pilot, lambda: app.chat.last_reply is not None)
        reply = app.chat.last_reply
        assert reply.plain == raw  # the history keeps the real text
        assert reply.tokens.text.plain == displayable(raw)
        await pilot.press("ctrl+t")
        await until(pilot, lambda: reply.markdown.source == displayable(raw))


def test_live_stats_fold_events_then_take_the_engine_figures():
    from app.tui.live_stats import LiveStats
    from core.events import PrefillDone, TurnStats
    from core.user.export import stats_line

    s = LiveStats()
    s.start_turn(now=10.0)
    s.on_prefill(PrefillDone(prompt_tokens=100, prefill_tokens=80, reused_tokens=20, prefill_s=0.4))
    assert s.prefill_tps == pytest.approx(200.0)
    s.on_tokens(3, first_t=10.5, last_t=10.5)
    s.on_round(RoundEvent(0, drafted=3, accepted=2, block_size=4, auto=True, emitted=3))
    s.on_tokens(2, first_t=11.0, last_t=11.5)
    s.on_round(RoundEvent(1, drafted=3, accepted=1, block_size=4, auto=True, emitted=2))
    assert s.ttft_s == pytest.approx(0.5)
    assert s.decode_tps == pytest.approx(4 / 1.0)  # tokens after the first, over the time since it
    assert s.acceptance == pytest.approx(3 / 6) and s.tokens_per_round == pytest.approx(2.5)
    assert s.emitted == 5
    assert list(s.recent_per_round) == [3.0, 2.0] and (s.last_block_size, s.last_auto) == (4, True)
    stats = TurnStats(
        tokens=6,
        decode_tokens=5,
        decode_s=0.5,
        rounds=2,
        drafted=6,
        accepted=3,
        ttft_s=0.45,
        prefill_tokens=80,
        prefill_s=0.5,
        peak_memory_bytes=2 << 20,
        stop_reason="eos",
    )
    s.on_done(stats)
    assert (s.decode_tps, s.ttft_s, s.prefill_tps, s.peak_memory_bytes) == (10.0, 0.45, 160.0, 2 << 20)
    assert stats_line(stats.as_dict()) == "6 tokens · 10.0 tok/s · TTFT 0.45 s · acceptance 50% · 2.50 tokens/round"
    off = TurnStats(tokens=5, decode_tokens=4, decode_s=1.0, rounds=4, drafter_enabled=False)
    assert stats_line(off.as_dict()) == "5 tokens · 4.0 tok/s · drafter off"


async def _finished_reply(pilot, app, prompt: str):
    """Send `prompt`, let the reply finish, return its token view."""
    await ready(pilot, app)
    await send(pilot, app, prompt)
    await until(pilot, lambda: app.chat.last_reply is not None)
    await pilot.pause(0.05)
    return app.chat.last_reply.tokens


def _screen_lines(view) -> list[str]:
    """What the token view draws, row by row, trailing blanks stripped."""
    return [view.render_line(y).text.rstrip() for y in range(view.size.height)]


async def test_long_replies_show_exactly_their_lines_and_reserve_rows_only_while_streaming():
    lines = [f"line {i} has some words" for i in range(12)]
    reply = "\n".join(lines[:6]) + "\n\n" + "\n".join(lines[6:])  # a paragraph break too
    app, engine = make_app(FakeEngine(replies=[reply], step=True))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        await send(pilot, app, "lines")
        await until(pilot, lambda: app.chat.reply is not None)
        view = app.chat.reply.tokens
        # streaming: blank rows are reserved below the text, so most appends repaint without a relayout
        seen: list[tuple[int, int]] = []  # (lines of text, rows of the widget)
        for _ in range(12):
            engine.allow(1)
            rounds = engine.rounds_done
            await until(pilot, lambda r=rounds: engine.rounds_done is None or engine.rounds_done > r)
            await until(pilot, lambda: app.chat.bridge.pending() == 0)
            await pilot.pause(0.15)
            seen.append((view.line_count, view.size.height))
        assert all(rows >= min(lines + 1, view.RESERVE_LINES) for lines, rows in seen)
        assert len({rows for _, rows in seen}) < len({lines for lines, _ in seen})
        engine.allow(1000)
        await until(pilot, lambda: app.chat.last_reply is not None)
        await pilot.pause(0.05)
        # the model is still one span per token, in order
        nonempty = [t for t in engine.tokens if t.text]
        assert [(s.end - s.start) for s in view.text.spans] == [len(t.text) for t in nonempty]
        assert view.text.plain == reply
        # finished: exactly the reply's lines on screen, nothing reserved, no blank line added or lost
        assert view.size.height == view.line_count == reply.count("\n") + 1
        assert _screen_lines(view) == reply.split("\n")


async def test_token_view_wraps_at_the_width_and_keeps_each_tokens_colour():
    words = " ".join(f"word{i}" for i in range(60))
    app, engine = make_app(FakeEngine(replies=[words]))
    async with app.run_test(size=SIZE) as pilot:
        view = await _finished_reply(pilot, app, "wrap")
        width = view.size.width
        rows = _screen_lines(view)
        assert len(rows) > 3 and all(0 < len(r) <= width for r in rows)
        assert " ".join(rows) == words  # soft breaks drop the space, nothing else is lost
        # every token's cells carry its own style: the draft ones underlined and sky blue
        strips = [view.render_line(y) for y in range(view.size.height)]
        styled = [(seg.text, seg.style) for strip in strips for seg in strip if seg.text.strip()]
        drafted = {t.text.strip() for t in engine.tokens if t.from_draft}
        assert {t.strip() for t, _ in styled} == set(words.split())
        for text, style in styled:
            draft_look = bool(style.underline) and style.color.triplet == DRAFT_STYLE.color.triplet
            target_look = not style.underline and style.color.triplet == TARGET_STYLE.color.triplet
            assert (draft_look, target_look) == ((True, False) if text.strip() in drafted else (False, True))


async def test_resizing_rewraps_a_finished_reply():
    words = " ".join(f"w{i}" for i in range(80))
    app, engine = make_app(FakeEngine(replies=[words]))
    async with app.run_test(size=SIZE) as pilot:
        view = await _finished_reply(pilot, app, "wrap")
        wide = view.line_count
        await pilot.resize_terminal(60, 34)  # compact panel below 100 columns: the text still narrows
        await until(pilot, lambda: view.line_count > wide)
        await pilot.pause(0.05)
        assert view.size.height == view.line_count
        assert " ".join(_screen_lines(view)) == words


async def test_pairing_without_drafter_says_so():
    app = shared_make_app(spec=PairingSpec("plain", "target-dir", None))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        await until(pilot, lambda: "Drafter     none (plain decoding)" in text_of(app.chat.panel.tuning))
        assert "no drafter" in text_of(app.chat.panel.status)


def test_sparkline_rows_scale_to_the_largest_round_and_keep_the_latest():
    from app.tui.widgets.panel import spark_rows

    assert spark_rows([], 5, 2) == ["", ""]
    assert spark_rows([0.0, 0.0], 5, 1) == ["  "]
    # three rows: the largest value fills its column, half of it fills a row and a half
    assert spark_rows([4.0, 2.0, 1.0], 10, 3) == ["█  ", "█▄ ", "██▆"]
    # wider than the panel: the most recent rounds, the newest on the right
    assert spark_rows([1.0, 8.0, 8.0, 4.0], 2, 1) == ["█▄"]


class KernelsEngine(FakeEngine):
    """A fake whose load is followed by the kernel preparation's progress, on the load's listener (as the
    real engine's background preparation sends it), until `finish_kernels`."""

    def _load(self, spec, on_event):
        from core.events import KernelProgress

        info = super()._load(spec, on_event)
        self._kernel_listener = on_event
        on_event(KernelProgress(0.25))
        return info

    def finish_kernels(self) -> None:
        from core.events import KernelProgress

        self._kernel_listener(KernelProgress(1.0, done=True))


async def test_the_status_says_while_kernels_are_prepared_and_stops_saying_it():
    app, engine = make_app(KernelsEngine())
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        status = app.chat.panel.status
        await until(pilot, lambda: "preparing kernels for this machine, first run only… 25%" in text_of(status))
        assert text_of(status).startswith("ready · ")
        engine.finish_kernels()
        await until(pilot, lambda: text_of(status) == "ready")


async def test_the_kernel_note_moves_with_each_step_and_kernel_built():
    """On a loaded machine one warm-up step can take minutes: the note counts the steps and the kernels the
    child has built, as it reports them, so it moves between steps; no time estimate anywhere."""
    from core.events import KernelProgress

    app, engine = make_app(KernelsEngine())
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        status = app.chat.panel.status
        await until(pilot, lambda: "first run only… 25% (loading)" in text_of(status))
        seen = []
        for ev, shown in [
            (KernelProgress(0.0, steps_done=0, steps=20), "0% (0 of 20 steps)"),
            (KernelProgress(0.0, steps_done=0, steps=20, kernels=1), "0% (0 of 20 steps, 1 kernel built)"),
            (KernelProgress(0.0, steps_done=0, steps=20, kernels=14), "0% (0 of 20 steps, 14 kernels built)"),
            (KernelProgress(0.05, steps_done=1, steps=20, kernels=31), "5% (1 of 20 steps, 31 kernels built)"),
        ]:
            engine._kernel_listener(ev)
            await until(pilot, lambda shown=shown: shown in " ".join(text_of(status).split()))
            seen.append(text_of(status))
            assert "ETA" not in text_of(status) and "~" not in text_of(status)
        assert len(set(seen)) == len(seen)
        engine.finish_kernels()
        await until(pilot, lambda: text_of(status) == "ready")
