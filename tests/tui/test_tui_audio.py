"""Audio clips in the chat screen (Textual pilot, scripted fake engine).

The ways in (the Ctrl+O picker, a pasted/dropped path, `/audio PATH [question]` in one Enter), the
chip (name and length), the clip in the conversation (name, length, one-line waveform), the content
items the engine receives, the refusals (a bad file; a pairing without audio, before anything is
read or sent, the typed prompt kept), and the history: saved, reopened and exported with the clip.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from pilot import make_app as shared_make_app
from pilot import ready, texts, turn, until
from support.fake_engine import FakeEngine
from textual import events

from app.tui.app import GemmaChatApp
from app.tui.history import HistoryRecorder
from app.tui.screens.file_picker import FilePicker
from app.tui.widgets.attachments import AttachmentChip, parse_attach_command, user_content
from app.tui.widgets.audio_clip import (
    WAVE_CHARS,
    AudioClipRow,
    AudioInfo,
    AudioStrip,
    inspect_audio,
    peaks_of,
    waveform_text,
)
from app.tui.widgets.thumbnail import MODE_ENV
from core.units import format_duration
from core.user.store import Store

SIZE = (110, 34)
PACK_CLIPS = Path(__file__).resolve().parents[1] / "data" / "pack" / "references" / "audio" / "inputs"
pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture(autouse=True)
def label_thumbnails(monkeypatch):
    monkeypatch.setenv(MODE_ENV, "label")
    monkeypatch.setattr(FilePicker, "last_dir", None)


@pytest.fixture
def clips(tmp_path) -> Path:
    """The pack's clips under plain and awkward names, a FLAC made here, and files that are no audio."""
    d = tmp_path / "clips"
    d.mkdir()
    shutil.copy(PACK_CLIPS / "sine_1s.pcm16.wav", d / "tone.wav")
    shutil.copy(PACK_CLIPS / "chirp_3p7s.pcm16.wav", d / "my chirp.wav")
    shutil.copy(PACK_CLIPS / "silence_2s.pcm16.wav", d / "silence.wav")
    t = np.arange(8000) / 8000
    sf.write(d / "ramp.flac", (0.5 * np.sin(2 * np.pi * 220 * t) * t).astype(np.float32), 8000)
    (d / "notes.txt").write_text("not audio")
    (d / "fake.wav").write_text("not audio either")
    (d / "empty.wav").write_bytes(b"")
    return d


def make_app(engine: FakeEngine | None = None, **kwargs) -> tuple[GemmaChatApp, FakeEngine]:
    app = shared_make_app(engine or FakeEngine(replies=["I hear a tone."]), **kwargs)
    return app, app.engine


async def submit(pilot, app, text: str) -> None:
    app.chat.prompt.focus()
    app.chat.prompt.text = text
    await pilot.press("enter")


def chips(app) -> list[str]:
    return [str(c.render()) for c in app.chat.attachments.query(AttachmentChip)]


def errors(app) -> list[str]:
    return [n.message for n in app._notifications if n.severity == "error"]


def last_user_content(engine):
    messages, _ = engine.chats[-1]
    return [m for m in messages if m["role"] == "user"][-1]["content"]


def clip_rows(app) -> list[str]:
    return [str(r.render()) for r in app.chat.conversation.query(AudioClipRow)]


# -- the ways in --------------------------------------------------------------------------------


async def test_picker_lists_audio_files_previews_a_clip_and_attaches_it(clips):
    app, engine = make_app()
    FilePicker.last_dir = clips
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        await pilot.press("ctrl+o")
        await until(pilot, lambda: isinstance(app.screen, FilePicker))
        picker = app.screen
        tree = picker.files
        await until(pilot, lambda: len(tree.root.children) > 0)
        names = sorted(str(n.label) for n in tree.root.children)
        assert "tone.wav" in names and "ramp.flac" in names and "notes.txt" not in names
        tree.move_cursor(next(n for n in tree.root.children if str(n.label) == "tone.wav"))
        await until(pilot, lambda: isinstance(picker.previewed, AudioInfo))
        details = str(picker.details.render())
        assert "audio 1.0 s, 16,000 Hz, 32.0 KB" in details and "▇" * 30 in details  # a steady tone at -6 dBFS
        await pilot.press("enter")
        await until(pilot, lambda: chips(app) == ["♪ tone.wav 1.0 s ✕"])
        await submit(pilot, app, "What do you hear?")
        await until(pilot, lambda: engine.turns and app.chat.reply is None)
        assert last_user_content(engine) == [
            {"type": "audio", "path": str(clips / "tone.wav")},
            {"type": "text", "text": "What do you hear?"},
        ]
        assert chips(app) == [] and app.chat.prompt.text == ""
        [row] = clip_rows(app)
        assert row.startswith("♪ tone.wav · 1.0 s  ") and set(row.split("  ")[-1]) <= set(WAVE_CHARS)
        assert len(row.split("  ")[-1]) == 32  # the one-line waveform


async def test_audio_command_attaches_and_sends_the_question_in_one_enter(clips):
    app, engine = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        await submit(pilot, app, f"/audio '{clips / 'my chirp.wav'}' {clips / 'ramp.flac'} what changes?")
        await until(pilot, lambda: engine.turns and app.chat.reply is None)
        assert last_user_content(engine) == [
            {"type": "audio", "path": str(clips / "my chirp.wav")},
            {"type": "audio", "path": str(clips / "ramp.flac")},
            {"type": "text", "text": "what changes?"},
        ]
        assert app.chat.prompt.text == "" and chips(app) == []
        rows = clip_rows(app)
        assert [r.split(" · ")[0] for r in rows] == ["♪ my chirp.wav", "♪ ramp.flac"]
        assert "3.7 s" in rows[0] and "1.0 s" in rows[1]
        assert texts(app)[0] == "U:what changes?"


async def test_audio_command_without_a_question_leaves_the_chip_for_the_next_message(clips):
    app, engine = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        await submit(pilot, app, f"/audio {clips / 'silence.wav'}")
        await until(pilot, lambda: chips(app) == ["♪ silence.wav 2.0 s ✕"])
        assert app.chat.prompt.text == "" and not engine.chats
        # a silent clip is a flat line: the lowest block all along
        info = app.chat.attachments.clips[0]
        assert set(waveform_text(info.peaks)) == {WAVE_CHARS[0]}


async def test_pasted_audio_path_becomes_a_chip_and_leaves_the_text(clips):
    app, engine = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        prompt = app.chat.prompt
        prompt.focus()
        escaped = str(clips / "my chirp.wav").replace(" ", "\\ ")
        app.post_message(events.Paste(f"{escaped} transcribe this"))
        await until(pilot, lambda: chips(app) == ["♪ my chirp.wav 3.7 s ✕"])
        assert prompt.text == "transcribe this"
        await pilot.press("enter")
        await until(pilot, lambda: engine.turns and app.chat.reply is None)
        assert last_user_content(engine)[0] == {"type": "audio", "path": str(clips / "my chirp.wav")}


async def test_a_chip_is_removed_with_delete(clips):
    app, _ = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        await submit(pilot, app, f"/audio {clips / 'tone.wav'}")
        await until(pilot, lambda: len(chips(app)) == 1)
        app.chat.attachments.query_one(AttachmentChip).focus()
        await pilot.press("delete")
        await until(pilot, lambda: chips(app) == [])
        assert app.chat.attachments.clips == []


# -- refusals -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("notes.txt", "is not an audio file gemma-chat can read (WAV, FLAC, OGG/Vorbis, MP3)."),
        ("fake.wav", "is not an audio file gemma-chat can read"),
        ("empty.wav", "Audio file 'empty.wav' is empty (0 bytes)."),
        ("gone.wav", "Audio file not found:"),
        (".", "is a folder, not an audio file."),
    ],
)
async def test_a_bad_file_is_one_line_and_the_command_stays(clips, name, message):
    app, engine = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        typed = f"/audio {clips / name} what is it?"
        await submit(pilot, app, typed)
        await until(pilot, lambda: errors(app))
        [error] = errors(app)
        assert error.startswith("Not attached: ") and message in error and "\n" not in error
        assert app.chat.prompt.text == typed and chips(app) == [] and not engine.chats


async def test_a_pairing_without_audio_refuses_before_anything_is_read(clips, monkeypatch):
    import app.tui.widgets.attachments as attachments

    read: list[str] = []
    monkeypatch.setattr(attachments, "inspect_audio", lambda p: read.append(p) or inspect_audio(p))
    app, engine = make_app(FakeEngine(has_audio=False), name="31B")
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        typed = f"/audio {clips / 'tone.wav'} what is it?"
        await submit(pilot, app, typed)
        await until(pilot, lambda: errors(app))
        assert errors(app) == [
            "Not attached: 31B does not take audio: Gemma 4 E2B, E4B and 12B do (26B-A4B and 31B do not). "
            "Pick E2B, E4B or 12B (F2)."
        ]
        assert app.chat.prompt.text == typed and chips(app) == []
        app.chat.prompt.text = ""
        app.post_message(events.Paste(f"{clips / 'tone.wav'} and this"))  # a dropped file: the same refusal
        await until(pilot, lambda: len(errors(app)) == 2)
        assert app.chat.prompt.text == f"{clips / 'tone.wav'} and this"  # the path stays in the text
        # the picker still opens (images work); its preview says why a clip cannot go
        FilePicker.last_dir = clips
        await pilot.press("ctrl+o")
        await until(pilot, lambda: isinstance(app.screen, FilePicker))
        picker = app.screen
        await until(pilot, lambda: len(picker.files.root.children) > 0)
        picker.files.move_cursor(next(n for n in picker.files.root.children if str(n.label) == "tone.wav"))
        await until(pilot, lambda: "does not take audio" in str(picker.details.render()))
        await pilot.press("escape")
        assert not engine.chats
    assert read == []  # refused from the pairing's word alone: the file was never decoded (the preview apart)


async def test_the_demo_refuses_audio_while_it_is_still_loading(clips):
    app, engine = make_app(FakeEngine(hold_load=True), demo=True)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert not app.session.loaded
        typed = f"/audio {clips / 'tone.wav'} hi"
        await submit(pilot, app, typed)
        await until(pilot, lambda: errors(app))
        assert "demo (random weights) does not take audio" in errors(app)[0]
        assert app.chat.prompt.text == typed and chips(app) == []
        engine.release_load()


async def test_a_clip_attached_while_loading_is_not_sent_to_a_pairing_without_audio(clips):
    app, engine = make_app(FakeEngine(hold_load=True, has_audio=False), name="26B-A4B")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await submit(pilot, app, f"/audio {clips / 'tone.wav'}")  # not known yet: attached
        await until(pilot, lambda: len(chips(app)) == 1)
        engine.release_load()
        await ready(pilot, app)
        await submit(pilot, app, "what is it?")
        await until(pilot, lambda: errors(app))
        assert errors(app)[-1].startswith("Not sent: 26B-A4B does not take audio")
        assert app.chat.prompt.text == "what is it?" and len(chips(app)) == 1 and not engine.chats


async def test_a_failed_turn_gives_the_clip_back(clips):
    app, engine = make_app(FakeEngine(chat_error="the server went away"))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        await submit(pilot, app, f"/audio {clips / 'tone.wav'} listen")
        await until(pilot, lambda: engine.turns and app.chat.reply is None)
        await until(pilot, lambda: chips(app) == ["♪ tone.wav 1.0 s ✕"])
        assert app.chat.prompt.text == "listen" and clip_rows(app) == []


# -- history and export -------------------------------------------------------------------------


async def test_a_clip_is_saved_reopened_sent_again_and_exported(clips, tmp_path):
    db = tmp_path / "h.sqlite3"
    clip = str(clips / "tone.wav")
    app, _ = make_app(FakeEngine(replies=["a tone"]), history=HistoryRecorder(path=db, export_dir=tmp_path / "out"))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        await submit(pilot, app, f"/audio {clip} what is it?")
        await until(pilot, lambda: len(app.chat.history) == 2)
        await asyncio.to_thread(app.history.flush)
    app.history.close()
    with Store(db) as store:
        chat = store.load_chat(store.list_chats()[0].id)
        [msg, _] = chat.messages
        assert [a.path for a in msg.attachments] == [clip] and msg.attachments[0].kind == "audio"
        assert chat.engine_messages()[0]["content"] == [
            {"type": "audio", "path": clip},
            {"type": "text", "text": "what is it?"},
        ]

    recorder = HistoryRecorder(path=db, export_dir=tmp_path / "out")
    app2, engine2 = make_app(FakeEngine(replies=["more"]), history=recorder)
    async with app2.run_test(size=SIZE) as pilot:
        await ready(pilot, app2)
        await pilot.press("ctrl+l")
        await until(pilot, lambda: app2.screen is not app2.chat and getattr(app2.screen, "loaded", False))
        await pilot.press("enter")
        await until(pilot, lambda: len(texts(app2)) == 2)
        assert texts(app2)[0] == "U:what is it?"
        await until(pilot, lambda: clip_rows(app2) and "reading" not in clip_rows(app2)[0])
        [row] = clip_rows(app2)
        assert row.startswith("♪ tone.wav · 1.0 s  ") and row.endswith("▇" * 32)
        await turn(pilot, "and now?")
        first = engine2.chats[-1][0][0]
        assert first["content"][0] == {"type": "audio", "path": clip}
        await pilot.press("ctrl+s")
        await until(pilot, lambda: list((tmp_path / "out").glob("*.md")))
    app2.history.close()
    [path] = (tmp_path / "out").glob("*.md")
    assert f"[audio: tone.wav, 1.0 s]({clip})" in path.read_text()


async def test_a_reopened_chat_whose_clip_is_gone_says_so(clips, tmp_path):
    app, _ = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        strip = AudioStrip(paths=[str(clips / "moved.wav"), str(clips / "notes.txt")])
        await app.chat.conversation.mount(strip)
        await until(pilot, lambda: all("reading" not in r for r in clip_rows(app)))
        assert clip_rows(app) == ["♪ moved.wav · file missing", "♪ notes.txt · cannot be read"]


# -- the pieces ---------------------------------------------------------------------------------


def test_waveform_levels_follow_the_peaks_in_decibels():
    assert waveform_text([0.0, 1.0]) == WAVE_CHARS[0] + WAVE_CHARS[-1]
    assert waveform_text([10 ** (-24 / 20)]) == WAVE_CHARS[4]  # -24 dBFS: half way up the -48..0 scale
    assert len(waveform_text([0.5] * 64)) == 32 and len(waveform_text([0.5] * 10)) == 10
    assert waveform_text([]) == ""
    x = np.zeros(1000, dtype=np.float32)
    x[900] = -0.8
    peaks = peaks_of(x, 10)
    assert len(peaks) == 10 and peaks[9] == pytest.approx(0.8) and max(peaks[:9]) == 0.0


def test_durations_and_commands():
    lengths = [format_duration(s) for s in (0.25, 3.72, 59.9, 65, 3723)]
    assert lengths == ["0.25 s", "3.7 s", "59.9 s", "1:05", "1:02:03"]
    assert parse_attach_command("/audio", "/audio") == ([], "")
    assert parse_attach_command("/audiobook", "/audio") is None
    assert parse_attach_command("/audio notes.txt what /tmp/b.flac is", "/audio") == (
        ["notes.txt", "/tmp/b.flac"],
        "what is",
    )
    info = AudioInfo("/x/a.wav", 1.0, 16000, 32044)
    assert user_content("hi", [info]) == [{"type": "audio", "path": "/x/a.wav"}, {"type": "text", "text": "hi"}]


# -- the models screen --------------------------------------------------------------------------


async def test_the_models_screen_says_which_pairings_take_audio_at_80_columns(tmp_path, monkeypatch):
    from app.tui.screens.models import DEMO_KEY, ModelsOptions, ModelsScreen
    from core.hub import fit

    monkeypatch.setenv("GEMMA_CHAT_CONFIG", str(tmp_path / "config.toml"))
    machine = fit.MachineMemory(16 * 10**9, 16 * 10**9, "test machine")
    app, _ = make_app(models_options=ModelsOptions(cache_dir=str(tmp_path), machine=machine))
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot, app)
        await pilot.press("f2")
        await until(pilot, lambda: isinstance(app.screen, ModelsScreen) and app.screen.loaded_once)
        screen = app.screen
        table = screen.table

        def takes(key: str) -> str:  # 80 columns: the narrow table's Takes column stands for Vision and Audio
            value = table.get_cell(key, "takes")
            return value if isinstance(value, str) else value.plain

        assert [takes(k) for k in (DEMO_KEY, "e2b", "e4b", "12b", "26b-a4b", "31b")] == [
            "img", "img+aud", "img+aud", "img+aud", "img", "img"
        ]  # fmt: skip
        for key, said in [("e2b", "Takes text, images and audio."), ("31b", "Takes text and images (no audio).")]:
            table.move_cursor(row=table.get_row_index(key))
            await pilot.pause(0.1)
            details = str(screen.details.render())
            assert said in details.replace("\n", " ")
            # the details are in view at 80 columns: inside the screen, not clipped off its right edge
            assert screen.details.region.right <= 80 and screen.details.region.height > 0
