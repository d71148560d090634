"""Messages between the app's parts (their contracts): the chat screen's widgets, and the session
(app.tui.session) to the screens that subscribe to it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from textual.message import Message

if TYPE_CHECKING:
    from app.tui.live_stats import LiveControls
    from core.engine.contract import PairingInfo, PairingSpec


@dataclass
class PromptSubmitted(Message):
    """The user pressed Enter in the prompt. The screen decides whether the send happens; the
    prompt clears only when told (`PromptArea.accept`), so a failed send keeps the text."""

    text: str


@dataclass
class QuickKey(Message):
    """A plain symbol key (`+`, `-`, `?`) pressed in the empty prompt: run `action`."""

    action: str


@dataclass
class AttachmentsPasted(Message):
    """Image and audio paths found in pasted text (a terminal's file drop): the screen attaches
    them. The rest of the pasted text went into the prompt."""

    paths: list[str]


# -- the session (one per app) to its subscribers -------------------------------------------------
# Each subscriber gets its own instance; none bubbles (a screen's parent is the app, which has no use for them).


@dataclass
class PairingLoading(Message, bubble=False):
    """A load of `spec` started (the previous pairing is no longer usable)."""

    spec: PairingSpec


@dataclass
class PairingProgress(Message, bubble=False):
    """The load of `spec` reached `stage` ("target 40%")."""

    spec: PairingSpec
    stage: str


@dataclass
class PairingLoaded(Message, bubble=False):
    """`spec` is loaded: `info` says what it is."""

    spec: PairingSpec
    info: PairingInfo


@dataclass
class PairingFailed(Message, bubble=False):
    """The load of `spec` failed; `error` is the sentence to show."""

    spec: PairingSpec
    error: str


@dataclass
class KernelsPreparing(Message, bubble=False):
    """The engine prepares this machine's compiled kernels after the load (first run only; replies work
    meanwhile, slower): `note` says how far, "" once they are ready (or stay uncompiled)."""

    note: str


@dataclass
class ControlsChanged(Message, bubble=False):
    """The live controls (block size, auto, drafter) are now `controls`; the engine has them."""

    controls: LiveControls
