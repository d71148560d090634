"""Chat history in the TUI: turns saved through the writer thread, restore after a restart, the chat
list (create, switch, rename, delete with confirmation, search), per-chat parameters, thinking,
copy, export and prompt recall. Scripted fake engine, a Store in tmp_path."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from pilot import make_app as shared_make_app
from pilot import texts, turn, until
from support.fake_engine import FakeEngine

from app.tui.app import GemmaChatApp
from app.tui.history import HistoryRecorder, PairingIdentity, RestoredReply
from app.tui.screens.chat_params import ChatParamsScreen
from app.tui.screens.chats import ChatListScreen, RenameScreen
from app.tui.screens.confirm import ConfirmScreen
from app.tui.widgets.conversation import ReplyView
from core.user.store import Store

SIZE = (110, 34)
pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


def make_app(db, engine: FakeEngine | None = None, export_dir=None, **kwargs) -> GemmaChatApp:
    return shared_make_app(engine, history=HistoryRecorder(path=db, export_dir=export_dir), **kwargs)


async def flush(app) -> None:
    await asyncio.to_thread(app.history.flush)


async def open_list(pilot) -> ChatListScreen:
    await pilot.press("ctrl+l")
    await until(pilot, lambda: isinstance(pilot.app.screen, ChatListScreen) and pilot.app.screen.loaded)
    return pilot.app.screen


def listed(screen: ChatListScreen) -> list[str]:
    ol = screen.option_list
    return [screen.summaries[int(ol.get_option_at_index(i).id)].title for i in range(ol.option_count)]


async def test_turns_are_saved_and_restored_after_a_restart(tmp_path):
    db = tmp_path / "history.sqlite3"
    app = make_app(db, replies=["first answer", "second answer"])
    async with app.run_test(size=SIZE) as pilot:
        await turn(pilot, "hello there")
        await turn(pilot, "and again")
        await flush(app)
    app.history.close()
    with Store(db) as store:
        [summary] = store.list_chats()
        chat = store.load_chat(summary.id)
    assert summary.title == "hello there" and summary.pairing == "fake"
    assert [(m.role, m.content) for m in chat.messages] == [
        ("user", "hello there"),
        ("assistant", "first answer"),
        ("user", "and again"),
        ("assistant", "second answer"),
    ]
    assert chat.messages[1].stats["stop_reason"] == "eos" and chat.messages[1].stats["rounds"] > 0

    engine = FakeEngine(replies=["third answer"])
    app2 = make_app(db, engine)
    async with app2.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app2.session.loaded)
        assert texts(app2) == []  # a new app opens a new chat
        screen = await open_list(pilot)
        assert listed(screen) == ["hello there"]
        await pilot.press("enter")
        await until(pilot, lambda: len(texts(app2)) == 4)
        assert texts(app2) == ["U:hello there", "A:first answer", "U:and again", "A:second answer"]
        assert all(isinstance(w, RestoredReply) for w in app2.chat.conversation.query(ReplyView))
        # continuing sends the whole history, then saves into the same chat
        await turn(pilot, "third")
        assert [m["content"] for m in engine.chats[-1][0]] == [
            "hello there",
            "first answer",
            "and again",
            "second answer",
            "third",
        ]
        await flush(app2)
    app2.history.close()
    with Store(db) as store:
        assert len(store.list_chats()) == 1
        assert [m.content for m in store.load_chat(summary.id).messages][-2:] == ["third", "third answer"]


async def test_stopped_reply_is_saved_as_stopped(tmp_path):
    db = tmp_path / "h.sqlite3"
    app = make_app(db, step=True)
    async with app.run_test(size=SIZE) as pilot:
        engine = app.engine
        await until(pilot, lambda: app.session.loaded)
        app.chat.prompt.text = "go"
        await pilot.press("enter")
        engine.allow(2)
        await until(pilot, lambda: engine.rounds_done == 2)
        await pilot.press("escape")
        await until(pilot, lambda: app.chat.last_reply is not None)
        await flush(app)
        partial = app.chat.last_reply.plain
    app.history.close()
    with Store(db) as store:
        msgs = store.load_chat(store.list_chats()[0].id).messages
    assert msgs[-1].stopped and msgs[-1].content == partial and partial


async def test_failed_turn_and_regenerate_keep_the_store_in_step(tmp_path):
    db = tmp_path / "h.sqlite3"
    app = make_app(db, replies=["one", "two", "three"])
    async with app.run_test(size=SIZE) as pilot:
        await turn(pilot, "q1")
        await pilot.press("ctrl+r")
        await until(pilot, lambda: app.chat.last_reply is not None and app.chat.last_reply.plain == "two")
        app.engine.chat_error = "boom"
        app.chat.prompt.text = "q2"
        await pilot.press("enter")
        await until(pilot, lambda: app.chat.prompt.text == "q2")
        await flush(app)
    app.history.close()
    with Store(db) as store:
        msgs = store.load_chat(store.list_chats()[0].id).messages
    assert [(m.role, m.content) for m in msgs] == [("user", "q1"), ("assistant", "two")]


async def test_chat_list_create_switch_rename_delete_search(tmp_path):
    db = tmp_path / "h.sqlite3"
    app = make_app(db, replies=["about cats", "about dogs", "about fish"])
    async with app.run_test(size=SIZE) as pilot:
        await turn(pilot, "tell me about cats")
        await pilot.press("ctrl+n")  # new chat
        assert texts(app) == []
        await turn(pilot, "tell me about dogs")
        screen = await open_list(pilot)
        assert listed(screen) == ["tell me about dogs", "tell me about cats"]  # newest first
        # switch to the older chat
        await pilot.press("down", "enter")
        await until(pilot, lambda: texts(app) == ["U:tell me about cats", "A:about cats"])
        assert app.chat.history == [
            {"role": "user", "content": "tell me about cats"},
            {"role": "assistant", "content": "about cats"},
        ]
        # rename it
        screen = await open_list(pilot)
        assert listed(screen)[0] == "tell me about dogs"
        await pilot.press("down", "ctrl+r")
        await until(pilot, lambda: isinstance(app.screen, RenameScreen))
        app.screen.query_one("#rename-input").value = "Cats"
        await pilot.press("enter")
        await until(
            pilot, lambda: isinstance(app.screen, ChatListScreen) and app.screen.loaded and "Cats" in listed(app.screen)
        )
        # search: by message text, then a miss
        await pilot.press(*"dogs")
        await until(pilot, lambda: screen.loaded and listed(screen) == ["tell me about dogs"])
        screen.query_one("#chats-search").value = "zebra"
        await until(pilot, lambda: screen.loaded and listed(screen) == [])
        screen.query_one("#chats-search").value = ""
        await until(pilot, lambda: screen.loaded and len(listed(screen)) == 2)
        assert listed(screen) == ["Cats", "tell me about dogs"]  # renaming counts as an update
        await pilot.press("down")
        # delete asks first: "no" keeps it, "yes" deletes it
        await pilot.press("delete")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("n")
        await until(pilot, lambda: isinstance(app.screen, ChatListScreen))
        assert len(listed(screen)) == 2
        await pilot.press("delete")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("y")
        await until(
            pilot, lambda: isinstance(app.screen, ChatListScreen) and screen.loaded and len(listed(screen)) == 1
        )
        assert listed(screen) == ["Cats"]
        # ctrl+n from the list starts a new chat
        await pilot.press("ctrl+n")
        await until(pilot, lambda: app.screen is app.chat)
        assert texts(app) == [] and app.chat.history == []
        await flush(app)
    app.history.close()
    with Store(db) as store:
        assert [c.title for c in store.list_chats()] == ["Cats"]


async def test_deleting_the_open_chat_leaves_a_new_one(tmp_path):
    app = make_app(tmp_path / "h.sqlite3", replies=["a1", "a2"])
    async with app.run_test(size=SIZE) as pilot:
        await turn(pilot, "q1")
        screen = await open_list(pilot)
        await pilot.press("delete")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("y")
        await until(pilot, lambda: isinstance(app.screen, ChatListScreen) and screen.loaded and listed(screen) == [])
        await pilot.press("escape")
        await until(pilot, lambda: app.screen is app.chat and texts(app) == [])
        await turn(pilot, "q2")
        await flush(app)
        chats = await app.history.call(lambda store: store.list_chats())
        assert [c.title for c in chats] == ["q2"]
    app.history.close()


async def test_params_dialog_sets_the_next_turns_settings_and_is_saved(tmp_path):
    db = tmp_path / "h.sqlite3"
    app = make_app(db, replies=["r1", "r2"])
    async with app.run_test(size=SIZE) as pilot:
        engine = app.engine
        await turn(pilot, "q1")
        await pilot.press("f9")
        await until(pilot, lambda: isinstance(app.screen, ChatParamsScreen))
        dialog = app.screen
        assert dialog.query_one("#params-thinking").disabled  # the fake's template has no thinking
        dialog.query_one("#params-temperature").value = "hot"
        await pilot.press("ctrl+s")
        await pilot.pause(0.05)
        assert isinstance(app.screen, ChatParamsScreen)
        assert "Temperature: must be a number" in str(dialog.query_one("#params-error").render())
        dialog.query_one("#params-temperature").value = "0.7"
        dialog.query_one("#params-top_p").value = "1.5"
        await pilot.press("ctrl+s")
        await pilot.pause(0.05)
        assert "Top-p: must be a number > 0 and <= 1, got 1.5" in str(dialog.query_one("#params-error").render())
        dialog.query_one("#params-top_p").value = "0.9"
        dialog.query_one("#params-top_k").value = "40"
        dialog.query_one("#params-max_tokens").value = "64"
        dialog.query_one("#params-seed").value = "7"
        dialog.query_one("#params-system_prompt").text = "Be brief."
        await pilot.press("ctrl+s")
        await until(pilot, lambda: app.screen is app.chat)
        await turn(pilot, "q2")
        sent = engine.chats[-1][1]
        assert (sent.temperature, sent.top_p, sent.top_k, sent.max_tokens, sent.seed, sent.system_prompt) == (
            0.7,
            0.9,
            40,
            64,
            7,
            "Be brief.",
        )
        await flush(app)
        chat_id = app.history.current.id
    app.history.close()
    with Store(db) as store:
        chat = store.load_chat(chat_id)
    assert chat.system_prompt == "Be brief."
    assert chat.params["temperature"] == 0.7 and chat.params["seed"] == 7

    # reopened after a restart, the chat brings its parameters back
    engine2 = FakeEngine(replies=["r3"])
    app2 = make_app(db, engine2)
    async with app2.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app2.session.loaded)
        assert app2.chat.settings.temperature == 0.0
        await open_list(pilot)
        await pilot.press("enter")
        await until(pilot, lambda: len(texts(app2)) == 4)
        await turn(pilot, "q3")
        sent = engine2.chats[-1][1]
        assert (sent.temperature, sent.top_k, sent.seed, sent.system_prompt) == (0.7, 40, 7, "Be brief.")
    app2.history.close()


THOUGHT_REPLY = "<|channel>thought\nThe user greets me. I greet back.<channel|>Hello to you too!"


async def test_thinking_is_collapsed_saved_apart_and_not_sent_back(tmp_path):
    from textual.widgets import Collapsible

    db = tmp_path / "h.sqlite3"
    app = make_app(db, replies=[THOUGHT_REPLY, "fine"])
    async with app.run_test(size=SIZE) as pilot:
        engine = app.engine
        await until(pilot, lambda: app.session.loaded)
        engine._info = dataclasses.replace(engine.info, supports_thinking=True)
        await pilot.press("f4")
        assert app.chat.settings.thinking is True
        await turn(pilot, "hello")
        assert engine.chats[-1][1].thinking is True
        reply = app.chat.last_reply
        assert reply.plain == "Hello to you too!"
        await until(pilot, lambda: reply.tokens.text.plain == "Hello to you too!")  # the thinking left the token view
        await until(pilot, lambda: reply.query(".thinking-text"))
        [section] = reply.query(Collapsible)
        assert section.collapsed and section.title == "thinking"
        assert "I greet back." in str(section.query_one(".thinking-text").render())
        await turn(pilot, "how are you?")
        assert [m["content"] for m in engine.chats[-1][0]] == ["hello", "Hello to you too!", "how are you?"]
        await flush(app)
        chat_id = app.history.current.id
    app.history.close()
    with Store(db) as store:
        chat = store.load_chat(chat_id)
    assert chat.messages[1].content == "Hello to you too!"
    assert chat.messages[1].thinking == "The user greets me. I greet back."
    assert chat.params["thinking"] is True

    app2 = make_app(db)
    async with app2.run_test(size=SIZE) as pilot:
        await open_list(pilot)
        await pilot.press("enter")
        await until(pilot, lambda: len(texts(app2)) == 4)
        await until(pilot, lambda: app2.chat.conversation.query(".thinking-text"))
        [section] = app2.chat.conversation.query(Collapsible)
        assert section.collapsed
        assert app2.chat.history[1] == {"role": "assistant", "content": "Hello to you too!"}
    app2.history.close()


async def test_copy_reply_and_code_and_export(tmp_path, monkeypatch):
    from support.fake_engine import DEFAULT_REPLY

    import core.user.clipboard

    monkeypatch.setattr(core.user.clipboard, "system_copy", lambda text, **kw: False)
    app = make_app(tmp_path / "h.sqlite3", export_dir=tmp_path / "out")
    copied: list[str] = []
    monkeypatch.setattr(app, "copy_to_clipboard", copied.append)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("c")  # nothing yet: a warning, no copy
        await turn(pilot, "show me code")
        app.chat.conversation.focus()  # y / c act where typing is not going on
        await pilot.press("y")
        await pilot.press("c")
        assert copied == [DEFAULT_REPLY, "def add(a, b):\n    return a + b"]
        await pilot.press("ctrl+s")
        await until(pilot, lambda: list((tmp_path / "out").glob("*.md")))
        [path] = (tmp_path / "out").glob("*.md")
    app.history.close()
    text = path.read_text()
    assert text.startswith("# show me code\n")
    assert "## User\n\nshow me code" in text and "def add(a, b):" in text
    assert path.name.startswith("show-me-code-")


async def test_up_down_recall_in_an_empty_prompt(tmp_path):
    app = make_app(tmp_path / "h.sqlite3", replies=["r"])
    async with app.run_test(size=SIZE) as pilot:
        await turn(pilot, "first question")
        await turn(pilot, "second\nquestion")
        prompt = app.chat.prompt
        prompt.focus()
        await pilot.press("up")
        assert prompt.text == "second\nquestion"
        await pilot.press("up")
        assert prompt.text == "first question"
        await pilot.press("up")  # the oldest stays
        assert prompt.text == "first question"
        await pilot.press("down")
        assert prompt.text == "second\nquestion"
        await pilot.press("down")
        assert prompt.text == ""
        # typed text is never replaced: the arrows move the cursor as usual
        await pilot.press("x", "up")
        assert prompt.text == "x"
    app.history.close()


async def test_conversation_text_is_selectable(tmp_path):
    app = make_app(tmp_path / "h.sqlite3")
    async with app.run_test(size=SIZE) as pilot:
        await turn(pilot, "hi")
        assert app.chat.allow_select
        assert app.chat.conversation.allow_select and app.chat.last_reply.allow_select
    app.history.close()


async def test_image_attachments_are_saved_by_path_and_restored(tmp_path):
    from app.resources import assets_dir

    image = str((assets_dir() / "images" / "chart.png").resolve())
    db = tmp_path / "h.sqlite3"
    recorder = HistoryRecorder(path=db)
    recorder.start_chat(PairingIdentity("fake", None, None), params={}, system_prompt=None)
    recorder.record_user("what is this?", [image])
    recorder.record_reply("a chart", thinking=None, stats=None, stopped=False)
    recorder.flush()
    recorder.close()
    with Store(db) as store:
        [msg, _] = store.load_chat(store.list_chats()[0].id).messages
        assert [a.path for a in msg.attachments] == [image] and msg.attachments[0].size > 0

    app = make_app(db, replies=["more"])
    async with app.run_test(size=SIZE) as pilot:
        await open_list(pilot)
        await pilot.press("enter")
        await until(pilot, lambda: len(texts(app)) == 2)
        assert texts(app)[0] == "U:what is this?\n[image: chart.png]"
        await turn(pilot, "and now?")
        first = app.engine.chats[-1][0][0]
        assert first["content"] == [{"type": "image", "path": image}, {"type": "text", "text": "what is this?"}]
    app.history.close()


async def test_palette_opens_the_chat_list(tmp_path):
    from textual.command import CommandPalette
    from textual.widgets import Input

    app = make_app(tmp_path / "h.sqlite3")
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.session.loaded)
        await pilot.press("ctrl+p")
        await until(pilot, lambda: isinstance(app.screen, CommandPalette))
        app.screen.query_one(Input).value = "chats: history"
        await pilot.pause(0.3)
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, ChatListScreen))
    app.history.close()


async def test_reopening_a_chat_loads_its_pairing(tmp_path):
    db = tmp_path / "h.sqlite3"
    other_target, other_drafter = tmp_path / "other-target", tmp_path / "other-drafter"
    other_target.mkdir()
    other_drafter.mkdir()
    with Store(db) as store:
        moved = store.create_chat("moved away", pairing="gone", target_id=str(tmp_path / "nowhere"))
        store.append_user_message(moved, "hi")
        other = store.create_chat(
            "on the other pairing", pairing="other", target_id=str(other_target), drafter_id=str(other_drafter)
        )
        store.append_user_message(other, "hello")
    app = make_app(db)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.session.loaded)
        screen = await open_list(pilot)
        assert listed(screen)[0] == "on the other pairing"
        await pilot.press("enter")
        await until(pilot, lambda: app.session.spec.name == "other" and app.session.loaded)
        assert app.engine.info.target_path == str(other_target)
        # a pairing that is not there any more: the chat opens on the loaded one, with a notice
        await open_list(pilot)
        await pilot.press("down", "enter")
        await until(pilot, lambda: texts(app) == ["U:hi"])
        assert app.session.spec.name == "other"
        await until(pilot, lambda: any("not available" in n.message for n in app._notifications))
        # continued there, the chat now records the pairing it runs on
        await turn(pilot, "still there?")
        await flush(app)
    app.history.close()
    with Store(db) as store:
        chat = store.load_chat(moved)
    assert (chat.pairing, chat.target_id) == ("other", str(other_target))
