"""Shared helpers for Textual pilot tests."""

from __future__ import annotations

import time


async def until(pilot, predicate, timeout: float = 5.0) -> None:
    """Let the app run until `predicate()` holds; fail with a clear message after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for the screen")
        await pilot.pause(0.02)


async def ready(pilot, app) -> None:
    """Wait until the chat screen's pairing has loaded."""
    await until(pilot, lambda: app.chat.loaded)
