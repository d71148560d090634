"""The settings screen (F3): reads the config file, writes back only what changed (comments kept),
names the field of a bad value, and applies theme / defaults / block size to the running app."""

from __future__ import annotations

import pytest
from pilot import make_app as shared_make_app
from pilot import until
from support.fake_engine import PairingSpec

from app.tui.history import HistoryRecorder
from app.tui.screens.settings import SettingsScreen
from core.user.config import load_config

SIZE = (110, 40)
pytestmark = pytest.mark.anyio

CONFIG_TEXT = """\
# my own notes: keep this line
block_size = 4  # a fixed K for my tests

[sampling]
temperature = 0.2   # a little randomness
top_k = 0
"""


@pytest.fixture
def anyio_backend():
    return "asyncio"


def make_app(tmp_path, text: str = CONFIG_TEXT):
    path = tmp_path / "config.toml"
    path.write_text(text)
    config = load_config(path)
    spec = PairingSpec("fake", "t", "d")
    history = HistoryRecorder(path=tmp_path / "h.sqlite3")
    return shared_make_app(spec=spec, settings=config.generation_settings(), config=config, history=history), path


async def open_settings(pilot) -> SettingsScreen:
    await until(pilot, lambda: pilot.app.session.loaded)
    await pilot.press("f3")
    await until(pilot, lambda: isinstance(pilot.app.screen, SettingsScreen) and pilot.app.screen.config is not None)
    return pilot.app.screen


async def test_settings_save_keeps_comments_and_applies(tmp_path):
    app, path = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_settings(pilot)
        assert screen.query_one("#set-block_size").value == "4"
        assert screen.query_one("#set-temperature").value == "0.2"
        screen.query_one("#set-temperature").value = "0.8"
        screen.query_one("#set-seed").value = "11"
        screen.query_one("#set-block_size").value = "auto"
        screen.query_one("#set-theme").value = "nord"
        screen.query_one("#set-offline").value = True
        await pilot.press("ctrl+s")
        await until(pilot, lambda: pilot.app.screen is app.chat)
        assert app.theme == "nord"
        assert app.session.controls.block_size == "auto"
        assert app.engine.calls_named("set_block_size")[-1].arg == "auto"
        # a new chat takes the new defaults
        await pilot.press("ctrl+n")
        assert app.chat.settings.temperature == 0.8 and app.chat.settings.seed == 11
    app.history.close()
    text = path.read_text()
    assert "# my own notes: keep this line" in text
    assert "# a little randomness" in text
    assert "temperature = 0.8" in text and "seed = 11" in text and 'block_size = "auto"' in text
    assert "offline = true" in text and 'theme = "nord"' in text
    assert "top_k = 0" in text  # untouched keys stay as written
    config = load_config(path)
    assert (config.sampling.temperature, config.sampling.seed, config.offline) == (0.8, 11, True)


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("block_size", "17", "Block size: must be an integer 1..16 or \"auto\", got '17'"),
        ("top_p", "0", "Top-p: must be a number > 0 and <= 1, got 0"),
        ("max_tokens", "lots", "Max tokens: must be an integer, got 'lots'"),
    ],
)
async def test_settings_bad_value_names_the_field_and_writes_nothing(tmp_path, field, value, message):
    app, path = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_settings(pilot)
        screen.query_one(f"#set-{field}").value = value
        await pilot.press("ctrl+s")
        await pilot.pause(0.1)
        assert pilot.app.screen is screen
        assert message in str(screen.query_one("#settings-error").render())
        await pilot.press("escape")
        await until(pilot, lambda: pilot.app.screen is app.chat)
    app.history.close()
    assert path.read_text() == CONFIG_TEXT


async def test_settings_shows_a_broken_file_instead_of_overwriting_it(tmp_path):
    app, path = make_app(tmp_path, CONFIG_TEXT)
    path.write_text("temperature = 0.5\n")  # wrong place: [sampling].temperature
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.session.loaded)
        await pilot.press("f3")
        await until(
            pilot,
            lambda: (
                isinstance(app.screen, SettingsScreen)
                and "did you mean [sampling].temperature" in str(app.screen.query_one("#settings-error").render())
            ),
        )
        assert app.screen.query_one("#settings-save").disabled
    app.history.close()
