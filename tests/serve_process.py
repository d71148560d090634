"""`gemma-chat serve` as a real process on a free loopback port, for the e2e tests that must see what a
user's client sees (the process's own argument parsing, start-up, signals and exit status)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx2 as httpx

GEMMA_CHAT = Path(sys.executable).parent / "gemma-chat"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServeProcess:
    """`gemma-chat serve ARGS --port P`: started by `start()`, ready when /health answers.

    `command` replaces the installed `gemma-chat` (e.g. `python -m app.cli`, run in `cwd`, to serve a given
    checkout); `log` sends the server's stderr to that file instead of a pipe, for tests that read the
    log while it runs (a pipe nobody drains would block a server that logs much)."""

    def __init__(
        self,
        args: list[str],
        *,
        port: int | None = None,
        env: dict[str, str] | None = None,
        command: list[str] | None = None,
        cwd: Path | None = None,
        log: Path | None = None,
    ) -> None:
        self.port = port or free_port()
        self.args = [*(command or [str(GEMMA_CHAT)]), "serve", *args, "--port", str(self.port)]
        self.env = {**os.environ, **(env or {})}
        self.cwd, self.log = cwd, log
        self.proc: subprocess.Popen[str] | None = None
        self.url = f"http://127.0.0.1:{self.port}"

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log is not None else ""

    def start(self, timeout: float = 120.0, headers: dict[str, str] | None = None) -> ServeProcess:
        log = open(self.log, "w") if self.log is not None else None  # the child keeps its own copy
        self.proc = subprocess.Popen(
            self.args, env=self.env, cwd=self.cwd, stdout=subprocess.PIPE, stderr=log or subprocess.PIPE, text=True
        )
        if log is not None:
            log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                out, err = self.proc.communicate()
                err = err or self.log_text()
                raise AssertionError(f"serve exited {self.proc.returncode} before answering:\n{err}\n{out}")
            try:
                if httpx.get(self.url + "/health", headers=headers, timeout=2.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise AssertionError(f"serve did not answer /health within {timeout} s")

    def stop(self, sig: int = signal.SIGINT, timeout: float = 30.0) -> tuple[int, str]:
        """Send `sig` (Ctrl+C by default) and wait: (exit status, stderr)."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            _, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
            raise AssertionError(f"serve did not stop within {timeout} s of signal {sig}:\n{err}") from None
        return self.proc.returncode, err or self.log_text()

    def __enter__(self) -> ServeProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.stop()
