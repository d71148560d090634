"""The chat screen's footer: the keys a user needs first, as many as the width holds.

Textual's Footer lists every shown binding and cuts off whatever does not fit, so at 80 columns the
chat, image and model keys (and help) fell off the end. Here each hint has a priority: the hints
that fit are chosen most important first, then shown in their reading order, and F1 help is always
among them. At 80 columns that is stop, regenerate, the drafter (the live A/B), image, chats,
models, help and quit (the row has no padding: they take 79 cells); the wider the terminal, the more
of the rest (block size and auto next: F5/F6, F7).

While the conversation has the focus, the footer says so and lists the plain keys that act there
instead (anything else typed goes to the prompt).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rich.text import Text
from textual.widget import Widget

from app.tui import keys
from core.user.keymap import resolve_keys


@dataclass(frozen=True)
class Hint:
    key: str  # as displayed: "Esc", "^O", "F5/F6"
    label: str
    priority: int  # 0 = kept first


# (actions, label, priority), in reading order; several actions share one hint ("F5/F6 block")
HINTS = (
    (("stop",), "stop", 2),
    (("regenerate",), "regen", 4),
    (("block_size_down", "block_size_up"), "block", 8),
    (("toggle_auto",), "auto", 9),
    (("toggle_drafter",), "drafter", 3),
    (("attach_image",), "image", 5),
    (("chats",), "chats", 6),
    (("new_chat",), "new", 10),
    (("models",), "models", 7),
    (("toggle_view",), "view", 11),
    (("toggle_panel",), "panel", 12),
    (("help",), "help", 0),
    (("quit",), "quit", 1),
)
# The plain keys of the focused conversation, in reading order (the first hint names the mode).
CONVERSATION_HINTS = (
    (("block_size_down", "block_size_up"), "block", 2),
    (("toggle_auto",), "auto", 3),
    (("toggle_drafter",), "drafter", 1),
    (("copy_reply",), "copy", 4),
    (("copy_code",), "code", 5),
    (("help",), "help", 6),
)
GAP = 2


def _first_key(sk: keys.ScreenKey | None, fallback: str, plain: bool = False) -> str:
    if sk is not None:
        for k in (sk.quick if plain else sk.always or sk.quick).split(","):
            if k:
                return keys.display_key(k)
    return keys.display_key(fallback.split(",")[0]) if fallback and not plain else ""


def hints_for(screen_keys: tuple[keys.ScreenKey, ...], overrides: Mapping[str, str] | None = None) -> list[Hint]:
    by_action = {sk.action: sk for sk in screen_keys}
    resolved = resolve_keys(overrides)
    out = []
    for actions, label, priority in HINTS:
        shown = [_first_key(by_action.get(a), resolved.get(a, "")) for a in actions]
        if not all(shown):
            continue
        out.append(Hint("/".join(shown), label, priority))
    return out


def conversation_hints(screen_keys: tuple[keys.ScreenKey, ...]) -> list[Hint]:
    """The footer while the conversation has the focus: its plain keys, and where typing goes."""
    by_action = {sk.action: sk for sk in screen_keys}
    out = [Hint("Conversation", "has the focus:", 0)]
    for actions, label, priority in CONVERSATION_HINTS:
        shown = [_first_key(by_action.get(a), "", plain=True) for a in actions]
        if all(shown):
            out.append(Hint("/".join(shown), label, priority))
    out.append(Hint("typing", "→ prompt", 0))
    return out


def fit_hints(hints: list[Hint], width: int) -> list[Hint]:
    """The hints that fit in `width` cells, most important first, in their reading order."""
    chosen: set[int] = set()
    used = 0
    for i in sorted(range(len(hints)), key=lambda i: hints[i].priority):
        w = len(hints[i].key) + 1 + len(hints[i].label) + (GAP if chosen else 0)
        if used + w <= width:
            chosen.add(i)
            used += w
    return [h for i, h in enumerate(hints) if i in chosen]


class KeyHints(Widget):
    DEFAULT_CSS = """
    KeyHints {
        height: 1;
        padding: 0;
        background: $footer-background;
        color: $footer-foreground;
    }
    """

    def __init__(self, hints: list[Hint], focused_hints: list[Hint] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.hints = hints
        self.focused_hints = focused_hints or []  # shown instead while `focused` (the conversation)
        self.focused = False

    def show_focused(self, focused: bool) -> None:
        if focused != self.focused:
            self.focused = focused
            self.refresh()

    def render(self) -> Text:
        text = Text(no_wrap=True, overflow="crop")
        hints = self.focused_hints if self.focused and self.focused_hints else self.hints
        for i, h in enumerate(fit_hints(hints, self.content_size.width)):
            if i:
                text.append(" " * GAP)
            text.append(h.key, style="bold")
            text.append(" " + h.label)
        return text
