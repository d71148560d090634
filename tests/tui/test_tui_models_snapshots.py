"""SVG snapshots of the models screen (a pairing selected; the first-run welcome), with the fake engine.

Deterministic: a fixed terminal size, a fixed machine memory (`ModelsOptions.machine`), and a
temporary HF cache laid out with fixed file sizes, so statuses, sizes and fit never depend on
this machine. Update with `pytest tests/tui/test_tui_models_snapshots.py --snapshot-update`, then LOOK.
"""

from __future__ import annotations

import time

import pytest
from fakehub import put_in_cache
from pilot import make_app as shared_make_app

from app.tui.app import GemmaChatApp
from app.tui.screens.models import ModelsOptions, ModelsScreen
from core.hub import catalog, fit

SIZE = (120, 36)
MACHINE = fit.MachineMemory(16 * 10**9, 16 * 10**9, "test machine")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("GEMMA_CHAT_CACHE_DIR", str(tmp_path / "gc-cache"))
    monkeypatch.setenv("GEMMA_CHAT_CONFIG", str(tmp_path / "config.toml"))
    return tmp_path / "hub-cache"


def fill(cache, pairings: dict[str, bool]) -> None:
    """Lay out pairings in the cache: name -> complete (False: the target's weights half there)."""
    for name, complete in pairings.items():
        p = catalog.get_pairing(name)
        target = {"config.json": b'{"model_type": "gemma4"}', "model.safetensors": b"\1" * 3_000_000}
        drafter = {"config.json": b'{"model_type": "gemma4_assistant"}', "model.safetensors": b"\2" * 2_000_000}
        put_in_cache(cache, p.target_repo, target, complete=complete)
        put_in_cache(cache, p.drafter_repo, drafter)


def make_app(cache, *, first_run: bool = False) -> GemmaChatApp:
    options = ModelsOptions(cache_dir=str(cache), machine=MACHINE)
    return shared_make_app(name="E2B", demo=first_run, models_options=options, first_run=first_run, blink=False)


async def _until(pilot, predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await pilot.pause(0.02)


def test_models_screen_with_a_pairing_selected(snap_compare, cache):
    fill(cache, {"e2b-4bit": True, "e4b-4bit": False})

    async def run_before(pilot):
        app = pilot.app
        await _until(pilot, lambda: app.session.loaded)
        await pilot.press("f2")
        await _until(pilot, lambda: isinstance(app.screen, ModelsScreen) and app.screen.loaded_once)
        app.screen.select("e4b-4bit")
        await pilot.pause(0.1)

    assert snap_compare(make_app(cache), terminal_size=SIZE, run_before=run_before)


def test_models_screen_first_run(snap_compare, cache):
    """Nothing downloaded but a cancelled download's partial bytes: the demo is offered."""
    fill(cache, {"e4b-4bit": False})

    async def run_before(pilot):
        app = pilot.app
        await _until(pilot, lambda: isinstance(app.screen, ModelsScreen) and app.screen.loaded_once)
        await pilot.pause(0.1)

    assert snap_compare(make_app(cache, first_run=True), terminal_size=SIZE, run_before=run_before)


def test_models_screen_first_run_at_80_columns(snap_compare, cache):
    """What a new user on an 80x24 terminal sees first: the narrow table (no sideways scrolling)."""
    fill(cache, {"e4b-4bit": False})

    async def run_before(pilot):
        app = pilot.app
        await _until(pilot, lambda: isinstance(app.screen, ModelsScreen) and app.screen.loaded_once)
        app.screen.select("e2b-4bit")
        await pilot.pause(0.1)

    assert snap_compare(make_app(cache, first_run=True), terminal_size=(80, 24), run_before=run_before)
