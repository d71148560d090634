"""The app's one chat session: which pairing is loaded (or loading, or failed) and the live controls
(block size, auto, drafter) that reach a running reply.

The app owns one `ChatSession`; each value has its home here and nowhere else. Screens read it and
subscribe to it: every change is posted to each subscriber as a Textual Message (app.tui.messages:
PairingLoading / PairingProgress / PairingLoaded / PairingFailed, ControlsChanged), so no screen polls
another screen's fields. The engine is reached only through its contract (`ChatEngine`, `features`).

A load's progress events arrive on the engine thread; they are queued (app.tui.bridge) and the app's
timer calls `poll` on the UI thread, which drains them and then looks at the load's outcome.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from concurrent.futures import Future
from functools import partial
from typing import TYPE_CHECKING

from textual.message import Message
from textual.message_pump import MessagePump

from app.tui.bridge import EventBridge
from app.tui.live_stats import LiveControls, Tuning
from app.tui.messages import (
    ControlsChanged,
    KernelsPreparing,
    PairingFailed,
    PairingLoaded,
    PairingLoading,
    PairingProgress,
)
from core.events import KernelProgress, LoadProgress
from core.limits import MAX_BLOCK_SIZE, MIN_BLOCK_SIZE

if TYPE_CHECKING:
    from core.engine.contract import ChatEngine, PairingInfo, PairingSpec
    from core.settings import GenerationSettings

# The manual block size that auto hands over to when nothing has been chosen yet (auto's own start).
MANUAL_FALLBACK_K = 4


def load_error_text(error: BaseException) -> str:
    return str(error) or type(error).__name__


def kernel_note(ev: KernelProgress) -> str:
    """What the status line says while the kernels are prepared ("" once done): the share of warm-up steps
    done and what was counted (steps, kernels built), which moves on a loaded machine too; never an ETA."""
    if ev.done:
        return ""
    note = f"preparing kernels for this machine, first run only… {ev.fraction:.0%}"
    counted = [f"{ev.steps_done} of {ev.steps} steps"] if ev.steps else ["loading"]
    if ev.kernels:
        counted.append(f"{ev.kernels} kernel{'s' if ev.kernels != 1 else ''} built")
    return f"{note} ({', '.join(counted)})"


class ChatSession:
    def __init__(self, engine: ChatEngine, spec: PairingSpec, controls: LiveControls | None = None) -> None:
        self.engine = engine
        self.spec = spec
        self.controls = controls or LiveControls()
        self.loaded = False
        self.load_error: str | None = None
        self.load_stage = ""  # the latest LoadProgress, as "target 40%"
        self.kernel_note = ""  # while the engine prepares this machine's kernels (KernelProgress), what it says
        self.streaming = False  # a reply is being generated (the chat screen's turn)
        self._future: Future[PairingInfo] | None = None
        self._bridge = EventBridge()
        self._subscribers: list[MessagePump] = []

    # -- subscribers --------------------------------------------------------------------------------
    def subscribe(self, pump: MessagePump) -> None:
        if pump not in self._subscribers:
            self._subscribers.append(pump)

    def unsubscribe(self, pump: MessagePump) -> None:
        if pump in self._subscribers:
            self._subscribers.remove(pump)

    def _post(self, make: Callable[[], Message]) -> None:
        for pump in list(self._subscribers):
            pump.post_message(make())

    # -- the pairing --------------------------------------------------------------------------------
    @property
    def info(self) -> PairingInfo | None:
        """The loaded pairing (None while loading or after a failure)."""
        return self.engine.info if self.loaded else None

    def load(self, spec: PairingSpec | None = None) -> None:
        """Start loading `spec` (default: the session's pairing) into the engine."""
        if spec is not None:
            self.spec = spec
        self.loaded = False
        self.load_error = None
        self.load_stage = ""
        self._future = self.engine.load(self.spec, self._bridge.listener(0))
        self._post(partial(PairingLoading, self.spec))

    def switch(self, spec: PairingSpec) -> str | None:
        """Load another pairing into the running engine (the models screen's Use, a reopened chat's
        pairing). The conversation stays; the next turn is prefilled on the new model. Why not (and
        nothing done), or None."""
        if not self.engine.features.choose_pairing:
            return "Connected to a server (--connect): the model is chosen on the server."
        if self.streaming:
            return "A reply is streaming: stop it (Esc in the chat) before switching."
        self.load(spec)
        return None

    def poll(self) -> None:
        """Drain the load's progress, then its outcome (the app's timer, on the UI thread)."""
        spec = self.spec
        for item in self._bridge.drain():
            ev = item.event
            if isinstance(ev, LoadProgress) and self._future is not None:
                self.load_stage = stage = f"{ev.stage} {ev.fraction:.0%}"
                self._post(partial(PairingProgress, spec, stage))
            elif isinstance(ev, KernelProgress):  # after the load, from the engine's helper thread
                self.kernel_note = note = kernel_note(ev)
                self._post(partial(KernelsPreparing, note))
        # after the events: the load's last progress event must not overwrite its outcome
        fut = self._future
        if fut is None or not fut.done():
            return
        self._future = None
        try:
            info = fut.result()
        except Exception as e:
            self.load_error = error = load_error_text(e)
            self._post(partial(PairingFailed, spec, error))
            return
        self.loaded = True
        self._post(partial(PairingLoaded, spec, info))

    # -- live controls ------------------------------------------------------------------------------
    @property
    def has_drafter(self) -> bool:
        info = self.info
        return info is None or info.drafter_path is not None  # until loaded: as the pairing will be

    def tuning(self) -> Tuning:
        """What the panels say about the controls."""
        c = self.controls
        by_server = not self.engine.features.live_controls
        return Tuning(c.block_size, c.drafter_enabled, self.has_drafter, by_server)

    def fixed_note(self) -> str | None:
        """Why the controls cannot change (a server fixes them), or None."""
        features = self.engine.features
        return None if features.live_controls else (features.controls_note or "the server fixes them")

    def set_block_size(self, k: int | str) -> str | None:
        """Set the block size (the running reply's next round on); why not, or None when done."""
        why = self.fixed_note()
        if why is not None:
            return why
        self.engine.set_block_size(k)
        self._changed(dataclasses.replace(self.controls, block_size=k))
        return None

    def current_k(self, chosen: int | None) -> int:
        """The manual block size now: the setting, or under auto what it chose last (`chosen`)."""
        k = self.controls.block_size
        return k if isinstance(k, int) else chosen or MANUAL_FALLBACK_K

    def step_block_size(self, step: int, chosen: int | None) -> str | None:
        k = min(max(self.current_k(chosen) + step, MIN_BLOCK_SIZE), MAX_BLOCK_SIZE)
        return self.set_block_size(k)

    def toggle_auto(self, chosen: int | None) -> str | None:
        auto = self.controls.block_size == "auto"
        return self.set_block_size(self.current_k(chosen) if auto else "auto")

    def set_drafter_enabled(self, on: bool) -> str | None:
        why = self.fixed_note()
        if why is not None:
            return why
        self.engine.set_drafter_enabled(on)
        self._changed(dataclasses.replace(self.controls, drafter_enabled=on))
        return None

    def _changed(self, controls: LiveControls) -> None:
        self.controls = controls
        self._post(partial(ControlsChanged, controls))

    def turn_settings(self, settings: GenerationSettings) -> GenerationSettings:
        """`settings` (a chat's parameters) with the live controls, for a turn about to start."""
        c = self.controls
        return dataclasses.replace(settings, block_size=c.block_size, drafter_enabled=c.drafter_enabled)
