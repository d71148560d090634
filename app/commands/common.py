"""What the sub-commands share: terminal-safe printing, the pairing named on the command line, the API
key, and the `--connect` client. Commands import this module, never each other or `app.cli`."""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from core.engine.contract import PairingSpec
    from core.engine.remote import RemoteEngine

API_KEY_ENV = "GEMMA_CHAT_API_KEY"

# C0 controls but tab and newline, DEL and the C1 controls: what could move the cursor, retitle the
# window or switch terminal modes when model text or a hostile path is printed
_CONTROL = {c: f"\\x{c:02x}" for c in (*range(0x00, 0x09), *range(0x0B, 0x20), 0x7F, *range(0x80, 0xA0))}


def printable(text: object) -> str:
    """`text` safe to print on a terminal: control characters (ESC first of all) shown as \\xNN."""
    return str(text).translate(_CONTROL)


class UsageError(Exception):
    """A command line that cannot run, with a sentence for the user."""


def pairing_from_args(args: argparse.Namespace) -> PairingSpec:
    """The PairingSpec from --demo / --model [--drafter] / --pairing (--no-draft: without its drafter),
    with --dtype and the drafter conventions when the command has them."""
    import dataclasses

    from core.engine.pairings import catalogue_spec, checkpoint_spec, demo_spec
    from core.hub.pairing import PairingError

    with_drafter = not getattr(args, "no_draft", False)
    try:
        if getattr(args, "demo", False):
            spec = demo_spec(drafter=with_drafter)
        elif getattr(args, "model", None):
            spec = checkpoint_spec(args.model, args.drafter if args.drafter and with_drafter else None)
        elif getattr(args, "pairing", None):
            spec = catalogue_spec(args.pairing, drafter=with_drafter)
        else:
            raise UsageError("say which model to run: --model PATH [--drafter PATH], --pairing NAME or --demo")
    except PairingError as e:
        raise UsageError(str(e)) from e
    return dataclasses.replace(
        spec,
        dtype=getattr(args, "dtype", None),
        drafter_position=getattr(args, "drafter_position", spec.drafter_position),
        drafter_window=getattr(args, "drafter_window", spec.drafter_window),
    )


def api_key(args: argparse.Namespace) -> str | None:
    """--api-key, else $GEMMA_CHAT_API_KEY, else None."""
    return getattr(args, "api_key", None) or os.environ.get(API_KEY_ENV) or None


def remote_engine(args: argparse.Namespace) -> RemoteEngine:
    """The client for --connect URL; --model names the server's model (default: its first)."""
    from core.engine.remote import RemoteEngine, RemoteError

    try:
        return RemoteEngine(args.connect, api_key(args), model=getattr(args, "model", None))
    except RemoteError as e:
        raise UsageError(str(e)) from e
