"""Copying text out of the app: the system clipboard tools, or the terminal's OSC 52.

OSC 52 asks the terminal itself to set the clipboard, so it also works over SSH; tmux swallows it
unless it is wrapped in a DCS passthrough. The system tools work locally even when the terminal
ignores OSC 52. The UI tries the system tool first and falls back to OSC 52.
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping

ESC = "\x1b"
BEL = "\x07"
ST = ESC + "\\"


def osc52(text: str, *, tmux: bool | None = None) -> str:
    """The escape sequence that puts `text` on the clipboard. tmux=None: wrap for tmux when $TMUX is set."""
    payload = base64.b64encode(text.encode("utf-8")).decode("ascii")
    seq = f"{ESC}]52;c;{payload}{BEL}"
    if tmux is None:
        tmux = bool(os.environ.get("TMUX"))
    if tmux:
        # DCS passthrough: every ESC inside is doubled; needs `set -g allow-passthrough on` on tmux >= 3.3
        seq = f"{ESC}Ptmux;" + seq.replace(ESC, ESC + ESC) + ST
    return seq


def clipboard_commands(env: Mapping[str, str] | None = None) -> list[list[str]]:
    """The copy commands that could work here, best first (each found on PATH)."""
    env = os.environ if env is None else env
    path = env.get("PATH", os.defpath)
    candidates: list[list[str]] = [["pbcopy"]]  # macOS; elsewhere only if someone installed a shim
    if sys.platform != "darwin":
        if env.get("WAYLAND_DISPLAY"):
            candidates.append(["wl-copy"])
        if env.get("DISPLAY") or env.get("WAYLAND_DISPLAY"):  # XWayland also serves X clients
            candidates.append(["xclip", "-selection", "clipboard"])
            candidates.append(["xsel", "--clipboard", "--input"])
        candidates.append(["clip.exe"])  # WSL: Windows' clipboard
    found = []
    for argv in candidates:
        exe = shutil.which(argv[0], path=path)
        if exe:
            found.append([exe, *argv[1:]])
    return found


def system_copy(text: str, *, timeout: float = 2.0, env: Mapping[str, str] | None = None) -> bool:
    """Copy with the first clipboard tool that works; False if none does."""
    data = text.encode("utf-8")
    for argv in clipboard_commands(env):
        try:
            # stdout/stderr to DEVNULL: xclip and wl-copy fork a child that keeps serving the
            # selection; a pipe held open by it would make us wait for the whole timeout.
            result = subprocess.run(
                argv,
                input=data,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=timeout,
                env=None if env is None else dict(env),
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        if result.returncode == 0:
            return True
    return False


def copy_text(
    text: str,
    write_to_terminal: Callable[[str], None] | None = None,
    *,
    timeout: float = 2.0,
    env: Mapping[str, str] | None = None,
) -> str:
    """System clipboard first, then OSC 52 through `write_to_terminal`. Returns how it was copied:
    "system", "osc52" or "" (not copied)."""
    if system_copy(text, timeout=timeout, env=env):
        return "system"
    if write_to_terminal is not None:
        write_to_terminal(osc52(text))
        return "osc52"
    return ""
