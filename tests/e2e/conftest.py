"""Fixtures of the process-level tests.

`serve_process` (session scope): one `gemma-chat serve --demo` process on a free loopback port
(tests/serve_process.py's ServeProcess), shared by every test that drives the server from outside as a
hostile client would. It serves this checkout (`python -m app.cli` in the repository) with its stderr in
a file the tests read, and with short timeouts and limits so the slow-client cases take seconds.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from serve_process import ServeProcess

REPO = Path(__file__).resolve().parents[2]
# small limits, so the slow-client tests take seconds; a well-behaved client never comes near them
SERVE_LIMITS = ["--header-timeout", "2", "--body-timeout", "3", "--max-connections", "64", "--max-body-mb", "32"]


def _supported(flags: list[str]) -> list[str]:
    """The serve options this checkout knows (the same tests then also run against an older one)."""
    help_text = subprocess.run(
        [sys.executable, "-m", "app.cli", "serve", "--help"], cwd=REPO, capture_output=True, text=True, timeout=60
    ).stdout
    out: list[str] = []
    for i in range(0, len(flags), 2):
        if flags[i] in help_text:
            out += flags[i : i + 2]
    return out


@pytest.fixture(scope="session")
def serve_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    home = tmp_path_factory.mktemp("serve")
    server = ServeProcess(
        ["--demo", *_supported(SERVE_LIMITS)],
        command=[sys.executable, "-m", "app.cli"],
        cwd=REPO,
        log=home / "serve.log",
        env={"GEMMA_CHAT_CONFIG": str(home / "config.toml"), "GEMMA_CHAT_DATA_DIR": str(home)},
    )
    with server:
        yield server
