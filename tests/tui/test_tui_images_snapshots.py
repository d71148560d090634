"""SVG snapshots of image attachments: a sent image's thumbnail (the text-label fallback) with a chip
waiting above the prompt, and the file picker's preview (half-cell blocks, deterministic).

Update with `pytest tests/tui/test_tui_images_snapshots.py --snapshot-update`, then LOOK at the SVGs.
"""

from __future__ import annotations

import time

import pytest
from pilot import make_app as shared_make_app

from app.resources import assets_dir
from app.tui.app import GemmaChatApp
from app.tui.screens.file_picker import FilePicker
from app.tui.widgets.attachments import AttachmentChip
from app.tui.widgets.thumbnail import MODE_ENV

SIZE = (120, 36)
SAMPLES = assets_dir() / "images"


def make_app() -> GemmaChatApp:
    return shared_make_app(name="E2B", replies=["A green hill under a blue sky."], blink=False)


async def _until(pilot, predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await pilot.pause(0.02)


@pytest.fixture(autouse=True)
def _no_last_dir(monkeypatch):
    monkeypatch.setattr(FilePicker, "last_dir", None)


def test_image_thumbnail_in_conversation_and_chip(snap_compare, monkeypatch):
    monkeypatch.setenv(MODE_ENV, "label")

    async def run_before(pilot):
        app = pilot.app
        await _until(pilot, lambda: app.session.loaded)
        app.chat.attachments.attach([str(SAMPLES / "landscape.jpg")])
        await _until(pilot, lambda: app.chat.attachments.images)
        app.chat.prompt.text = "What is in this picture?"
        await pilot.press("enter")
        await _until(pilot, lambda: app.chat.last_reply is not None)
        app.chat.attachments.attach([str(SAMPLES / "chart.png")])
        await _until(pilot, lambda: len(app.chat.query(AttachmentChip)) == 1)
        app.chat.prompt.text = "And this one?"
        app.chat.prompt.cursor_blink = False  # a blinking cursor's phase would vary from run to run
        await pilot.pause(0.3)

    assert snap_compare(make_app(), terminal_size=SIZE, run_before=run_before)


def test_file_picker_preview(snap_compare, monkeypatch):
    monkeypatch.setenv(MODE_ENV, "halfcell")
    monkeypatch.chdir(assets_dir())  # the tree's root label is the start folder as given: "images"

    async def run_before(pilot):
        app = pilot.app
        await _until(pilot, lambda: app.session.loaded)
        app.push_screen(FilePicker("images", app.engine.info))
        await _until(pilot, lambda: isinstance(app.screen, FilePicker))
        picker = app.screen
        await _until(pilot, lambda: len(picker.files.root.children) == 3)
        node = next(n for n in picker.files.root.children if str(n.label) == "landscape.jpg")
        picker.files.move_cursor(node)
        await _until(pilot, lambda: picker.previewed is not None)
        await pilot.pause(0.3)

    assert snap_compare(make_app(), terminal_size=SIZE, run_before=run_before)
