"""The chat screen's key bindings, taken from `core.user.keymap` (defaults + config overrides).

Two kinds of key:
  scope "app"   (ctrl+r, ctrl+t, escape, f1...) always work, even while the prompt has focus and holds
                text: they are bound with priority, so the prompt's own bindings never shadow them.
  scope "chat"  plain keys (`+ - a d y c`, plus `?` for help) that act only while the conversation has
                focus (Tab to it; the footer then lists them). In the prompt every key types, and any
                other printable key typed in the conversation goes to the prompt, so they never eat
                typing.
Every chat-scope tuning action also gets an always-working F-key (f5..f8) that the keymap leaves free,
so tuning works mid-typing too; an extra is dropped if the user's keymap binds that key elsewhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from core.user.keymap import DESCRIPTIONS, SCOPES, resolve_keys

# The actions this screen implements, with short footer labels.
CHAT_ACTIONS: dict[str, str] = {
    "stop": "Stop",
    "regenerate": "Regen",
    "prev_variant": "Prev variant",
    "next_variant": "Next variant",
    "toggle_view": "View",
    "block_size_down": "Block-",
    "block_size_up": "Block+",
    "toggle_auto": "Auto block",
    "toggle_drafter": "Drafter",
    "toggle_panel": "Panel",
    "help": "Help",
    "attach_image": "Image",  # app.tui.widgets.attachments; in the help screen and palette
    # chats, settings, copy and export (app.tui.history): in the help screen and palette, not the footer
    "new_chat": "New",
    "chats": "Chats",
    "chat_params": "Params",
    "settings": "Settings",
    "toggle_thinking": "Think",
    "copy_reply": "Copy",
    "copy_code": "Code",
    "export": "Export",
    "models": "Models",  # app.tui.screens.models; in the help screen and palette
}
FOOTER_HIDDEN = {
    "prev_variant",
    "next_variant",
    "attach_image",
    "new_chat",
    "chat_params",
    "toggle_thinking",
    "copy_reply",
    "copy_code",
    "export",
    "chats",
    "settings",
    "models",
}
EXTRA_ALWAYS = {"block_size_down": "f5", "block_size_up": "f6", "toggle_auto": "f7", "toggle_drafter": "f8"}
EXTRA_QUICK = {"help": "question_mark"}

# The prompt's own keys (handled inside the TextArea), for the help screen.
PROMPT_ACTIONS = ("send", "newline", "palette", "quit")


@dataclass(frozen=True)
class ScreenKey:
    action: str
    label: str  # footer label
    description: str  # help / palette text
    always: str  # comma-separated keys bound with priority ("" if none)
    quick: str  # comma-separated plain keys: while the conversation has focus ("" if none)
    show: bool = True  # in the footer


def screen_keys(overrides: Mapping[str, str] | None = None) -> tuple[ScreenKey, ...]:
    resolved = resolve_keys(overrides)
    taken = {k for v in resolved.values() for k in v.split(",")}
    out = []
    for action, label in CHAT_ACTIONS.items():
        keys = resolved[action].split(",")
        if SCOPES[action] == "app":
            always, quick = keys, []
        else:
            always, quick = [], keys
        if action in EXTRA_ALWAYS and EXTRA_ALWAYS[action] not in taken:
            always.append(EXTRA_ALWAYS[action])
        if action in EXTRA_QUICK and EXTRA_QUICK[action] not in taken:
            quick.append(EXTRA_QUICK[action])
        out.append(
            ScreenKey(
                action, label, DESCRIPTIONS[action], ",".join(always), ",".join(quick), action not in FOOTER_HIDDEN
            )
        )
    return tuple(out)


def quick_keys(keys: tuple[ScreenKey, ...]) -> set[str]:
    """The plain keys bound to actions (Textual key names): the conversation keeps these."""
    return {k for sk in keys for k in sk.quick.split(",") if k}


def prompt_keys(overrides: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
    resolved = resolve_keys(overrides)
    return [(resolved[a], DESCRIPTIONS[a]) for a in PROMPT_ACTIONS]


_NAMES = {
    "escape": "Esc",
    "question_mark": "?",
    "plus": "+",
    "minus": "-",
    "enter": "Enter",
    "alt+left": "Alt+←",
    "alt+right": "Alt+→",
}


def display_key(keys: str) -> str:
    def one(k: str) -> str:
        if k in _NAMES:
            return _NAMES[k]
        if k.startswith("ctrl+"):
            return "^" + k[5:].upper()
        if k.startswith("f") and k[1:].isdigit():
            return k.upper()
        return k

    return " ".join(one(k) for k in keys.split(",") if k)
