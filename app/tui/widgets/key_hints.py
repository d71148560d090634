"""The chat screen's footer: the keys a user needs first, as many as the width holds.

Textual's Footer lists every shown binding and cuts off whatever does not fit, so at 80 columns the
chat, image and model keys (and help) fell off the end. Here each hint has a priority: the hints
that fit are chosen most important first, then shown in their reading order, and F1 help is always
among them.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.widget import Widget

from app.tui import keys
from core.user.keymap import resolve_keys


@dataclass(frozen=True)
class Hint:
    key: str  # as displayed: "Esc", "^O", "F5/F6"
    label: str
    priority: int  # 0 = kept first


# (actions, label, priority), in reading order; several actions share one hint ("F5/F6 block size")
HINTS = (
    (("stop",), "stop", 2),
    (("regenerate",), "regen", 8),
    (("block_size_down", "block_size_up"), "block size", 5),
    (("toggle_auto",), "auto", 6),
    (("toggle_drafter",), "drafter", 7),
    (("attach_image",), "image", 3),
    (("chats",), "chats", 4),
    (("new_chat",), "new", 9),
    (("models",), "models", 4),
    (("toggle_view",), "view", 10),
    (("toggle_panel",), "panel", 11),
    (("help",), "help", 0),
    (("quit",), "quit", 1),
)
GAP = 2


def _first_key(sk: keys.ScreenKey | None, fallback: str) -> str:
    if sk is not None:
        for k in (sk.always or sk.quick).split(","):
            if k:
                return keys.display_key(k)
    return keys.display_key(fallback.split(",")[0]) if fallback else ""


def hints_for(screen_keys: tuple[keys.ScreenKey, ...], overrides=None) -> list[Hint]:
    by_action = {sk.action: sk for sk in screen_keys}
    resolved = resolve_keys(overrides)
    out = []
    for actions, label, priority in HINTS:
        shown = [_first_key(by_action.get(a), resolved.get(a, "")) for a in actions]
        if not all(shown):
            continue
        out.append(Hint("/".join(shown), label, priority))
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
        padding: 0 1;
        background: $footer-background;
        color: $footer-foreground;
    }
    """

    def __init__(self, hints: list[Hint], **kwargs) -> None:
        super().__init__(**kwargs)
        self.hints = hints

    def render(self) -> Text:
        text = Text(no_wrap=True, overflow="crop")
        for i, h in enumerate(fit_hints(self.hints, self.content_size.width)):
            if i:
                text.append(" " * GAP)
            text.append(h.key, style="bold")
            text.append(" " + h.label)
        return text
