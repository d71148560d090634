"""`gemma-chat` with no sub-command: the chat screen.

Which pairing opens:
  --demo                 the offline demo pairing (a tiny trained model shipped in core/data/demo)
  --model [--drafter]    local checkpoint directories, or Hugging Face repo ids already in the cache
  --pairing NAME         a catalogue pairing that has been downloaded
  nothing                the config's default_pairing when it is downloaded, otherwise the demo
First run (nothing asked for, no default_pairing configured): the demo loads underneath and the models
screen opens over it, the demo (or a pairing already downloaded) highlighted: Enter starts it.
GEMMA_CHAT_FAKE_ENGINE=1 swaps in the scripted fake engine (development and the terminal test;
GEMMA_CHAT_FAKE_DELAY sets its real seconds per round).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from core.demo import DEMO_NAME

FAKE_ENV = "GEMMA_CHAT_FAKE_ENGINE"
FAKE_DELAY_ENV = "GEMMA_CHAT_FAKE_DELAY"


class PairingError(Exception):
    pass


def resolve_checkpoint(value: str) -> str:
    """A local directory, or a repo id resolved to its snapshot in the local Hugging Face cache."""
    from core.loader import CheckpointError
    from core.loader import resolve_checkpoint as resolve

    try:
        return str(resolve(value))
    except CheckpointError as e:
        raise PairingError(str(e)) from None


def demo_spec():
    from core.demo import ensure_demo_pairing
    from core.engine import PairingSpec

    target, drafter = ensure_demo_pairing()
    return PairingSpec(name=DEMO_NAME, target=str(target), drafter=str(drafter), demo=True)


def catalogue_spec(name: str):
    from core.catalog import resolve_pairing
    from core.engine import PairingSpec

    try:
        p = resolve_pairing(name)
    except KeyError:
        raise PairingError(f"unknown pairing {name!r} (see `gemma-chat models list`)") from None
    except LookupError as e:  # PairingNotLocal: says what to run
        raise PairingError(str(e)) from None
    return PairingSpec(name=p.name, target=str(p.target_path), drafter=str(p.drafter_path))


def pairing_spec(args, default_pairing: str | None = None):
    """(spec, notice): the pairing to open and, when it is a fallback, why."""
    from core.engine import PairingSpec

    if getattr(args, "demo", False):
        return demo_spec(), None
    if getattr(args, "model", None):
        target = resolve_checkpoint(args.model)
        drafter = resolve_checkpoint(args.drafter) if args.drafter else None
        name = Path(args.model.rstrip("/")).name or args.model
        from core.demo import is_demo_checkpoint

        demo = is_demo_checkpoint(target)  # the demo's directories, passed by path, keep their label
        return PairingSpec(name=name, target=target, drafter=drafter, demo=demo), None
    if getattr(args, "drafter", None):
        raise PairingError("--drafter needs --model (the target it drafts for)")
    if getattr(args, "pairing", None):
        return catalogue_spec(args.pairing), None
    if default_pairing:
        try:
            return catalogue_spec(default_pairing), None
        except PairingError as e:
            return demo_spec(), f"Opened the demo pairing: {e}"
    return demo_spec(), (
        "No pairing configured yet: this is the demo (a tiny trained model). See `gemma-chat models list`."
    )


def is_first_run(args, default_pairing: str | None) -> bool:
    """Nothing asked for on the command line and no default pairing configured."""
    asked = any(getattr(args, a, None) for a in ("demo", "model", "drafter", "pairing"))
    return not asked and not default_pairing


def run(args) -> int:
    from core.config import ConfigError, load_config

    try:
        config = load_config()
    except ConfigError as e:
        print(f"gemma-chat: {e}", file=sys.stderr)
        return 2
    settings = config.generation_settings()
    notice = None
    first = False
    if os.environ.get(FAKE_ENV):
        from app.tui.fake_engine import FakeEngine
        from app.tui.fake_engine import PairingSpec as FakeSpec

        engine = FakeEngine(delay_s=float(os.environ.get(FAKE_DELAY_ENV, "0.05")))
        spec = FakeSpec(name="fake (scripted)", target="fake-target", drafter="fake-drafter")
    else:
        try:
            spec, notice = pairing_spec(args, config.default_pairing)
            first = is_first_run(args, config.default_pairing)
            if first:
                notice = None  # the models screen says it
        except PairingError as e:
            print(f"gemma-chat: {e}", file=sys.stderr)
            return 2
        from core.engine import Engine

        engine = Engine()
    from app.tui.app import GemmaChatApp
    from app.tui.widgets.thumbnail import prime_terminal_graphics

    prime_terminal_graphics()  # textual-image asks the terminal about Sixel/kitty graphics before Textual owns it
    from app.tui.history import HistoryRecorder

    history = HistoryRecorder()  # the Store opens on its own thread, at the first use
    app = GemmaChatApp(
        engine,
        spec,
        settings,
        key_overrides=config.key_overrides,
        theme=config.theme,
        notice=notice,
        history=history,
        config=config,
    )
    from app.tui.screens.models import ModelsOptions
    from core.keymap import resolve_keys

    offline = bool(getattr(args, "offline", False) or config.offline)
    app.models_options = ModelsOptions(offline=offline, endpoint=os.environ.get("HF_ENDPOINT") or None, remember=True)
    app.models_key = resolve_keys(config.key_overrides)["models"]
    app.first_run = first
    try:
        app.run()
    finally:
        app.chat.shutdown()
        history.close()  # waits for the last writes
    return 0
