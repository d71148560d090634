"""Messages between the chat screen's widgets (their contracts)."""

from __future__ import annotations

from dataclasses import dataclass

from textual.message import Message


@dataclass
class PromptSubmitted(Message):
    """The user pressed Enter in the prompt. The screen decides whether the send happens; the
    prompt clears only when told (`PromptArea.accept`), so a failed send keeps the text."""

    text: str


@dataclass
class QuickKey(Message):
    """A plain key (`+`, `-`, `a`, `d`, `?`, `v`) pressed in the empty prompt: run `action`."""

    action: str


@dataclass
class ImagesPasted(Message):
    """Image paths found in pasted text (a terminal's file drop): the screen attaches them. The
    rest of the pasted text went into the prompt."""

    paths: list[str]
