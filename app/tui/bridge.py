"""Hand-over of engine events from the engine thread to the UI thread.

The engine calls `push` on its own thread for every event; `push` only appends to a deque (atomic in
CPython, never blocks), so the engine's timing is not disturbed by the UI. The UI drains the deque
from a Textual timer at ~10 Hz. Token events are never dropped or merged; load progress is
coalesced to its latest value (only the newest fraction matters). Each event carries the turn it
belongs to, so late events from a cancelled or replaced turn are recognisable, and the monotonic
time it was pushed, for live rates that do not depend on when the UI happened to drain.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from core.events import LoadProgress

DRAIN_HZ = 10.0
PANEL_HZ = 2.5
MARKDOWN_HZ = 4.0


@dataclass(frozen=True)
class Stamped:
    turn: int  # 0 for load events
    t: float  # time.monotonic() when the engine pushed it
    event: object


class EventBridge:
    def __init__(self) -> None:
        self._queue: deque[Stamped] = deque()

    def listener(self, turn: int) -> Callable[[object], None]:
        """The `on_event` callback for one engine request."""
        append = self._queue.append
        clock = time.monotonic

        def on_event(event: object) -> None:
            append(Stamped(turn, clock(), event))

        return on_event

    def pending(self) -> int:
        return len(self._queue)

    def drain(self) -> list[Stamped]:
        """Everything pushed so far, in order, with runs of LoadProgress collapsed to the last."""
        out: list[Stamped] = []
        pop = self._queue.popleft
        while True:
            try:
                item = pop()
            except IndexError:
                break
            if out and isinstance(item.event, LoadProgress) and isinstance(out[-1].event, LoadProgress):
                out[-1] = item
            else:
                out.append(item)
        return out
