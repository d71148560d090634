"""The contract between the app and an engine, and the types it speaks in.

`core.engine.local.Engine` (MLX, on this machine), `core.engine.remote.RemoteEngine` (`--connect`)
and the tests' scripted `support.fake_engine.FakeEngine` all satisfy `ChatEngine`; mypy checks each
(every implementation assigns itself to `ChatEngine` under TYPE_CHECKING), and the app and the
server type their engine as `ChatEngine`, never as one of them. What an engine can do is asked, not
probed: `features` says it in one typed value.

Every method is thread-safe and returns at once; work happens on the engine's own thread, and
`on_event` callbacks run there (they must not block). Nothing here imports mlx.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from core.events import LoadProgress, PrefillStarted, TurnDone
    from core.settings import GenerationSettings


class EngineError(RuntimeError):
    """A request the engine cannot serve (bad checkpoint, mismatched pair, no model loaded)."""


@dataclass(frozen=True)
class PairingSpec:
    """What to load: a target checkpoint and, for speculative decoding, its assistant drafter."""

    name: str  # display name, e.g. "E2B" or "demo"
    target: str  # local checkpoint directory (or a repo id already in the HF cache)
    drafter: str | None  # local drafter directory, or None (no speculative decoding)
    demo: bool = False
    dtype: str | None = None  # cast float weights ("float32", "bfloat16"); None keeps the checkpoint's
    # The drafter's two conventions (core.model.drafter, pack README D1/D2): the RoPE position of its
    # query ("P-1" the last cached position, or "P" as HF) and how many recent keys its sliding
    # layers see ("W" keys with |q - k| < W, or "W+1" as HF). They change acceptance, not output.
    drafter_position: str = "P-1"
    drafter_window: str = "W"


@dataclass(frozen=True)
class PairingInfo:
    """What was loaded."""

    name: str
    target_path: str
    drafter_path: str | None
    has_vision: bool
    demo: bool
    context_length: int
    vocab_size: int
    sliding_window: int
    dtype: str
    supports_thinking: bool
    has_audio: bool = False  # an audio tower (E2B/E4B) or audio embedder (12B) is loaded
    served_by: str | None = None  # a server's pairing (--connect): "gemma-chat at 127.0.0.1:8000", as the name ends


@dataclass(frozen=True)
class EngineFeatures:
    """What an engine can do now (with the pairing it has loaded, if any). Screens ask this instead
    of probing an engine's attributes."""

    # block-size and drafter changes reach a running turn; when not, `controls_note` says why
    live_controls: bool = True
    controls_note: str = ""
    # every TokenEvent says whether the drafter proposed it (a vLLM server does not)
    token_origins: bool = True
    # `ChatEngine.prefilling` reports a running prefill's progress
    prefill_progress: bool = True
    # the app may load another pairing (False: a server chose the model)
    choose_pairing: bool = True
    images: bool = False  # the loaded pairing takes images
    audio: bool = False  # the loaded pairing takes audio clips (message items {"type": "audio", ...})
    # `chat(..., tools=[...])` works: the prompt declares them and the reply's calls come as ToolCall
    # events (core.events) and in TurnDone.tool_calls
    tools: bool = False


class ChatEngine(Protocol):
    @property
    def info(self) -> PairingInfo | None:
        """The loaded pairing, or None."""
        ...

    @property
    def features(self) -> EngineFeatures:
        """What this engine can do now (see EngineFeatures)."""
        ...

    @property
    def prefilling(self) -> PrefillStarted | None:
        """The running turn's prompt while it prefills (None otherwise, or when not reported)."""
        ...

    def load(
        self, spec: PairingSpec, on_event: Callable[[LoadProgress], None] | None
    ) -> concurrent.futures.Future[PairingInfo]:
        """Load a pairing (the previous one is freed first); the future fails with the reason."""
        ...

    def chat(
        self,
        messages: list[dict],
        settings: GenerationSettings,
        on_event: Callable[[Any], None],
        tools: list[dict] | None = None,
    ) -> concurrent.futures.Future[TurnDone]:
        """Generate the reply to `messages`; events stream to `on_event`, the future ends with TurnDone.

        `tools` (OpenAI's `tools` list) may be given when `features.tools`; messages may then hold
        assistant `tool_calls` and `role: "tool"` results. An engine without tools ends such a turn
        with a TurnDone error saying so."""
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
