"""Image attachments in the chat screen (Textual pilot, scripted fake engine; one real-engine test).

Three ways in (Ctrl+O picker, pasted/dropped paths, `/image PATH`), removable chips, thumbnails in
the conversation, the content items the engine receives, and every refusal: a notification, the
typed prompt kept, the chat still working. Thumbnails are forced to the text label (deterministic).
"""

from __future__ import annotations

import shutil
import struct
import zlib
from pathlib import Path

import pytest
from pilot import make_app as shared_make_app
from pilot import ready, until
from support.fake_engine import FakeEngine
from textual import events

from app.resources import assets_dir
from app.tui.app import GemmaChatApp
from app.tui.screens.file_picker import FilePicker
from app.tui.widgets.attachments import AttachmentChip, parse_image_command, user_content
from app.tui.widgets.thumbnail import MODE_ENV, ImageStrip, Thumbnail, halfcell_text, inspect_image

SIZE = (110, 34)
SAMPLES = assets_dir() / "images"
pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture(autouse=True)
def label_thumbnails(monkeypatch):
    monkeypatch.setenv(MODE_ENV, "label")
    monkeypatch.setattr(FilePicker, "last_dir", None)


@pytest.fixture
def pics(tmp_path) -> Path:
    """Sample images under awkward names, plus things that are not usable images."""
    d = tmp_path / "pics"
    d.mkdir()
    shutil.copy(SAMPLES / "landscape.jpg", d / "landscape.jpg")
    shutil.copy(SAMPLES / "chart.png", d / "my chart.png")
    shutil.copy(SAMPLES / "icon_rgba.png", d / "icon (1).png")
    (d / "notes.txt").write_text("not an image")
    (d / "fake.png").write_text("not an image either")
    (d / "empty.png").write_bytes(b"")
    data = (SAMPLES / "chart.png").read_bytes()
    (d / "truncated.png").write_bytes(data[: len(data) // 2])
    (d / "bomb.png").write_bytes(_png_header_only(30000, 30000))
    (d / "sub").mkdir()
    return d


def _png_header_only(width: int, height: int) -> bytes:
    """A PNG that claims width x height pixels (a decompression bomb as far as the header goes)."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 8)) + chunk(b"IEND", b"")


def make_app(engine: FakeEngine | None = None) -> tuple[GemmaChatApp, FakeEngine]:
    app = shared_make_app(engine or FakeEngine(replies=["A picture of things."]))
    return app, app.engine


async def submit(pilot, app, text: str) -> None:
    app.chat.prompt.focus()
    app.chat.prompt.text = text
    await pilot.press("enter")


async def send_and_wait(pilot, app, engine, text: str) -> None:
    turns = len(engine.turns)
    await submit(pilot, app, text)
    await until(pilot, lambda: len(engine.turns) > turns and app.chat.reply is None)


def chips(app) -> list[str]:
    return [c.info.name for c in app.chat.attachments.query(AttachmentChip)]


def errors(app) -> list[str]:
    return [n.message for n in app._notifications if n.severity == "error"]


async def open_picker(pilot, app) -> FilePicker:
    """Ctrl+O, and the picker it opens."""
    await pilot.press("ctrl+o")
    await until(pilot, lambda: isinstance(app.screen, FilePicker))
    return app.screen


def last_user_content(engine):
    messages, _ = engine.chats[-1]
    return [m for m in messages if m["role"] == "user"][-1]["content"]


# -- the three ways in ----------------------------------------------------------------------------


async def test_picker_lists_images_previews_and_attaches_the_chosen_file(pics):
    app, engine = make_app()
    FilePicker.last_dir = pics
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        picker = await open_picker(pilot, app)
        tree = picker.files
        await until(pilot, lambda: len(tree.root.children) > 0)
        names = sorted(str(n.label) for n in tree.root.children)
        assert "notes.txt" not in names and "sub" in names and "landscape.jpg" in names
        node = next(n for n in tree.root.children if str(n.label) == "landscape.jpg")
        tree.move_cursor(node)
        await until(pilot, lambda: picker.previewed is not None)
        details = str(picker.details.render())
        assert "JPEG 320x240" in details and "image tokens (budget 280)" in details
        assert picker.query(Thumbnail)
        await pilot.press("enter")
        await until(pilot, lambda: chips(app) == ["landscape.jpg"])
        assert app.screen is app.chat
        await send_and_wait(pilot, app, engine, "What is in it?")
        assert last_user_content(engine) == [
            {"type": "image", "path": str(pics / "landscape.jpg")},
            {"type": "text", "text": "What is in it?"},
        ]
        assert chips(app) == [] and app.chat.prompt.text == ""


async def test_picker_escape_cancels_and_backspace_goes_up(pics):
    app, _ = make_app()
    FilePicker.last_dir = pics / "sub"
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        await open_picker(pilot, app)
        await pilot.press("backspace")
        assert Path(app.screen.files.path) == pics
        await pilot.press("escape")
        await until(pilot, lambda: app.screen is app.chat)
        assert chips(app) == []


async def test_picker_takes_a_typed_path_completes_it_and_refuses_what_it_cannot_attach(pics):
    """Typing in the tree starts the path line; Tab completes from the folder shown; Enter opens a typed
    folder, refuses a missing or unattachable file with the text kept, and attaches a typed image."""
    app, engine = make_app()
    FilePicker.last_dir = pics
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        picker = await open_picker(pilot, app)
        line = picker.path_line
        assert picker.focused is picker.files
        await pilot.press("s", "u")  # typed in the tree: it goes to the path line
        assert picker.focused is line and line.value == "su"
        line.value = ""
        picker.files.focus()
        await pilot.pause()
        picker.post_message(events.Key("m", "m"))  # keys that reach the tree before the focus has moved:
        for key, char in [("y", "y"), ("space", " "), ("c", "c")]:  # Space is part of the path once it is begun
            picker.post_message(events.Key(key, char))
        await until(pilot, lambda: line.value == "my c")
        line.value = "su"
        await until(pilot, lambda: line._suggestion == "sub/")
        await pilot.press("tab")
        assert line.value == "sub/"
        await pilot.press("enter")  # a folder: the tree opens it, the line empties
        await until(pilot, lambda: Path(picker.files.path) == pics / "sub")
        assert line.value == "" and picker.focused is picker.files and FilePicker.last_dir == pics / "sub"
        await pilot.press("backspace")
        await until(pilot, lambda: Path(picker.files.path) == pics)

        refused = [("nothere.png", "No such file or folder"), ("notes.txt", "not an image or audio file")]
        for typed, why in refused + [("bad\0name.png", "bad")]:  # a NUL, as a paste may carry
            line.focus()
            line.value = typed
            await pilot.press("enter")
            await until(pilot, lambda why=why: why in str(picker.details.render()))
            assert isinstance(app.screen, FilePicker) and line.value == typed  # nothing lost

        line.value = "lands"
        await until(pilot, lambda: line._suggestion == "landscape.jpg")
        await pilot.press("tab")  # a typed file is previewed as a highlighted one is
        await until(pilot, lambda: picker.previewed is not None and "JPEG 320x240" in str(picker.details.render()))
        await pilot.press("enter")
        await until(pilot, lambda: chips(app) == ["landscape.jpg"])
        assert app.screen is app.chat and errors(app) == []


async def test_a_path_pasted_into_the_picker_is_unquoted_and_attaches(pics):
    """A terminal's drop into the open picker: the escaped or quoted path lands on the path line as the file
    it names (file:// and ~: test_typed_paths_are_read_as_a_drop_spells_them_...)."""
    app, engine = make_app()
    FilePicker.last_dir = pics / "sub"
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        picker = await open_picker(pilot, app)
        escaped = str(pics / "icon (1).png").replace(" ", "\\ ").replace("(", "\\(").replace(")", "\\)")
        picker.post_message(events.Paste(escaped + "\n"))
        await until(pilot, lambda: picker.focused is picker.path_line and picker.path_line.value == escaped)
        await until(pilot, lambda: "icon (1).png" in str(picker.details.render()))
        await pilot.press("enter")
        await until(pilot, lambda: chips(app) == ["icon (1).png"])
        picker = await open_picker(pilot, app)
        picker.post_message(events.Paste(f"'{pics / 'my chart.png'}'"))
        await until(pilot, lambda: "'" in picker.path_line.value)
        await pilot.press("enter")
        await until(pilot, lambda: chips(app) == ["icon (1).png", "my chart.png"])


async def test_pasted_quoted_and_escaped_paths_become_chips_and_leave_the_text(pics):
    app, engine = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        prompt = app.chat.prompt
        prompt.focus()
        prompt.text = "Compare "
        prompt.move_cursor(prompt.document.end)
        escaped = str(pics / "icon (1).png").replace(" ", "\\ ").replace("(", "\\(").replace(")", "\\)")
        app.post_message(events.Paste(f"'{pics / 'my chart.png'}' {escaped} please"))
        await until(pilot, lambda: len(chips(app)) == 2)
        assert chips(app) == ["my chart.png", "icon (1).png"]
        assert prompt.text == "Compare please"
        await pilot.press("enter")
        await until(pilot, lambda: engine.turns and app.chat.reply is None)
        content = last_user_content(engine)
        assert [c.get("path") for c in content[:2]] == [str(pics / "my chart.png"), str(pics / "icon (1).png")]
        assert content[2] == {"type": "text", "text": "Compare please"}


async def test_paste_without_image_paths_is_ordinary_text():
    app, _ = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        app.chat.prompt.focus()
        app.post_message(events.Paste("just some /etc/hosts text"))
        await until(pilot, lambda: app.chat.prompt.text == "just some /etc/hosts text")
        assert chips(app) == []


async def test_image_command_attaches_and_clears_the_prompt(pics):
    app, engine = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        await submit(pilot, app, f'/image "{pics / "my chart.png"}"')
        await until(pilot, lambda: chips(app) == ["my chart.png"])
        await until(pilot, lambda: app.chat.prompt.text == "")
        assert engine.chats == []  # a command, not a message
        await submit(pilot, app, "/image")  # no path: the picker
        await until(pilot, lambda: isinstance(app.screen, FilePicker))
        await pilot.press("escape")
        await submit(pilot, app, f"/image {pics / 'landscape.jpg'} what is in these two?")
        # one Enter: both images and the question go out together
        await until(pilot, lambda: len(engine.chats) == 1)
        content = last_user_content(engine)
        assert [c.get("path") for c in content[:2]] == [str(pics / "my chart.png"), str(pics / "landscape.jpg")]
        assert content[2] == {"type": "text", "text": "what is in these two?"}
        assert chips(app) == [] and app.chat.prompt.text == ""


# -- chips and thumbnails -------------------------------------------------------------------------


async def test_chips_are_removed_by_key_and_by_click(pics):
    app, engine = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        app.chat.attachments.attach([str(pics / "landscape.jpg"), str(pics / "my chart.png")])
        await until(pilot, lambda: len(chips(app)) == 2)
        assert app.chat.attachments.display
        first = app.chat.attachments.query(AttachmentChip).first()
        first.focus()
        await pilot.press("delete")
        await until(pilot, lambda: chips(app) == ["my chart.png"])
        assert isinstance(app.focused, AttachmentChip)  # focus moved to the remaining chip
        await pilot.click(AttachmentChip)
        await until(pilot, lambda: chips(app) == [])
        assert not app.chat.attachments.display
        assert app.focused is app.chat.prompt
        await send_and_wait(pilot, app, engine, "no pictures")
        assert last_user_content(engine) == "no pictures"


async def test_thumbnails_in_the_conversation_and_images_resent_on_later_turns(pics):
    app, engine = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        app.chat.attachments.attach([str(pics / "landscape.jpg")])
        await until(pilot, lambda: chips(app) == ["landscape.jpg"])
        await send_and_wait(pilot, app, engine, "Describe it")
        strip = app.chat.conversation.query_one(ImageStrip)
        labels = [str(s.render()) for s in strip.query(".thumb-label")]
        assert labels == ["[image: landscape.jpg 320x240]"]
        await send_and_wait(pilot, app, engine, "And the colours?")
        messages, _ = engine.chats[-1]
        assert messages[0]["content"][0] == {"type": "image", "path": str(pics / "landscape.jpg")}
        assert messages[-1] == {"role": "user", "content": "And the colours?"}


# -- refusals: a notification, the prompt kept, the chat goes on ---------------------------------

BAD_FILES = {
    "missing.png": "not found",
    "notes.txt": "not an image",
    "fake.png": "not an image",
    "empty.png": "empty (0 bytes)",
    "truncated.png": "damaged or truncated",
    "bomb.png": "too large",
    "sub": "folder",
}


async def test_bad_files_are_refused_with_the_prompt_kept(pics):
    """One notification per bad file, naming it and why; the good one still attaches."""
    app, engine = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        app.chat.prompt.text = "my careful question"
        app.chat.attachments.attach([str(pics / name) for name in BAD_FILES] + [str(pics / "landscape.jpg")])
        await until(pilot, lambda: len(errors(app)) == len(BAD_FILES))
        for (name, why), message in zip(BAD_FILES.items(), errors(app)):
            assert message.startswith("Not attached") and why in message and name in message
        assert chips(app) == ["landscape.jpg"] and app.chat.prompt.text == "my careful question"
        await send_and_wait(pilot, app, engine, app.chat.prompt.text)
        assert last_user_content(engine)[-1] == {"type": "text", "text": "my careful question"}


async def test_bad_image_command_stays_in_the_prompt_and_good_ones_still_attach(pics):
    app, _ = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        command = f"/image {pics / 'missing.png'}"
        await submit(pilot, app, command)
        await until(pilot, lambda: errors(app))
        assert "not found" in errors(app)[-1]
        assert app.chat.prompt.text == command
        await submit(pilot, app, f"/image {pics / 'landscape.jpg'}")
        await until(pilot, lambda: chips(app) == ["landscape.jpg"])


async def test_a_pairing_without_vision_refuses_every_way_in(pics):
    app, engine = make_app(FakeEngine(has_vision=False, has_audio=False))  # with audio the picker opens for clips
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        await pilot.press("ctrl+o")
        await pilot.pause(0.05)
        assert app.screen is app.chat  # no picker
        command = f"/image {pics / 'landscape.jpg'}"
        await submit(pilot, app, command)
        app.post_message(events.Paste(f" {pics / 'landscape.jpg'}"))
        await until(pilot, lambda: len(errors(app)) >= 3)
        assert all("no vision tower" in e for e in errors(app))
        # the refused path is pasted as text (nothing typed or dropped is lost), the command kept
        assert chips(app) == [] and app.chat.prompt.text.replace(f" {pics / 'landscape.jpg'}", "", 1) == command
        await send_and_wait(pilot, app, engine, "text still works")
        assert engine.turns[-1].stats.stop_reason != "error"


async def test_too_many_image_tokens_gives_message_and_images_back(pics):
    """The engine refuses the turn (context): its message shows, the text and chips come back."""
    app, engine = make_app(FakeEngine(context_length=300, replies=["ok"]))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        app.chat.attachments.attach([str(pics / "landscape.jpg"), str(pics / "my chart.png")])
        await until(pilot, lambda: len(chips(app)) == 2)
        await send_and_wait(pilot, app, engine, "two pictures")
        assert engine.turns[-1].stats.stop_reason == "error"
        await until(pilot, lambda: errors(app))
        assert "context is 300" in errors(app)[-1]
        assert app.chat.prompt.text == "two pictures"
        assert chips(app) == ["landscape.jpg", "my chart.png"]
        assert not app.chat.conversation.query(ImageStrip)
        assert app.chat.history == []
        # one image fits: the chat goes on
        app.chat.attachments.query(AttachmentChip).last().action_remove_chip()
        await until(pilot, lambda: chips(app) == ["landscape.jpg"])
        await send_and_wait(pilot, app, engine, app.chat.prompt.text)
        assert engine.turns[-1].stats.stop_reason != "error"
        assert last_user_content(engine)[0]["path"] == str(pics / "landscape.jpg")


async def test_send_waits_for_images_being_checked(pics, monkeypatch):
    import threading

    from app.tui.widgets import attachments

    gate = threading.Event()
    real = attachments.inspect_image

    def slow(path):
        gate.wait(5)
        return real(path)

    monkeypatch.setattr(attachments, "inspect_image", slow)
    app, engine = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        app.chat.attachments.attach([str(pics / "landscape.jpg")])
        await submit(pilot, app, "too soon")
        assert "still being checked" in errors(app)[-1]
        assert app.chat.prompt.text == "too soon" and engine.chats == []
        gate.set()
        await until(pilot, lambda: chips(app) == ["landscape.jpg"])
        await send_and_wait(pilot, app, engine, "too soon")
        assert last_user_content(engine)[0]["type"] == "image"


# -- pieces ---------------------------------------------------------------------------------------


def test_user_content_and_command_paths():
    info = inspect_image(str(SAMPLES / "chart.png"))
    assert user_content("hi", []) == "hi"
    assert user_content("hi", [info]) == [{"type": "image", "path": info.path}, {"type": "text", "text": "hi"}]
    assert parse_image_command("hello") is None
    assert parse_image_command("/imagery") is None
    assert parse_image_command("/image") == ([], "")
    assert parse_image_command(r"/image 'a b.png' /p/c\ d.jpg file:///x/y%20z.png") == (
        ["a b.png", "/p/c d.jpg", "/x/y z.png"],
        "",
    )
    assert parse_image_command("/image notes.txt what is /tmp/q.png about?") == (
        ["notes.txt", "/tmp/q.png"],
        "what is about?",
    )
    assert parse_image_command("/image ~/cat.jpg  describe it ") == (
        [str(Path("~/cat.jpg").expanduser())],
        "describe it",
    )


def test_halfcell_keeps_the_aspect_and_the_colours():
    from PIL import Image

    image = Image.new("RGB", (40, 20), (255, 0, 0))
    image.paste((0, 0, 255), (0, 10, 40, 20))  # bottom half blue
    text = halfcell_text(image, 20, 10)
    lines = text.plain.split("\n")
    assert len(lines) == 5 and {len(line) for line in lines} == {20}
    first, last = text.spans[0].style, text.spans[-1].style
    assert first.color.triplet == (255, 0, 0) and first.bgcolor.triplet == (255, 0, 0)
    assert last.color.triplet == (0, 0, 255)


# -- the real engine --------------------------------------------------------------------------------


async def test_real_engine_answers_a_message_with_an_image(factory_checkpoints):
    from core.engine.contract import PairingSpec as RealSpec
    from core.engine.local import Engine
    from core.settings import GenerationSettings

    target, drafter = factory_checkpoints.pairing("e-style")
    engine = Engine()
    spec = RealSpec("factory e-style", str(target), str(drafter))
    app = shared_make_app(engine, spec=spec, settings=GenerationSettings(max_tokens=5, temperature=0.0))
    try:
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.session.loaded or app.session.load_error, timeout=60)
            assert app.session.load_error is None
            assert engine.info.has_vision
            app.chat.attachments.attach([str(SAMPLES / "icon_rgba.png")])
            await until(pilot, lambda: chips(app) == ["icon_rgba.png"])
            await submit(pilot, app, "What is this?")
            await until(pilot, lambda: app.chat.last_reply is not None or errors(app), timeout=60)
            assert errors(app) == []
            reply = app.chat.last_reply
            assert reply.done.stats.stop_reason in ("max_tokens", "eos")
            assert reply.done.token_ids
            assert app.chat.history[0]["content"][0] == {"type": "image", "path": str(SAMPLES / "icon_rgba.png")}
    finally:
        engine.close()


async def test_palette_command_opens_the_picker_and_chips_are_reached_by_keyboard(pics):
    from textual.command import CommandPalette

    app, _ = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        app.chat.attachments.attach([str(pics / "landscape.jpg")])
        await until(pilot, lambda: chips(app) == ["landscape.jpg"])
        chip = app.chat.attachments.query_one(AttachmentChip)
        # focus order is spatial: wait until the bar is laid out between conversation and prompt
        await until(pilot, lambda: chip.region.height and chip.region.y > app.chat.conversation.region.y)
        app.chat.prompt.focus()
        await until(pilot, lambda: app.focused is app.chat.prompt)
        await pilot.press("shift+tab")
        assert isinstance(app.focused, AttachmentChip)
        await pilot.press("x")
        await until(pilot, lambda: chips(app) == [])
        assert app.focused is app.chat.prompt
        await pilot.press("ctrl+p")
        await until(pilot, lambda: isinstance(app.screen, CommandPalette))
        await pilot.press(*"attach")
        from textual.command import CommandList

        commands = app.screen.query_one(CommandList)
        await until(
            pilot,
            lambda: (
                commands.option_count
                and commands.highlighted is not None
                and "Attach an image" in str(commands.get_option_at_index(commands.highlighted).prompt)
            ),
        )
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, FilePicker))


async def test_unreadable_file_is_refused(pics, monkeypatch):
    """Running as root, chmod cannot make a file unreadable: the read fails as it would."""
    real = Path.read_bytes

    def denied(self):
        if self.name == "landscape.jpg":
            raise PermissionError(13, "Permission denied")
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", denied)
    app, _ = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        app.chat.prompt.text = "keep"
        app.chat.attachments.attach([str(pics / "landscape.jpg"), str(pics / "my chart.png")])
        await until(pilot, lambda: errors(app) and chips(app))
        assert "Permission denied" in errors(app)[-1]
        assert chips(app) == ["my chart.png"] and app.chat.prompt.text == "keep"


async def test_graphics_thumbnail_uses_textual_image_widget(monkeypatch):
    """The terminal-graphics branch, with textual-image's half-cell widget standing in for the
    Sixel/TGP one that only a real terminal answering the query would select."""
    from textual.app import App
    from textual_image.widget import HalfcellImage

    from app.tui.widgets import thumbnail

    monkeypatch.setattr(thumbnail, "_graphics_widget", lambda: HalfcellImage)
    info = inspect_image(str(SAMPLES / "landscape.jpg"))

    class One(App):
        def compose(self):
            yield Thumbnail(info, cells=(24, 8), mode="graphics")

    app = One()
    async with app.run_test(size=(60, 20)) as pilot:
        await pilot.pause()
        picture = app.query_one(HalfcellImage)
        assert (picture.size.width, picture.size.height) == (24, 8)
        assert "landscape.jpg 320x240" in str(app.query_one(".thumb-caption").render())


def test_typed_paths_are_read_as_a_drop_spells_them_and_complete_only_to_attachables(pics, monkeypatch):
    from app.tui.screens.file_picker import completion, typed_path

    monkeypatch.setenv("HOME", str(pics.parent))
    (pics / ".hidden.png").write_bytes(b"")
    (pics / "zz.txt").write_text("")
    assert typed_path("my chart.png", pics) == pics / "my chart.png"  # unquoted, with its space
    assert typed_path("'my chart.png'", pics) == pics / "my chart.png"
    assert typed_path("icon\\ \\(1\\).png", pics) == pics / "icon (1).png"
    assert typed_path("~/pics/landscape.jpg", Path("/")) == pics / "landscape.jpg"
    assert typed_path(f"file://{pics}/my%20chart.png", Path("/")) == pics / "my chart.png"
    assert typed_path("sub/missing.png", pics) == pics / "sub" / "missing.png"
    assert typed_path("../../pics/./sub/", pics / "sub") == pics / "sub"  # where the tree and its title go
    assert completion("su", pics) == "sub/"
    assert completion("zz", pics) is None  # not an image or audio file
    assert completion(".hid", pics) == ".hidden.png" and completion("", pics) is None
    assert completion(f"{pics}/my", Path("/")) == f"{pics}/my chart.png"
    assert completion("~/pi", Path("/")) == "~/pics/"
    assert completion("nowhere/x", pics) is None and completion("a\0/b", pics) is None
    assert typed_path("x\0.png", pics) == pics / "x\0.png"  # named, not looked up
    # relative to the folder shown, else to the one the app started in (as `/image PATH` reads it)
    monkeypatch.chdir(pics.parent)
    assert typed_path("pics/landscape.jpg", pics / "sub") == pics / "landscape.jpg"
    assert typed_path("pics/nowhere.png", pics / "sub") == pics / "sub" / "pics" / "nowhere.png"  # the shown one's
    (pics / "sub" / "pics").mkdir()
    (pics / "sub" / "pics" / "landscape.jpg").write_bytes(b"")
    assert typed_path("pics/landscape.jpg", pics / "sub") == pics / "sub" / "pics" / "landscape.jpg"  # it comes first
    assert completion("'my", pics) == "'my chart.png'" and completion("'sub/'", pics) is None  # inside quotes


async def test_at_80x24_the_preview_picture_gives_way_to_the_image_tokens(pics, monkeypatch):
    monkeypatch.setenv(MODE_ENV, "halfcell")
    app, _ = make_app()
    FilePicker.last_dir = pics
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot, app)
        picker = await open_picker(pilot, app)
        await until(pilot, lambda: len(picker.files.root.children) > 0)
        picker.files.move_cursor(next(n for n in picker.files.root.children if str(n.label) == "landscape.jpg"))
        await until(pilot, lambda: picker.previewed is not None and picker.query(Thumbnail))
        await pilot.pause()
        assert "image tokens" in str(picker.details.render())
        pane, details = picker.preview_pane.region, picker.details.region
        assert details.height >= 3 and details.bottom <= pane.bottom  # every line of the details is on screen
        assert picker.query_one(Thumbnail).region.height >= 3  # and a smaller picture above them


async def test_editing_keys_queued_in_the_picker_path_line_apply_in_order(pics):
    """As in the prompt (test_editing_keys_queued_among_typed_ones_apply_in_order): a Backspace or an arrow
    queued among typed keys edits where it came, and the Enter behind them attaches the path as typed."""
    from textual import events

    app, _ = make_app()
    FilePicker.last_dir = pics
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        keys = [*"landscapx", "backspace", *"e.jpgg", "left", "backspace", "end"]  # "landscape.jpg", edited
        for tree_first in (True, False):
            # the picker opens on the tree: typing there starts the path, and the keys queued behind the first
            # one still go to the tree (the focus moves later); and typed in the path line itself
            picker = await open_picker(pilot, app)
            await until(pilot, lambda p=picker: p.focused is p.files)
            if not tree_first:
                picker.path_line.focus()
                await until(pilot, lambda p=picker: p.focused is p.path_line)
            for key in keys:  # as the driver posts them, all at once
                app.post_message(events.Key(key, key if len(key) == 1 else None))
            app.post_message(events.Key("enter", "\r"))
            await until(pilot, lambda: not isinstance(app.screen, FilePicker))
            await until(pilot, lambda: chips(app) == ["landscape.jpg"], timeout=10)
            app.chat.attachments.take()
