"""What the sub-commands share: terminal-safe printing, the output's width, the pairing named on the command
line, the API key, and the `--connect` client. Commands import this module, never each other or `app.cli`."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from core.engine.contract import PairingSpec
    from core.engine.remote import RemoteEngine

API_KEY_ENV = "GEMMA_CHAT_API_KEY"

# C0 controls but tab and newline, DEL and the C1 controls: what could move the cursor, retitle the
# window or switch terminal modes when model text or a hostile path is printed
_CONTROL = {c: f"\\x{c:02x}" for c in (*range(0x00, 0x09), *range(0x0B, 0x20), 0x7F, *range(0x80, 0xA0))}


def discard_stdout() -> None:
    """Point stdout at /dev/null once writing to it failed (a closed pipe, a full disk), so that neither a
    later print nor the interpreter's last flush at exit fails again."""
    try:
        fd = sys.stdout.fileno()
    except (OSError, ValueError):  # not a real file (a test's capture)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def output_columns() -> int | None:
    """The width to lay text out for: $COLUMNS, else the terminal's; None (lines as long as they are) when
    writing to a pipe or file, so a script's `grep` sees one line per entry."""
    import shutil

    env = os.environ.get("COLUMNS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    if sys.stdout.isatty():
        return shutil.get_terminal_size().columns
    return None


def fit_to(text: str, columns: int | None, hang: int = 0) -> str:
    """`text` wrapped between words to `columns` (`output_columns`), later lines indented by `hang`; as it
    is for a pipe (None) or where it fits. A path or repo id longer than a line is left whole (a terminal
    wraps it; a copy stays intact), and a name is never cut at its hyphens."""
    import textwrap

    if columns is None or len(text) <= columns:
        return text
    return textwrap.fill(text, columns, subsequent_indent=" " * hang, break_long_words=False, break_on_hyphens=False)


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


KEY_FILE_MAX_BYTES = 4096  # a key is a line; anything longer is the wrong file


def read_key_file(path: str) -> str:
    """The first line of --api-key-file: a regular file (a FIFO would block), at most 4 KiB."""
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise UsageError(f"cannot read --api-key-file {path}: {e.strerror or e}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # before fdopen, which refuses a folder with its own error
        os.close(fd)
        raise UsageError(f"--api-key-file {path} is not a regular file")
    with os.fdopen(fd, "rb") as f:
        data = f.read(KEY_FILE_MAX_BYTES + 1)
    lines = data.decode("utf-8", "replace").splitlines()
    key = lines[0].strip() if lines else ""
    if len(data) > KEY_FILE_MAX_BYTES or not key:
        raise UsageError(f"--api-key-file {path} must hold the key on its first line (and be under 4 KiB)")
    return key


def api_key(args: argparse.Namespace) -> str | None:
    """--api-key, else --api-key-file, else $GEMMA_CHAT_API_KEY, else None. The flag itself is warned
    about: a command line is readable by every local user (/proc/PID/cmdline, `ps`)."""
    import sys

    if getattr(args, "api_key", None):
        print(
            "gemma-chat: warning: --api-key puts the key in the process list (ps, /proc/PID/cmdline), where "
            f"every user of this machine can read it; set ${API_KEY_ENV} or use --api-key-file instead",
            file=sys.stderr,
        )
        return str(args.api_key)
    if getattr(args, "api_key_file", None):
        return read_key_file(args.api_key_file)
    return os.environ.get(API_KEY_ENV) or None


def remote_engine(args: argparse.Namespace) -> RemoteEngine:
    """The client for --connect URL; --model names the server's model (default: its first)."""
    from core.engine.remote import RemoteEngine, RemoteError

    key = api_key(args)
    try:
        return RemoteEngine(args.connect, key, model=getattr(args, "model", None))
    except RemoteError as e:
        raise UsageError(str(e)) from e
