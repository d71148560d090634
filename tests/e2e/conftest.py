"""Fixtures of the process-level tests.

`serve_process` (session scope): one `gemma-chat serve --demo` process on a free loopback port, started
the way a user starts it (`python -m app.cli serve ...`), shared by every test that drives the server
from outside. Tests that need a server of their own settings start one with `start_serve`.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx2 as httpx
import pytest

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class ServeProcess:
    url: str  # http://127.0.0.1:PORT (no /v1)
    port: int
    proc: subprocess.Popen
    log: Path  # the process's stderr

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def log_size(self) -> int:
        return self.log.stat().st_size

    def rss_bytes(self) -> int:
        """The server's resident memory now (Linux /proc)."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    def wait_healthy(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gemma-chat serve exited ({self.proc.returncode}):\n{self.log_text()[-3000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"gemma-chat serve did not answer within {timeout:g} s:\n{self.log_text()[-3000:]}")
            time.sleep(0.2)


def _supported(flags: list[str]) -> list[str]:
    """The serve options this checkout knows (so the same tests also run against an older one)."""
    help_text = subprocess.run(
        [sys.executable, "-m", "app.cli", "serve", "--help"], cwd=REPO, capture_output=True, text=True, timeout=60
    ).stdout
    out: list[str] = []
    for i in range(0, len(flags), 2):
        if flags[i] in help_text:
            out += flags[i : i + 2]
    return out


def start_serve(log: Path, *extra: str) -> ServeProcess:
    port = free_port()
    cmd = [sys.executable, "-m", "app.cli", "serve", "--demo", "--port", str(port), *extra]
    env = {**os.environ, "GEMMA_CHAT_CONFIG": str(log.parent / "config.toml"), "GEMMA_CHAT_DATA_DIR": str(log.parent)}
    with open(log, "wb") as err:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=err, env=env)
    server = ServeProcess(f"http://127.0.0.1:{port}", port, proc, log)
    try:
        server.wait_healthy(120)
    except BaseException:
        proc.kill()
        proc.wait(timeout=10)
        raise
    return server


# small limits, so the slow-client tests take seconds; a well-behaved client never comes near them
SERVE_LIMITS = ["--header-timeout", "2", "--body-timeout", "3", "--max-connections", "64", "--max-body-mb", "32"]


@pytest.fixture(scope="session")
def serve_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    server = start_serve(tmp_path_factory.mktemp("serve") / "serve.log", *_supported(SERVE_LIMITS))
    try:
        yield server
    finally:
        server.proc.terminate()
        try:
            server.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.proc.kill()
            server.proc.wait(timeout=10)
