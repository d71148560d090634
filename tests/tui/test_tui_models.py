"""The models screen with the scripted fake engine and the local fake hub (tests/fakehub.py).

Every test has its own HF cache, gemma-chat cache and config file under tmp_path; downloads go to
the fake hub on 127.0.0.1 through `endpoint=`, never the network.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import socket

import pytest
from fakehub import FakeHub, FakeRepo, put_in_cache
from pilot import make_app as shared_make_app
from pilot import until as _until
from support.fake_engine import PairingSpec
from textual.command import CommandPalette

from app.commands.tui import is_first_run
from app.tui.screens.chat import ChatScreen
from app.tui.screens.confirm import ConfirmScreen
from app.tui.screens.models import DEMO_KEY, OFFLINE_MESSAGE, ModelsOptions, ModelsScreen
from core.hub import catalog, fit
from core.hub import download as dl
from core.user.config import load_config

pytestmark = pytest.mark.anyio
SIZE = (120, 36)
BIG_MACHINE = fit.MachineMemory(16 * 10**9, 16 * 10**9, "test machine")
TINY_MACHINE = fit.MachineMemory(10**9, 10**9, "tiny test machine")
NAME = "e2b-4bit"
PAIRING = catalog.get_pairing(NAME)
BIG = 4 * 1024 * 1024


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # the download child reads it at import
    monkeypatch.setenv("GEMMA_CHAT_CACHE_DIR", str(tmp_path / "gc-cache"))  # the demo is built here
    monkeypatch.setenv("GEMMA_CHAT_CONFIG", str(tmp_path / "config.toml"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    path = tmp_path / "hub-cache"
    path.mkdir()
    return path


def files(model_type: str, size: int = 1000) -> dict[str, bytes]:
    return {
        "config.json": f'{{"model_type": "{model_type}"}}'.encode(),
        "model.safetensors": os.urandom(size),
        "tokenizer.json": b'{"version": "1.0"}',
    }


def hub_repos(target_size: int = BIG, **target_kw) -> dict[str, FakeRepo]:
    return {
        PAIRING.target_repo: FakeRepo(files("gemma4", target_size), **target_kw),
        PAIRING.drafter_repo: FakeRepo(files("gemma4_assistant", 2000)),
    }


def put_pairing(cache, name: str = NAME, complete: bool = True):
    p = catalog.get_pairing(name)
    target = put_in_cache(cache, p.target_repo, files("gemma4", 5000), complete=complete)
    drafter = put_in_cache(cache, p.drafter_repo, files("gemma4_assistant", 3000))
    return target, drafter


def make_app(cache, *, machine=BIG_MACHINE, endpoint=None, offline=False, spec=None, first_run=False, remember=False):
    options = ModelsOptions(
        cache_dir=str(cache), endpoint=endpoint, offline=offline, machine=machine, remember=remember
    )
    app = shared_make_app(spec=spec, models_options=options, first_run=first_run)
    return app, app.engine


async def until(pilot, predicate, timeout: float = 10.0) -> None:
    await _until(pilot, predicate, timeout)  # downloads and loads get a longer default


async def open_models(pilot, app) -> ModelsScreen:
    await until(pilot, lambda: app.session.loaded)
    await pilot.press("f2")
    await until(pilot, lambda: isinstance(app.screen, ModelsScreen) and app.screen.loaded_once)
    return app.screen


def cell(screen: ModelsScreen, key: str, column: str) -> str:
    value = screen.table.get_cell(key, column)
    return value if isinstance(value, str) else value.plain


async def download(pilot, screen: ModelsScreen, timeout: float = 30.0):
    await pilot.press("d")
    # A refused connection can end the download before the key press returns: started is running or ended.
    assert screen.downloading or screen.download_result is not None
    await until(pilot, lambda: screen.download_result is not None, timeout)
    return screen.download_result


# -- the list ---------------------------------------------------------------------------------------


async def test_list_shows_demo_local_status_fit_and_other_checkpoints(cache):
    put_pairing(cache, NAME)
    put_pairing(cache, "e4b-4bit", complete=False)  # the target's weights half there
    put_in_cache(cache, "someone/gemma-4-custom-it", files("gemma4"))
    app, _ = make_app(cache)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_models(pilot, app)
        keys = [r.key for r in screen.rows]
        assert keys[0] == DEMO_KEY and "demo  tiny trained model, offline" in cell(screen, DEMO_KEY, "pairing")
        assert keys[1 : 1 + len(catalog.load_catalog().pairings)] == catalog.load_catalog().names()
        assert cell(screen, NAME, "status") == "ready"
        assert cell(screen, "e4b-4bit", "status").startswith("partial")
        assert cell(screen, "e2b", "status") == "drafter only"  # the drafter came with e2b-4bit
        assert cell(screen, "26b-a4b", "status") == "not downloaded"
        assert cell(screen, "31b", "fit") == "won't fit" and cell(screen, NAME, "fit") == "ok"
        assert cell(screen, NAME, "vision") == "yes" and cell(screen, NAME, "block") == str(PAIRING.block_size)
        assert cell(screen, NAME, "download") == f"{PAIRING.download_bytes / 1e9:.1f} GB"
        assert "unconfirmed" in cell(screen, "31b-8bit", "repo") and cell(screen, NAME, "repo") == "confirmed"
        assert "other:someone/gemma-4-custom-it" in keys
        screen.select(NAME)
        await pilot.pause()
        details = str(screen.details.content)
        assert PAIRING.target_repo in details and PAIRING.drafter_repo in details and "16.0 GB" in details


async def test_at_80_columns_the_table_fits_without_scrolling_sideways_and_widens_again(cache):
    put_pairing(cache, NAME)
    put_in_cache(cache, "someone/gemma-4-custom-it", files("gemma4"))
    app, _ = make_app(cache)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await open_models(pilot, app)
        table = screen.table
        assert screen.narrow and [c.label.plain for c in table.columns.values()] == [
            "Pairing", "Fit", "Memory", "Status", "Download", "Takes"
        ]  # fmt: skip
        assert table.virtual_size.width <= table.scrollable_content_region.width  # nothing off to the right
        assert table.max_scroll_x == 0
        assert cell(screen, NAME, "pairing") == NAME and cell(screen, NAME, "status") == "ready"
        assert cell(screen, NAME, "takes") == "img+aud" and cell(screen, "31b", "takes") == "img"
        assert cell(screen, "31b", "fit") == "won't fit"
        assert cell(screen, "other:someone/gemma-4-custom-it", "pairing") == "gemma-4-custom-it"
        screen.select("e4b-4bit")
        await pilot.pause()
        details = str(screen.details.content)  # what the narrow table leaves out is said for the row in view
        assert "E4B 4bit" in details and "Suggested block size" in details and "images and audio" in details

        await pilot.resize_terminal(120, 36)
        await until(pilot, lambda: not screen.narrow)
        assert len(table.columns) == 9 and cell(screen, NAME, "block") == str(PAIRING.block_size)
        assert screen.selected_key == "e4b-4bit"  # the highlighted row stays
        assert table.max_scroll_x == 0
        await pilot.resize_terminal(80, 24)
        await until(pilot, lambda: screen.narrow)
        assert screen.selected_key == "e4b-4bit" and table.max_scroll_x == 0


async def test_a_pairing_asked_for_by_name_before_its_download_is_offered_at_start(cache):
    """`gemma-chat --pairing NAME` with NAME not downloaded: the app opens over the demo with the models
    screen on NAME, saying how to download and use it (the command used to end with "run `models download`")."""
    with FakeHub(repos=hub_repos()) as hub:
        app, _ = make_app(cache, endpoint=hub.url)
        app.offer_download = NAME
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: isinstance(app.screen, ModelsScreen) and app.screen.loaded_once)
            screen = app.screen
            assert screen.selected_key == NAME
            size = f"{PAIRING.download_bytes / 1e9:.1f} GB"
            said = f"{NAME} is not downloaded yet: press d to download it ({size}), then Enter to use it."
            assert screen.message == said + " Esc: the demo."
            result = await download(pilot, screen)
            assert isinstance(result, dl.DownloadFinished), screen.message
            await until(pilot, lambda: cell(screen, NAME, "status") == "ready")


async def test_a_pairing_asked_for_by_name_that_is_partly_here_is_offered_to_finish(cache):
    put_pairing(cache, NAME, complete=False)  # a download stopped part way
    app, _ = make_app(cache)
    app.offer_download = NAME
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: isinstance(app.screen, ModelsScreen) and app.screen.loaded_once)
        screen = app.screen
        assert screen.selected_key == NAME and cell(screen, NAME, "status").startswith("partial")
        assert screen.message.startswith(f"{NAME} is partly downloaded (") and "press d to finish" in screen.message


def test_pairing_not_downloaded_is_said_and_offered_unless_offline(cache, monkeypatch, capsys):
    import huggingface_hub.constants

    from app.commands import tui

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))  # not this machine's cache
    offered = []

    def run_app(engine, spec, *args, **kwargs):  # what the app would open (the engine made for it, closed)
        engine.close()
        offered.append((spec, kwargs["download"]))
        return 0

    monkeypatch.setattr(tui, "run_app", run_app)
    flags = dict.fromkeys(tui.CLI_SETTINGS)
    args = argparse.Namespace(demo=False, model=None, drafter=None, pairing=NAME, connect=None, offline=False, **flags)
    assert tui.run(args) == 0
    spec, download = offered[0]
    assert spec.demo and download == NAME
    assert load_config().default_pairing is None  # remembered once it is used, not before its download
    args.offline = True
    assert tui.run(args) == 2
    assert f"pairing {NAME} is not downloaded" in capsys.readouterr().err


# -- download ---------------------------------------------------------------------------------------


async def test_download_shows_progress_to_100_percent_and_the_row_becomes_ready(cache):
    with FakeHub(repos=hub_repos(), throttle_s=0.002) as hub:
        app, _ = make_app(cache, endpoint=hub.url)
        async with app.run_test(size=SIZE) as pilot:
            screen = await open_models(pilot, app)
            screen.select(NAME)
            assert cell(screen, NAME, "status") == "not downloaded"
            result = await download(pilot, screen)
            assert isinstance(result, dl.DownloadFinished), screen.message
            last = screen.last_progress
            assert last.done_bytes == last.total_bytes > BIG and last.files_done == last.files_total == 6
            assert screen.bar.percentage == 1.0
            assert "100%" in str(screen.progress.content)
            await until(pilot, lambda: cell(screen, NAME, "status") == "ready")
            assert "downloaded" in screen.message
    assert catalog.resolve_pairing(NAME, cache_dir=cache).target_path.is_dir()


async def test_cancel_mid_download_then_resume_to_completion(cache):
    hub = FakeHub(repos=hub_repos(), throttle_s=0.03)  # ~2 MB/s: slow enough to cancel mid-file
    with hub:
        app, _ = make_app(cache, endpoint=hub.url)
        async with app.run_test(size=SIZE) as pilot:
            screen = await open_models(pilot, app)
            screen.select(NAME)
            await pilot.press("d")
            await until(
                pilot,
                lambda: (
                    (p := screen.last_progress) is not None
                    and p.repo_id == PAIRING.target_repo
                    and p.filename == "model.safetensors"
                    and p.file_done >= 2 * dl.CHUNK_BYTES
                ),
                timeout=30,
            )
            assert "MB/s" in str(screen.progress.content) and "model.safetensors" in str(screen.progress.content)
            await pilot.press("x")
            await until(pilot, lambda: screen.download_result is not None)
            assert isinstance(screen.download_result, dl.DownloadCancelled)
            assert "d resumes" in screen.message
            await until(pilot, lambda: cell(screen, NAME, "status").startswith("partial"))

            hub.throttle_s = 0.0
            result = await download(pilot, screen)
            assert isinstance(result, dl.DownloadFinished), screen.message
            # The second run asked only for the missing tail of the big file.
            assert hub.file_gets("model.safetensors")[-1].startswith("bytes=")
            await until(pilot, lambda: cell(screen, NAME, "status") == "ready")
    snap = catalog.resolve_pairing(NAME, cache_dir=cache).target_path
    assert (snap / "model.safetensors").read_bytes() == hub.repos[PAIRING.target_repo].files["model.safetensors"]


async def test_download_errors_are_shown_gated_repo(cache):
    with FakeHub(repos=hub_repos(1000, gated=True)) as hub:
        app, _ = make_app(cache, endpoint=hub.url)
        async with app.run_test(size=SIZE) as pilot:
            screen = await open_models(pilot, app)
            screen.select(NAME)
            result = await download(pilot, screen)
            assert isinstance(result, dl.DownloadFailed) and result.kind == "gated"
            assert "is gated" in screen.message and "HF_TOKEN" in screen.message
            assert screen.notice.has_class("-error")
            assert not screen.bar.display
            await until(pilot, lambda: cell(screen, NAME, "status") == "not downloaded")


async def test_download_errors_are_shown_no_network(cache):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    app, _ = make_app(cache, endpoint=f"http://127.0.0.1:{port}")
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_models(pilot, app)
        screen.select(NAME)
        result = await download(pilot, screen)
        assert isinstance(result, dl.DownloadFailed) and result.kind == "network"
        assert "cannot reach" in screen.message and "demo" in screen.message
        assert screen.message.lower().count("check") == 1, screen.message  # said once, by the core's message


async def test_leaving_mid_download_pauses_it_and_the_palette_opens_the_screen_again(cache):
    with FakeHub(repos=hub_repos(), throttle_s=0.03) as hub:
        app, _ = make_app(cache, endpoint=hub.url)
        async with app.run_test(size=SIZE) as pilot:
            screen = await open_models(pilot, app)
            screen.select(NAME)
            await pilot.press("d")
            await until(
                pilot, lambda: (p := screen.last_progress) is not None and p.repo_id == PAIRING.target_repo, timeout=30
            )
            handle = screen.download_handle
            await pilot.press("escape")
            await until(pilot, lambda: isinstance(app.screen, ChatScreen))
            await until(pilot, lambda: handle.result is not None)
            assert isinstance(handle.result, dl.DownloadCancelled) and not handle.running
            await pilot.press("ctrl+p")
            await until(pilot, lambda: isinstance(app.screen, CommandPalette))
            await pilot.press(*"models", "enter")
            await until(pilot, lambda: isinstance(app.screen, ModelsScreen) and app.screen.loaded_once)
            assert cell(app.screen, NAME, "status").startswith("partial")


async def test_offline_refuses_to_download(cache):
    app, _ = make_app(cache, endpoint="http://127.0.0.1:9", offline=True)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_models(pilot, app)
        assert screen.message == OFFLINE_MESSAGE  # said up front
        screen.select(NAME)
        await pilot.press("d")
        assert not screen.downloading and screen.download_result is None
        assert "downloads are disabled" in screen.message and screen.notice.has_class("-error")


# -- use / load ---------------------------------------------------------------------------------------


async def test_use_loads_the_pairing_in_the_running_engine(cache):
    target, drafter = put_pairing(cache)
    app, engine = make_app(cache, remember=True)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_models(pilot, app)
        screen.select("e2b")
        await pilot.press("enter")  # not downloaded: says so, loads nothing
        assert "not downloaded" in screen.message and app.session.spec.name == "fake"
        screen.select(NAME)
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, ChatScreen) and app.session.loaded)
        assert app.session.spec.name == NAME
        assert engine.info.target_path == str(target) and engine.info.drafter_path == str(drafter)
        # the pairing in use cannot be removed; and back to the demo, built on the spot
        await pilot.press("f2")
        await until(pilot, lambda: isinstance(app.screen, ModelsScreen) and app.screen.loaded_once)
        app.screen.select(NAME)
        await pilot.press("r")
        assert "in use" in app.screen.message and target.is_dir()
        app.screen.select(DEMO_KEY)
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, ChatScreen) and app.session.loaded, timeout=20)
        assert engine.info.demo and app.session.spec.demo
        # remembered, the demo included: the next start opens the pairing used last (written by a worker)
        await until(pilot, lambda: load_config().default_pairing == DEMO_KEY)
    assert load_config().default_pairing == DEMO_KEY


async def test_a_failed_load_is_shown_on_the_models_screen(cache):
    put_pairing(cache)
    app, engine = make_app(cache)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_models(pilot, app)
        engine.load_error = "out of memory while loading the target"
        screen.select(NAME)
        await pilot.press("enter")
        await until(pilot, lambda: "Could not load" in screen.message)
        assert app.screen is screen and "out of memory" in screen.message and screen.notice.has_class("-error")


async def test_a_pairing_that_will_not_fit_asks_before_loading(cache):
    target, _ = put_pairing(cache)
    app, engine = make_app(cache, machine=TINY_MACHINE)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_models(pilot, app)
        assert cell(screen, NAME, "fit") == "won't fit"
        screen.select(NAME)
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        assert "will probably not fit" in app.screen.question and "1.0 GB" in app.screen.detail
        await pilot.press("n")
        await until(pilot, lambda: app.screen is screen)
        assert app.session.spec.name == "fake" and "Not loaded" in screen.message
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("y")
        await until(pilot, lambda: isinstance(app.screen, ChatScreen) and app.session.loaded)
        assert engine.info.target_path == str(target)


# -- remove -------------------------------------------------------------------------------------------


async def test_remove_asks_then_deletes_from_the_cache(cache):
    put_pairing(cache)
    app, _ = make_app(cache)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_models(pilot, app)
        screen.select(NAME)
        await pilot.press("r")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        assert PAIRING.target_repo in app.screen.detail
        await pilot.press("y")
        await until(pilot, lambda: cell(screen, NAME, "status") == "not downloaded")
        assert "Removed" in screen.message
    assert not (cache / ("models--" + PAIRING.target_repo.replace("/", "--"))).exists()


# -- first run ------------------------------------------------------------------------------------------


def test_first_run_means_nothing_asked_and_no_default_pairing():
    def args(**kw):
        return argparse.Namespace(**{"demo": False, "model": None, "drafter": None, "pairing": None, **kw})

    assert is_first_run(args(), None)
    assert not is_first_run(args(demo=True), None)  # --demo goes straight to the chat
    assert not is_first_run(args(pairing="e2b"), None)
    assert not is_first_run(args(), "e4b-8bit")


async def test_choosing_the_pairing_already_loaded_is_remembered_though_the_screen_leaves_at_once(cache):
    # the screen goes back to the chat in the same key press, before the config is written (by a worker)
    spec = PairingSpec("demo (random weights)", "demo-target", "demo-drafter", demo=True)
    app, engine = make_app(cache, spec=spec, offline=True, remember=True)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_models(pilot, app)
        screen.select(DEMO_KEY)
        await pilot.press("enter")
        assert isinstance(app.screen, ChatScreen)
        await until(pilot, lambda: load_config().default_pairing == DEMO_KEY)


async def test_first_run_offers_the_demo_and_enter_starts_it(cache):
    spec = PairingSpec("demo (random weights)", "demo-target", "demo-drafter", demo=True)
    app, engine = make_app(cache, spec=spec, first_run=True, offline=True, remember=True)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: isinstance(app.screen, ModelsScreen) and app.screen.loaded_once)
        screen = app.screen
        assert screen.selected_key == DEMO_KEY
        assert "Press Enter to start the offline demo" in str(screen.query_one("#models-intro").content)
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, ChatScreen) and app.session.loaded)
        assert engine.info.demo and app.session.spec is spec
        await until(pilot, lambda: load_config().default_pairing == DEMO_KEY)
    # so the next plain start is no first run: it opens the demo, no welcome screen
    plain = argparse.Namespace(demo=False, model=None, drafter=None, pairing=None)
    assert not is_first_run(plain, load_config().default_pairing)


def test_default_pairing_demo_opens_the_demo_and_a_named_pairing_is_remembered(monkeypatch, tmp_path):
    from app.commands import tui

    monkeypatch.setattr(tui, "demo_spec", lambda **_: "the demo spec")
    plain = argparse.Namespace(demo=False, model=None, drafter=None, pairing=None)
    assert tui.pairing_spec(plain, "demo") == ("the demo spec", None)  # no "could not open" notice
    path = tmp_path / "c.toml"
    config = load_config(path)
    tui.remember_pairing(argparse.Namespace(demo=True, pairing=None), config)
    assert load_config(path).default_pairing == "demo"
    tui.remember_pairing(argparse.Namespace(demo=False, pairing="e2b"), load_config(path))
    assert load_config(path).default_pairing == "e2b"


def test_two_quick_choices_leave_the_later_one_as_the_default(monkeypatch, tmp_path):
    # each choice writes the config on a thread of its own; the first write is slow (a busy machine, a
    # first import of tomlkit): it must not land after the second and leave the older choice
    import threading

    from app.tui.screens import models
    from core.user import config as config_mod

    path = tmp_path / "c.toml"
    monkeypatch.setenv("GEMMA_CHAT_CONFIG", str(path))
    real_save = config_mod.save_config
    first_called, let_first_go = threading.Event(), threading.Event()

    def slow_first(changes, path=None):
        if changes == {"default_pairing": "e2b"}:
            first_called.set()
            let_first_go.wait(5)
        return real_save(changes, path)

    monkeypatch.setattr(config_mod, "save_config", slow_first)
    choices = models._LastChoice()

    class App:
        def call_from_thread(self, *a, **k):
            raise AssertionError("no write should fail")

    first = threading.Thread(target=models._remember, args=(App(), choices.ask("e2b"), choices))
    first.start()
    assert first_called.wait(5)  # the first write is under way ...
    second = threading.Thread(target=models._remember, args=(App(), choices.ask("demo"), choices))
    second.start()  # ... when the second choice comes
    second.join(0.2)
    let_first_go.set()
    first.join(5)
    second.join(5)
    assert load_config(path).default_pairing == "demo"
    # a write whose choice was overtaken before it began writes nothing
    stale, newest = choices.ask("e4b"), choices.ask("demo")
    models._remember(App(), stale, choices)
    assert load_config(path).default_pairing == "demo"
    models._remember(App(), newest, choices)
    assert load_config(path).default_pairing == "demo"


# -- the real engine ------------------------------------------------------------------------------------


async def test_use_switches_the_real_engine_to_a_downloaded_pairing(cache, factory_checkpoints):
    """A catalogue pairing laid out in the HF cache from factory checkpoints (tiny random weights):
    the real engine loads it through the screen, drafter included, and a turn runs on it."""
    pytest.importorskip("mlx.core")
    from core.engine.contract import PairingSpec as RealSpec
    from core.engine.local import Engine

    target_dir, drafter_dir = factory_checkpoints.pairing("e-style")
    as_files = lambda d: {p.name: p.read_bytes() for p in d.iterdir() if p.is_file()}  # noqa: E731
    target = put_in_cache(cache, PAIRING.target_repo, as_files(target_dir))
    drafter = put_in_cache(cache, PAIRING.drafter_repo, as_files(drafter_dir))
    engine = Engine()
    options = ModelsOptions(cache_dir=str(cache), machine=BIG_MACHINE)
    app = shared_make_app(
        engine, spec=RealSpec(name="first", target=str(target_dir), drafter=None), models_options=options
    )
    try:
        async with app.run_test(size=SIZE) as pilot:
            screen = await open_models(pilot, app)
            assert app.session.spec.drafter is None
            screen.select(NAME)
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, ChatScreen) and app.session.loaded, timeout=60)
            info = engine.info
            assert info.name == NAME and info.drafter_path is not None
            assert os.path.samefile(info.target_path, target) and os.path.samefile(info.drafter_path, drafter)
            app.chat.settings = dataclasses.replace(app.chat.settings, max_tokens=4)
            app.chat.prompt.text = "hi"
            await pilot.press("enter")
            await until(pilot, lambda: app.chat.last_reply is not None, timeout=60)
            assert app.chat.history[-1]["role"] == "assistant"
    finally:
        app.chat.shutdown()


async def test_12b_4bit_shows_its_size_and_fit_and_loads_with_its_own_drafter(cache):
    """The 12B (`gemma4_unified`) pairing a 16 GB Mac runs: listed with size, memory and fit, marked
    unconfirmed, and Enter loads its target with the unified assistant."""
    name = "12b-4bit"
    p = catalog.get_pairing(name)
    mac16 = fit.MachineMemory(16 * 10**9, 12 * 10**9, "16 GB Mac")
    app, engine = make_app(cache, machine=mac16)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_models(pilot, app)
        screen.select(name)
        assert cell(screen, name, "pairing").startswith("12b-4bit  12B (unified) 4bit")
        assert cell(screen, name, "status") == "not downloaded" and cell(screen, name, "download") == "7.8 GB"
        assert cell(screen, name, "memory") == "9.2 GB" and cell(screen, name, "fit") == "ok"
        assert cell(screen, name, "vision") == "yes" and cell(screen, name, "repo") == "unconfirmed"
        assert cell(screen, "12b", "fit") == "won't fit"
        await pilot.pause()
        details = str(screen.details.content)
        assert (
            p.target_repo in details and "gemma-4-12B-it-assistant-bf16" in details and "not independently" in details
        )
        await pilot.press("enter")  # not downloaded: says so
        assert "not downloaded" in screen.message
    target = put_in_cache(cache, p.target_repo, files("gemma4_unified", 5000))
    drafter = put_in_cache(cache, p.drafter_repo, files("gemma4_unified_assistant", 3000))
    app, engine = make_app(cache, machine=mac16)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_models(pilot, app)
        screen.select(name)
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, ChatScreen) and app.session.loaded)
        assert app.session.spec.name == name
        assert engine.info.target_path == str(target) and engine.info.drafter_path == str(drafter)
