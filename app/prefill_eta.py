"""How long a running prefill has left, for the chat's status line and `generate`'s progress line.

The estimate divides the tokens left by the rate of the last RATE_WINDOW_S seconds, not of the whole
prefill so far: a chunk costs more as the context grows (attention reads every earlier key), so the
average since the start promises too little. On the demo, a 22,510-token prompt took 37 s; at 72 % the
whole-prefill average said 9 s were left where 15 were, the last 5 s' rate 15 s.
"""

from __future__ import annotations

import collections
import time

RATE_WINDOW_S = 5.0


class PrefillClock:
    """Progress samples of one prefill, `seconds_left` from the rate over about the last RATE_WINDOW_S."""

    def __init__(self, started: float) -> None:
        self.started = started  # time.monotonic() when the prefill began (0 tokens done)
        self.samples: collections.deque[tuple[float, int]] = collections.deque()  # (time, tokens done)

    def seconds_left(self, done: int, total: int, now: float | None = None) -> float | None:
        """Record `done` of `total` at `now`; the seconds left at the recent rate (None before any progress)."""
        now = time.monotonic() if now is None else now
        self.samples.append((now, done))
        # keep the newest sample at least the window old (or the oldest while none is)
        while len(self.samples) > 2 and now - self.samples[1][0] >= RATE_WINDOW_S:
            self.samples.popleft()
        t0, d0 = self.samples[0] if len(self.samples) > 1 else (self.started, 0)
        if done <= d0 or now <= t0:
            return None
        return (total - done) * (now - t0) / (done - d0)
