"""SVG snapshots of the chat screen (both views) and the help screen, with the scripted fake engine.

Deterministic: fixed terminal size, the fake engine's statistics use virtual time, and every shot is
taken after the turn has finished (the panels then show the engine's TurnStats, not live clocks).
Update with `pytest tests/tui/test_tui_snapshots.py --snapshot-update`, then LOOK at the SVGs.
"""

from __future__ import annotations

import time

from pilot import make_app as shared_make_app

from app.tui.app import GemmaChatApp

SIZE = (120, 36)


def make_app(demo: bool = False) -> GemmaChatApp:
    return shared_make_app(name="E2B", demo=demo, blink=False)  # a blinking cursor would make the shots flaky


async def _until(pilot, predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await pilot.pause(0.02)


async def _settle(pilot) -> None:
    """The panels repaint on their own timer (4 Hz): wait until it has taken the latest numbers."""
    app = pilot.app
    app.chat.prompt.cursor_blink = False  # the empty prompt's cursor sits on the placeholder: its blink phase varies
    app.chat.stats.dirty = True  # whatever changed last, one more panel refresh shows it
    await _until(pilot, lambda: not app.chat.stats.dirty)
    await pilot.pause(0.1)  # and the markdown / the frame settle


async def _one_turn(pilot) -> None:
    app = pilot.app
    await _until(pilot, lambda: app.session.loaded)
    app.chat.prompt.text = "What does speculative decoding do?"
    await pilot.press("enter")
    await _until(pilot, lambda: app.chat.last_reply is not None)
    await _settle(pilot)


def test_chat_token_view(snap_compare):
    assert snap_compare(make_app(), terminal_size=SIZE, run_before=_one_turn)


def test_chat_rendered_view(snap_compare):
    async def run_before(pilot):
        await _one_turn(pilot)
        await pilot.press("ctrl+t")
        await pilot.pause(0.3)

    assert snap_compare(make_app(), terminal_size=SIZE, run_before=run_before)


def test_chat_demo_stopped_reply(snap_compare):
    """The demo label, a stopped reply and drafter off in the panel."""

    async def run_before(pilot):
        app = pilot.app
        engine = app.engine
        engine.step = True
        await _until(pilot, lambda: app.session.loaded)
        app.chat.prompt.text = "Tell me a story"
        await pilot.press("enter")
        engine.allow(3)
        await _until(pilot, lambda: len(engine.rounds) == 3 and app.chat.reply.token_count == len(engine.tokens))
        await pilot.press("escape")
        await _until(pilot, lambda: app.chat.reply is None)
        await pilot.press("f8")  # drafter off: shown in the panel
        await _settle(pilot)

    assert snap_compare(make_app(demo=True), terminal_size=SIZE, run_before=run_before)


def test_help_screen(snap_compare):
    async def run_before(pilot):
        await _until(pilot, lambda: pilot.app.session.loaded)
        await pilot.press("f1")
        await pilot.pause(0.1)

    assert snap_compare(make_app(), terminal_size=SIZE, run_before=run_before)
