"""The contract between the app and an engine: what `core.engine.Engine` and the TUI's scripted
`app.tui.fake_engine.FakeEngine` both provide, checked by mypy (each implementation assigns itself
to `ChatEngine` under TYPE_CHECKING). The app types its engine as `ChatEngine`, never as one of them.

Named `ChatEngine` because `core.engine.Engine` is the real engine's class name.
Every method is thread-safe and returns at once; work happens on the engine's own thread, and
`on_event` callbacks run there (they must not block).
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from core.engine import PairingInfo, PairingSpec
    from core.events import LoadProgress
    from core.settings import GenerationSettings


class ChatEngine(Protocol):
    @property
    def info(self) -> PairingInfo | None:
        """The loaded pairing, or None."""
        ...

    def load(
        self, spec: PairingSpec, on_event: Callable[[LoadProgress], None] | None
    ) -> concurrent.futures.Future[PairingInfo]:
        """Load a pairing (the previous one is freed first); the future fails with the reason."""
        ...

    def chat(
        self, messages: list[dict], settings: GenerationSettings, on_event: Callable[[Any], None]
    ) -> concurrent.futures.Future[Any]:
        """Generate the reply to `messages`; events stream to `on_event`, the future ends with TurnDone."""
        ...

    def cancel(self) -> None:
        """Stop the running turn (within one round) and every queued one."""
        ...

    def set_block_size(self, k: int | str) -> None:
        """Block size (see core.limits) for the running and queued turns, from their next round."""
        ...

    def set_drafter_enabled(self, on: bool) -> None:
        """Drafter on/off for the running and queued turns, from their next round."""
        ...

    def close(self) -> None:
        """Cancel everything and stop serving."""
        ...
