"""`gemma-chat` with no sub-command: the chat screen.

Pairing: `--demo` -> the offline demo pairing; `--model [--drafter]` -> local directories or Hugging
Face repo ids already in the local cache; nothing -> the demo pairing (until a configured default
pairing exists). GEMMA_CHAT_FAKE_ENGINE=1 swaps in the scripted fake engine (development and the
terminal test; GEMMA_CHAT_FAKE_DELAY sets its seconds per round).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

FAKE_ENV = "GEMMA_CHAT_FAKE_ENGINE"
FAKE_DELAY_ENV = "GEMMA_CHAT_FAKE_DELAY"


class PairingError(Exception):
    pass


def resolve_checkpoint(value: str, offline: bool = True) -> str:
    """A local directory, or a repo id resolved to its snapshot in the local Hugging Face cache."""
    path = Path(value).expanduser()
    if path.is_dir():
        return str(path.resolve())
    if path.exists():
        raise PairingError(f"{value} is a file, not a checkpoint directory")
    if value.count("/") != 1 or value.startswith((".", "/", "~")):
        raise PairingError(f"{value}: no such directory, and not a Hugging Face repo id (owner/name)")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return snapshot_download(value, local_files_only=True)
    except LocalEntryNotFoundError:
        raise PairingError(f"{value} is not in the local Hugging Face cache; download it first "
                           f"(`gemma-chat models download ...`)") from None
    except Exception as e:  # a malformed id, a broken cache
        raise PairingError(f"{value}: {e}") from None


def _demo_spec():
    try:
        from core.demo import ensure_demo_pairing  # type: ignore[import-not-found]
    except ImportError:
        raise PairingError("the demo pairing is not available in this build (core.demo is missing)") from None
    spec = ensure_demo_pairing()
    return spec


def pairing_spec(args):
    from core.engine import PairingSpec

    if getattr(args, "demo", False):
        return _demo_spec()
    if getattr(args, "model", None):
        target = resolve_checkpoint(args.model)
        drafter = resolve_checkpoint(args.drafter) if args.drafter else None
        name = Path(args.model.rstrip("/")).name or args.model
        return PairingSpec(name=name, target=target, drafter=drafter, demo=False)
    if getattr(args, "drafter", None):
        raise PairingError("--drafter needs --model (the target it drafts for)")
    if getattr(args, "pairing", None):
        raise PairingError("--pairing is not supported by the chat screen yet; use --model/--drafter or --demo")
    return _demo_spec()  # nothing configured yet: the demo pairing


def run(args) -> int:
    if os.environ.get(FAKE_ENV):
        from app.tui.fake_engine import FakeEngine, PairingSpec as FakeSpec

        delay = float(os.environ.get(FAKE_DELAY_ENV, "0.05"))
        engine = FakeEngine(delay_s=delay)
        spec = FakeSpec(name="fake (scripted)", target="fake-target", drafter="fake-drafter", demo=False)
    else:
        try:
            spec = pairing_spec(args)
        except PairingError as e:
            print(f"gemma-chat: {e}", file=sys.stderr)
            return 2
        from core.engine import Engine

        engine = Engine()
    from app.tui.app import GemmaChatApp

    app = GemmaChatApp(engine, spec)
    try:
        app.run()
    finally:
        app.chat.shutdown()
    return 0
