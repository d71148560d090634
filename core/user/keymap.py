"""Every key binding of the app, in one place. The UI binds from `resolve_keys(config.keys)`.

Key strings use Textual's names ("ctrl+q", "f1", "plus", "escape"); a value may hold alternatives
separated by commas ("shift+enter,ctrl+j"), as Textual's Binding does.

Scope says where a binding should live:
  "app"   works everywhere, even while the prompt box has focus (bind with priority)
  "chat"  single keys that would otherwise type into the prompt: active only while the conversation
          has focus (Tab to it); in the prompt they are text
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from difflib import get_close_matches


@dataclass(frozen=True)
class KeyAction:
    name: str
    key: str
    description: str  # the help screen's text
    scope: str = "app"
    palette: tuple[str, str] | None = None  # the command palette's (title, hint); None: not in the palette


ACTIONS: tuple[KeyAction, ...] = (
    KeyAction("send", "enter", "Send the message"),
    # Legacy terminals cannot tell shift+enter from enter; ctrl+j (line feed) always works.
    KeyAction("newline", "shift+enter,ctrl+j", "Insert a new line in the message"),
    KeyAction(
        "stop", "escape", "Stop the reply being generated", palette=("Stop generation", "keep the partial reply")
    ),
    KeyAction(
        "regenerate",
        "ctrl+r",
        "Generate the last reply again",
        palette=("Regenerate the last reply", "a new variant; the earlier ones are kept (Alt+←/→)"),
    ),
    KeyAction(
        "prev_variant",
        "alt+left",
        "Show the previous variant of the last reply (Ctrl+R makes variants)",
        palette=("Previous variant of the last reply", "after regenerating (Ctrl+R)"),
    ),
    KeyAction(
        "next_variant",
        "alt+right",
        "Show the next variant of the last reply",
        palette=("Next variant of the last reply", "after regenerating (Ctrl+R)"),
    ),
    KeyAction("new_chat", "ctrl+n", "Start a new chat", palette=("New chat", "start a new conversation")),
    KeyAction(
        "toggle_view",
        "ctrl+t",
        "Switch the reply view: rendered Markdown / tokens with accepted drafts marked",
        palette=("Toggle token / rendered view", "colour-by-origin tokens or Markdown"),
    ),
    KeyAction(
        "toggle_thinking",
        "f4",
        "Turn thinking on or off for the next turn",
        palette=("Toggle thinking", "for the next reply, where the model supports it"),
    ),
    KeyAction(
        "block_size_up",
        "plus",
        "Verify one more token per round (block size + 1)",
        "chat",
        palette=("Block size +1", "verify one more token per round (from the next round)"),
    ),
    KeyAction(
        "block_size_down",
        "minus",
        "Verify one token fewer per round (block size - 1)",
        "chat",
        palette=("Block size -1", "verify one token fewer per round (from the next round)"),
    ),
    KeyAction(
        "toggle_auto",
        "a",
        "Let the block size adapt automatically, or fix it",
        "chat",
        palette=("Toggle auto block size", "let the engine choose the block size"),
    ),
    KeyAction(
        "toggle_drafter",
        "d",
        "Turn the drafter (speculative decoding) on or off",
        "chat",
        palette=("Toggle drafter", "speculative decoding on/off (live A/B)"),
    ),
    KeyAction(
        "copy_reply",
        "y",
        "Copy the last reply to the clipboard",
        "chat",
        palette=("Copy the last reply", "to the clipboard"),
    ),
    KeyAction(
        "copy_code",
        "c",
        "Copy the last code block of the last reply",
        "chat",
        palette=("Copy the last code block", "of the last reply, to the clipboard"),
    ),
    KeyAction(
        "attach_image",
        "ctrl+o",
        "Attach an image or audio clip to the message",
        palette=(
            "Attach an image or audio clip",
            "pick a file (or paste a path, or type /image PATH or /audio PATH)",
        ),
    ),
    KeyAction(
        "export",
        "ctrl+s",
        "Export the chat to Markdown",
        palette=("Export the chat to Markdown", "a .md file in the current directory"),
    ),
    KeyAction(
        "chats",
        "ctrl+l",
        "Open the chat list (history and search)",
        palette=("Chats: history and search", "switch, rename, delete, search chats"),
    ),
    # ctrl+m is enter to a terminal, and ctrl+comma is not sent by most: function keys instead.
    KeyAction("models", "f2", "Open the models screen (pairings, downloads)"),
    KeyAction("settings", "f3", "Open the settings", palette=("Settings", "defaults saved to the config file")),
    KeyAction(
        "chat_params",
        "f9",
        "This chat's parameters: system prompt, sampling, thinking",
        palette=("Chat parameters", "system prompt, sampling, thinking for this chat"),
    ),
    KeyAction(
        "toggle_panel",
        "f10",
        "Hide or show the side panel (speed figures); narrow terminals get one line",
        palette=("Hide / show the side panel", "the speed figures (one line in narrow terminals)"),
    ),
    KeyAction("help", "f1", "Show the keys and what they do", palette=("Help: keys", "show every key")),
    KeyAction("palette", "ctrl+p", "Open the command palette"),
    KeyAction("quit", "ctrl+q", "Quit"),
)

ACTION_NAMES: tuple[str, ...] = tuple(a.name for a in ACTIONS)
DEFAULT_KEYS: dict[str, str] = {a.name: a.key for a in ACTIONS}
DESCRIPTIONS: dict[str, str] = {a.name: a.description for a in ACTIONS}
SCOPES: dict[str, str] = {a.name: a.scope for a in ACTIONS}
# (title, action, hint) for the command palette, in the table's order
PALETTE: tuple[tuple[str, str, str], ...] = tuple((a.palette[0], a.name, a.palette[1]) for a in ACTIONS if a.palette)

MODIFIERS = ("ctrl", "shift", "alt", "meta", "super", "hyper")
# Characters people write in a config, as Textual names them (Textual derives these from Unicode names).
CHAR_NAMES = {
    "+": "plus",
    "-": "minus",
    ",": "comma",
    ".": "full_stop",
    "/": "slash",
    "\\": "backslash",
    "=": "equals_sign",
    "?": "question_mark",
    ";": "semicolon",
    ":": "colon",
    "[": "left_square_bracket",
    "]": "right_square_bracket",
    "'": "apostrophe",
    "`": "grave_accent",
    "@": "at",
    "_": "underscore",
    "!": "exclamation_mark",
    "#": "number_sign",
    "*": "asterisk",
    " ": "space",
}
# Two names, one key: the terminal sends the same bytes (Textual's own aliases).
ALIASES = {
    "ctrl+m": "enter",
    "ctrl+i": "tab",
    "ctrl+left_square_bracket": "escape",
    "ctrl+space": "ctrl+at",
    "esc": "escape",
    "return": "enter",
}
_BASE_KEY = re.compile(r"^[A-Za-z0-9_]+$")


class KeymapError(ValueError):
    pass


def normalize_key(key: str) -> str:
    """One key ("Ctrl+Up", "+", "ctrl++") in Textual's spelling; raises KeymapError on nonsense."""
    raw = key.strip()
    if not raw:
        raise KeymapError("empty key")
    if raw in CHAR_NAMES:
        return CHAR_NAMES[raw]
    if raw.endswith("++"):  # "ctrl++": the key itself is "+"
        parts = raw[:-2].split("+") + ["+"]
    else:
        parts = raw.split("+")
    *mods, base = [p.strip() for p in parts]
    mods = [m.lower() for m in mods]
    for m in mods:
        if m not in MODIFIERS:
            raise KeymapError(f"{key!r}: unknown modifier {m!r} (use {', '.join(MODIFIERS)})")
    if len(set(mods)) != len(mods):
        raise KeymapError(f"{key!r}: repeated modifier")
    base = CHAR_NAMES.get(base, base)
    if len(base) > 1 or mods:  # Textual reports "ctrl+x" for ctrl+X; a bare "A" is shift+a
        base = base.lower()
    if not _BASE_KEY.match(base):
        raise KeymapError(f"{key!r}: {base!r} is not a key name (e.g. a, f1, enter, up, plus)")
    # Textual orders modifiers this way in the keys it reports
    ordered = [m for m in MODIFIERS if m in mods]
    name = "+".join([*ordered, base])
    return ALIASES.get(name, name)


def split_keys(value: str) -> list[str]:
    """A binding value -> its normalized keys ("shift+enter,ctrl+j" -> two keys)."""
    if value.strip() in {",", "+"}:
        return [normalize_key(value.strip())]
    return [normalize_key(k) for k in value.split(",") if k.strip()] or [normalize_key("")]


def suggest(name: str, choices: list[str] | tuple[str, ...]) -> str:
    match = get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {match[0]!r}?)" if match else ""


def resolve_keys(overrides: Mapping[str, str] | None = None) -> dict[str, str]:
    """DEFAULT_KEYS with `overrides` applied, every key normalized; a value is a comma-joined list.
    Raises KeymapError naming the unknown action, the bad key, or the two actions that share a key."""
    overrides = dict(overrides or {})
    problems: list[str] = []
    for action in overrides:
        if action not in DEFAULT_KEYS:
            problems.append(f"unknown action {action!r}{suggest(action, ACTION_NAMES)}")
    resolved: dict[str, str] = {}
    owner: dict[str, str] = {}
    for action in ACTION_NAMES:
        value = overrides.get(action, DEFAULT_KEYS[action])
        if not isinstance(value, str):
            problems.append(f'{action} must be a key string like "ctrl+r", got {value!r}')
            continue
        try:
            keys = split_keys(value)
        except KeymapError as e:
            problems.append(f"{action}: {e}")
            continue
        for k in keys:
            if k in owner and owner[k] != action:
                problems.append(f"{k!r} is bound to both {owner[k]!r} and {action!r}")
            owner.setdefault(k, action)
        resolved[action] = ",".join(dict.fromkeys(keys))
    if problems:
        raise KeymapError("; ".join(problems))
    return resolved
