"""Driving the installed `gemma-chat` in a real terminal: a tmux session per test (its own socket),
its screen text and escapes, keys, and the environment that keeps it off the user's files. The e2e
tmux tests and the quit-signal tests (tests/tui/test_hostile_tui.py) use it. tmux must be installed
(.ci/run installs it): skipped without it, failed without it when GEMMA_CHAT_REQUIRE_TMUX=1 (CI)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

GEMMA_CHAT = Path(sys.executable).parent / "gemma-chat"
# the same app on the scripted fake engine (no MLX): `python scripts/fake_ui.py --delay S [flags]`
FAKE_UI = f"{sys.executable} {Path(__file__).resolve().parent.parent / 'scripts' / 'fake_ui.py'}"
WIDTH, HEIGHT = 120, 36


def _ensure_tmux() -> str:
    """tmux is a system tool: .ci/run installs it (apt-get), a developer installs it once."""
    tmux = shutil.which("tmux")
    if tmux:
        return tmux
    message = "tmux is not installed (apt-get install tmux; .ci/run installs it)"
    if os.environ.get("GEMMA_CHAT_REQUIRE_TMUX"):
        pytest.fail(message)
    pytest.skip(message)


_READY = re.compile(r"[·│]\s*ready\b|\bready\s*·")


def shows_ready(screen: str) -> bool:
    """The chat's status says the model is loaded: in the side panel ("│ ready", "ready · preparing kernels…")
    or in the compact line of a narrow screen ("DEMO — … · ready"); not the models table's "ready" column."""
    return bool(_READY.search(screen))


class Tmux:
    def __init__(
        self,
        tmux: str,
        env: dict[str, str],
        command: list[str],
        size: tuple[int, int] = (WIDTH, HEIGHT),
        *,
        compiled: bool = False,
    ):
        self.tmux = tmux
        self.socket = f"gc-test-{uuid.uuid4().hex[:8]}"
        self.env = env
        # this socket's tmux server starts with the test's environment, which the app inherits (`-e` only
        # sets variables); `compiled`: without the suite's MLX_DISABLE_COMPILE (MLX reads any value as "off")
        server_env = {k: v for k, v in os.environ.items() if not (compiled and k == "MLX_DISABLE_COMPILE")}
        self._run(
            "-f",
            "/dev/null",
            "new-session",
            "-d",
            "-s",
            "chat",
            "-x",
            str(size[0]),
            "-y",
            str(size[1]),
            *[f"-e{k}={v}" for k, v in env.items()],
            " ".join(command),
            env=server_env,
        )
        self._run("set-option", "-g", "escape-time", "0")

    def _run(self, *args: str, check: bool = True, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(
            [self.tmux, "-L", self.socket, *args], capture_output=True, text=True, check=check, timeout=20, env=env
        )

    def text(self) -> str:
        return self._run("capture-pane", "-p", "-t", "chat").stdout

    def escapes(self) -> str:
        return self._run("capture-pane", "-p", "-e", "-t", "chat").stdout

    def keys(self, *keys: str, literal: bool = False) -> None:
        self._run("send-keys", "-t", "chat", *(["-l"] if literal else []), *keys)

    def alive(self) -> bool:
        return self._run("has-session", "-t", "chat", check=False).returncode == 0

    def wait(self, predicate, what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            time.sleep(0.1)
        screen = self.text() if self.alive() else "(session gone)"
        raise AssertionError(f"timed out waiting for {what}; screen:\n{screen}")

    def kill(self) -> None:
        self._run("kill-server", check=False)


def _sgr_params(capture: str, needle: str) -> list[set[str]]:
    """SGR parameter sets in effect for every line that contains `needle`."""
    out = []
    for line in capture.splitlines():
        if needle in re.sub(r"\x1b\[[0-9;:]*m", "", line):
            out.extend(set(m.split(";")) | {m} for m in re.findall(r"\x1b\[([0-9;:]*)m", line))
    return out


def _colour(r: int, g: int, b: int):
    return lambda params: any(f"38;2;{r};{g};{b}" in p for p in params)


@pytest.fixture
def term_env(tmp_path):
    env = {
        "TERM": "xterm-256color",  # what the app sees inside tmux
        "COLORTERM": "truecolor",
        "GEMMA_CHAT_CONFIG": str(tmp_path / "config.toml"),
        "GEMMA_CHAT_DATA_DIR": str(tmp_path / "data"),
        "GEMMA_CHAT_CACHE_DIR": os.environ.get("GEMMA_CHAT_TEST_CACHE", str(tmp_path / "cache")),
        "HF_HUB_OFFLINE": "1",
        "PATH": os.environ.get("PATH", ""),
    }
    return env


def _session(
    term_env,
    extra_env: dict[str, str],
    args: list[str],
    size: tuple[int, int] = (WIDTH, HEIGHT),
    *,
    fake: bool = False,
    compiled: bool = False,
) -> Tmux:
    """The installed `gemma-chat ARGS` in tmux, or with `fake` the app on the scripted fake engine;
    `compiled`: MLX compiles in the app, as on a user's machine (the suite runs it uncompiled)."""
    assert GEMMA_CHAT.exists(), f"the gemma-chat script is not installed next to {sys.executable}"
    program = FAKE_UI if fake else str(GEMMA_CHAT)
    return Tmux(_ensure_tmux(), {**term_env, **extra_env}, [program, *args], size, compiled=compiled)
