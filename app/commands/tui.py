"""`gemma-chat` with no sub-command: the chat screen.

Which pairing opens:
  --demo                 the offline demo pairing (a tiny trained model shipped in core/data/demo)
  --model [--drafter]    local checkpoint directories, or Hugging Face repo ids already in the cache
  --pairing NAME         a catalogue pairing that has been downloaded
  nothing                the config's default_pairing ("demo": the demo) when it is downloaded,
                         otherwise the demo
The pairing last chosen by name (--demo, --pairing, the models screen) is saved as default_pairing,
so the next plain start opens it.
First run (nothing asked for, no default_pairing configured): the demo loads underneath and the models
screen opens over it, the demo (or a pairing already downloaded) highlighted: Enter starts it.
--connect URL chats with a running server instead (core.engine.remote: gemma-chat serve, vLLM, any
OpenAI-compatible one); --model then names the server's model.
`scripts/fake_ui.py` runs the same app on the tests' scripted fake engine (`run_app`).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from app.commands.common import UsageError, printable, remote_engine
from core.engine.contract import PairingSpec
from core.engine.pairings import PairingNotDownloaded, catalogue_spec, checkpoint_spec, demo_spec
from core.hub.pairing import PairingError
from core.user import kernel_cache

__all__ = ["PairingError", "is_first_run", "pairing_spec", "run"]

if TYPE_CHECKING:
    from app.tui.app import GemmaChatApp
    from app.tui.history import HistoryRecorder
    from core.engine.contract import ChatEngine
    from core.settings import GenerationSettings
    from core.user.config import Config

DEMO_KEY = "demo"  # default_pairing's value for the demo pairing (the models screen's row key too)


def pairing_spec(args: argparse.Namespace, default_pairing: str | None = None) -> tuple[PairingSpec, str | None]:
    """(spec, notice): the pairing to open and, when it is a fallback, why."""
    if args.demo:
        return demo_spec(), None
    if args.model:
        name = Path(args.model.rstrip("/")).name or args.model
        return checkpoint_spec(args.model, args.drafter or None, name=name), None
    if args.drafter:
        raise PairingError("--drafter needs --model (the target it drafts for)")
    if args.pairing:
        return catalogue_spec(args.pairing), None
    if default_pairing == DEMO_KEY:
        return demo_spec(), None
    if default_pairing:
        try:
            return catalogue_spec(default_pairing), None
        except PairingError as e:
            return demo_spec(), f"Opened the demo pairing: {e}"
    return demo_spec(), (
        "No pairing configured yet: this is the demo (a tiny trained model). See `gemma-chat models list`."
    )


def is_first_run(args: argparse.Namespace, default_pairing: str | None) -> bool:
    """Nothing asked for on the command line and no default pairing configured."""
    asked = any((args.demo, args.model, args.drafter, args.pairing))
    return not asked and not default_pairing


# `gemma-chat --temp 0.7 --system ...`: the flags mlx_lm.chat users expect, on top of the config's defaults
CLI_SETTINGS = {
    "temp": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "seed": "seed",
    "max_tokens": "max_tokens",
    "system": "system_prompt",
    "block_size": "block_size",
}


def cli_settings(args: argparse.Namespace, settings: GenerationSettings) -> GenerationSettings:
    """`settings` with the command line's chat flags applied; ValueError says which one is bad."""
    import dataclasses

    given = vars(args)
    changes = {field: given[flag] for flag, field in CLI_SETTINGS.items() if given.get(flag) is not None}
    settings = dataclasses.replace(settings, **changes)
    settings.validate()
    return settings


def remember_pairing(args: argparse.Namespace, config: Config) -> None:
    """A pairing asked for by name (--demo, --pairing) becomes the one the next plain start opens,
    as choosing it in the models screen does."""
    name = DEMO_KEY if args.demo else args.pairing
    if not name or name == config.default_pairing:
        return
    from core.user.config import ConfigError, save_config

    try:
        save_config({"default_pairing": name}, config.path)
    except ConfigError as e:
        why = "; ".join(e.problems)
        print(f"gemma-chat: {name!r} not remembered as default_pairing: {e.path} {why}", file=sys.stderr)
    except OSError as e:
        print(f"gemma-chat: {name!r} not remembered as default_pairing: {e.strerror or e}", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    from core.user.config import ConfigError, load_config, write_default_config

    try:
        write_default_config()  # a commented template with every key, so [keys] and the rest can be found
    except OSError:
        pass  # a read-only config folder: the defaults still work
    try:
        config = load_config()
    except ConfigError as e:
        print(f"gemma-chat: {printable(str(e))}", file=sys.stderr)
        return 2
    try:
        settings = cli_settings(args, config.generation_settings())
    except ValueError as e:
        print(f"gemma-chat: {e}", file=sys.stderr)
        return 2
    notice = None
    first = False
    download: str | None = None  # a catalogue pairing asked for by name and not downloaded yet
    engine: ChatEngine
    if args.connect:
        try:
            remote = remote_engine(args)
        except UsageError as e:
            print(f"gemma-chat: {e}", file=sys.stderr)
            return 2
        engine = remote
        spec = PairingSpec(name=f"server at {remote.base}", target=remote.url, drafter=None)
    else:
        try:
            spec, notice = pairing_spec(args, config.default_pairing)
            first = is_first_run(args, config.default_pairing)
            if first:
                notice = None  # the models screen says it
        except PairingNotDownloaded as e:
            if args.offline or config.offline:
                print(f"gemma-chat: {printable(str(e))}", file=sys.stderr)
                return 2
            # `--pairing NAME` before its download: the models screen opens on it, over the demo, to fetch it
            spec, download = demo_spec(), e.name
        except PairingError as e:
            print(f"gemma-chat: {printable(str(e))}", file=sys.stderr)
            return 2
        if download is None:  # one not downloaded yet is remembered when it is used (the models screen)
            remember_pairing(args, config)
        from core.engine.local import Engine

        engine = Engine(kernels="background")  # a cold machine: replies at once, kernels built alongside
    kernels = kernel_cache.active()
    if kernels is not None and kernels.folder is None and kernels.problem:  # a refused kernel cache
        notice = f"{notice} {kernels.problem}" if notice else kernels.problem
    offline = bool(args.offline or config.offline)
    return run_app(engine, spec, settings, config, notice=notice, first_run=first, offline=offline, download=download)


def run_app(
    engine: ChatEngine,
    spec: PairingSpec,
    settings: GenerationSettings,
    config: Config,
    *,
    notice: str | None = None,
    first_run: bool = False,
    offline: bool = False,
    mcp: bool = True,
    download: str | None = None,
) -> NoReturn:
    """Run the chat app on `engine` until it quits, then end the process: status 0, or 128 + the signal
    that ended it. download: a catalogue pairing to offer at start (the models screen opens on it)."""
    from app.tui.app import GemmaChatApp
    from app.tui.widgets.thumbnail import prime_terminal_graphics

    prime_terminal_graphics()  # textual-image asks the terminal about Sixel/kitty graphics before Textual owns it
    from app.tui.history import HistoryRecorder

    history = HistoryRecorder(export_dir=config.export_path())  # the Store opens on its own thread
    from core.user.mcp_client import McpHub

    # the tool servers (config.toml's [mcp.servers]): started by the app, ended with it
    hub = McpHub(list(config.mcp_servers.values())) if mcp and config.mcp_servers else None
    app = GemmaChatApp(
        engine,
        spec,
        settings,
        key_overrides=config.key_overrides,
        theme=config.theme,
        notice=notice,
        history=history,
        config=config,
        tools_hub=hub,
    )
    from app.tui.screens.models import ModelsOptions
    from core.user.keymap import resolve_keys

    app.models_options = ModelsOptions(offline=offline, endpoint=os.environ.get("HF_ENDPOINT") or None, remember=True)
    app.models_key = resolve_keys(config.key_overrides)["models"]
    app.first_run = first_run
    app.offer_download = download
    closing = threading.Lock()  # held by whoever closes the history: this thread or the quit deadline's
    app.on_quit_signal = lambda name: _exit_anyway(app, history, closing, name)
    try:
        app.run()
    finally:
        app.chat.shutdown()
        if hub is not None:
            hub.close()  # the servers' processes end before the app's
        with closing:
            unsaved = history.close()  # waits for the last writes
        if history.backlog:
            where = f"they are in {unsaved}" if unsaved else "and no file could be written to keep them"
            print(
                f"gemma-chat: {len(history.backlog)} change(s) could not be saved to the chat history; {where}",
                file=sys.stderr,
            )
    # Everything worth keeping is written by now, so the process ends here rather than through the
    # interpreter's own exit, which is not safe with MLX on another thread: it can wait for minutes on an
    # engine thread still inside MLX (a kernel compile, a long prefill), and with mlx 0.32 on Linux it
    # aborts ("terminate called without an active exception", status 134) when the engine thread is mid-load
    # as the app quits. A signal or a lost terminal ends it with the usual 128 + signal number.
    _hard_exit(_signal_status(app.quit_signal) if app.quit_signal else 0)


QUIT_SAVE_S = 4.0  # after a quit signal or a lost terminal: at most this for the reply to be handed over
QUIT_EXIT_S = (3.0, 0.2)  # then this for the app's own exit (restoring the terminal; when it is gone) before ending


def _signal_status(name: str) -> int:
    import signal

    return 128 + int(signal.Signals[name])


def _hard_exit(status: int) -> NoReturn:
    import logging

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    logging.shutdown()
    os._exit(status)


def _exit_anyway(app: GemmaChatApp, history: HistoryRecorder, closing: threading.Lock, name: str) -> None:
    """A quit started by a signal or a lost terminal ends the process promptly, however stuck its normal
    exit is (Textual writing to a terminal that is gone blocks; an engine inside a long MLX call does not
    answer): once the reply is handed to the history (or after QUIT_SAVE_S), the app gets QUIT_EXIT_S to
    exit by itself (only a moment when its terminal is gone: nothing is left to restore); then the history
    is closed here (its last writes, or the recovery file) and the process ends with 128 + the signal."""

    from app.tui.app import terminal_lost

    def deadline() -> None:
        import time

        app.quit_saved.wait(QUIT_SAVE_S)
        time.sleep(QUIT_EXIT_S[1] if terminal_lost() else QUIT_EXIT_S[0])
        if closing.acquire(timeout=10):  # not already closing on the main thread (else: let it finish)
            history.close()
        _hard_exit(_signal_status(name))

    threading.Thread(target=deadline, name="quit-deadline", daemon=True).start()
