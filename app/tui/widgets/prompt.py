"""The multi-line prompt: Enter sends, Shift+Enter / Ctrl+J add a newline, every other key types.

Up/Down in an empty prompt recall earlier messages, as a shell's history does: this chat's first (the
newest first), then the other chats' (InputHistory)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from textual import events
from textual.binding import Binding
from textual.message_pump import MessagePumpClosed
from textual.widgets import TextArea

from app.tui.messages import AttachmentsPasted, PromptSubmitted
from app.tui.widgets.ordered_input import run_own_binding

NEWLINE_KEYS = ("shift+enter", "ctrl+j", "newline")


def _binding_keys(binding: Binding | tuple[str, ...]) -> set[str]:
    key = binding.key if isinstance(binding, Binding) else binding[0]
    return set(key.split(","))


class InputHistory:
    """What Up/Down recall: the user's messages of every chat, one entry per text, the newest last.
    The other chats' come from the history store (`load`, newest first); what is sent in this
    process is added as it goes (`sent`), so recall works with the history off too."""

    LIMIT = 1000

    def __init__(self) -> None:
        self._stored: list[str] = []  # from the store, newest first
        self._sent: list[str] = []  # sent since the app started, oldest first

    def load(self, newest_first: Iterable[str]) -> None:
        self._stored = list(newest_first)[: self.LIMIT]

    def sent(self, text: str) -> None:
        self._sent.append(text)

    def entries(self, this_chat: list[str]) -> list[str]:
        """Oldest first, as the prompt steps through them from the end: the other chats' messages,
        then this chat's (a text in this chat is not repeated from the others)."""
        seen = set(this_chat)
        others: list[str] = []
        for text in [*reversed(self._sent), *self._stored]:  # newest first
            if text and text not in seen:
                seen.add(text)
                others.append(text)
        return [*reversed(others[: self.LIMIT]), *this_chat]


def _typed(event: events.Key) -> str | None:
    """What a key types into the prompt: its character, a newline for the newline keys, else None."""
    if event.key in NEWLINE_KEYS:
        return "\n"
    return event.character if event.is_printable and event.character else None


class PromptArea(TextArea, inherit_bindings=False):
    # TextArea's own keys minus f6/f7 (select line / all), which the screen uses for tuning; with
    # them gone the footer also lists the screen's keys in the screen's order.
    BINDINGS = [b for b in TextArea.BINDINGS if not {"f6", "f7"} & _binding_keys(b)]

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(soft_wrap=True, show_line_numbers=False, tab_behavior="focus", **kwargs)
        # Up/Down in an empty prompt recall earlier messages: the screen sets where they come from
        self.recall_source: Callable[[], list[str]] = lambda: []
        # whether a pasted path is refused before it is read (the screen sets it): it stays in the text
        self.refuses: Callable[[str], bool] = lambda path: False
        self._recall_index: int | None = None  # position in recall_source() while browsing
        self._burst: list[str] = []  # typed keys waiting for the last of their run (`_typed_in_burst`)

    async def _on_key(self, event: events.Key) -> None:
        if self._typed_in_burst(event):
            return
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            if self.text.strip():
                self.post_message(PromptSubmitted(self.text))
            return
        if event.key in ("up", "down") and self._recall(event.key == "up"):
            event.stop()
            event.prevent_default()
            return
        if event.key in NEWLINE_KEYS:
            event.stop()
            event.prevent_default()
            self.insert("\n")
            return
        if await run_own_binding(self, event):  # in the order the keys came (app.tui.widgets.ordered_input)
            return
        await super()._on_key(event)

    def _typed_in_burst(self, event: events.Key) -> bool:
        """Keys that type (characters, newlines) queued one behind the other go in as one edit. A terminal
        without bracketed paste (or with it off) sends a paste as keys, and TextArea re-wraps the whole
        line on every edit: key by key, a 36 KB one-line paste took minutes. Each typed key waits while
        the next message in the queue is another typed key, and the last of the run types them all,
        before anything else (Enter, an arrow, a paste) is handled. A key typed alone goes in at once."""
        char = _typed(event)
        if char is None or self.read_only:
            self._type_burst()  # (a run always ends on a typed key; this is in case one did not)
            return False
        event.stop()
        event.prevent_default()
        self._restart_blink()  # as TextArea does for a key: the cursor shows while typing
        self._burst.append(char)
        peek = getattr(self, "_peek_message", None)  # Textual's; without it, every key goes in alone
        try:
            following = peek() if peek is not None else None
        except MessagePumpClosed:  # the app is closing
            following = None
        if not (isinstance(following, events.Key) and _typed(following) is not None):
            self._type_burst()
        return True

    def _type_burst(self) -> None:
        if self._burst:
            text, self._burst = "".join(self._burst), []
            self._replace_via_keyboard(text, *self.selection)  # as TextArea types a key
            # the edit scrolled to the cursor before the prompt took its new height: many lines at once
            # left the cursor below the view until the next key
            self.call_after_refresh(self.scroll_cursor_visible)

    async def _on_paste(self, event: events.Paste) -> None:
        # Terminals deliver a dropped file as pasted text: image and audio paths become attachments
        # (the screen checks them), the rest is pasted as usual. No paths: TextArea's own paste runs.
        # A path the pairing refuses up front (`refuses`: a clip where no audio is taken) stays in
        # the text, and the screen is told, so it can say why.
        from app.tui.paths_in_text import find_image_paths, is_attachment_name, is_image_name

        refuses = self.refuses
        found = find_image_paths(
            event.text, keep_missing=True, accept=lambda p: is_attachment_name(p) and not refuses(p)
        )
        refused = find_image_paths(event.text, accept=lambda p: is_attachment_name(p) and refuses(p)).paths
        if found.missing and not self.read_only:
            names = ", ".join(found.missing)
            kind = "image file" if all(is_image_name(m) for m in found.missing) else "file"
            self.notify(f"No such {kind}: {names} (left in the text)", severity="warning", markup=False)
        if self.read_only:
            return
        if refused:
            self.post_message(AttachmentsPasted(refused))
        if not found.paths:
            return
        event.stop()
        event.prevent_default()
        if found.text and (result := self._replace_via_keyboard(found.text, *self.selection)):
            self.move_cursor(result.end_location)
        self.post_message(AttachmentsPasted(found.paths))

    def accept(self) -> None:
        """The screen took the message: clear the prompt."""
        self.clear()
        self._recall_index = None

    def type_text(self, text: str) -> None:
        """Type `text` at the cursor, with the focus here (keys typed while the conversation had it)."""
        self.focus()
        self.insert(text)

    def _recall(self, older: bool) -> bool:
        """Up/Down while the prompt is empty, or still shows an unedited recalled message: step
        through the earlier messages (Down past the newest empties the prompt). False: a normal key."""
        entries = self.recall_source()
        i = self._recall_index
        browsing = i is not None and i < len(entries) and self.text == entries[i]
        if not entries or not (browsing or not self.text):
            self._recall_index = None
            return False
        if not browsing or i is None:
            if not older:
                return False
            i = len(entries)
        i = i - 1 if older else i + 1
        if i < 0:
            return True  # already at the oldest
        if i >= len(entries):
            self._recall_index = None
            self.clear()
            return True
        self._recall_index = i
        self.text = entries[i]
        self.move_cursor(self.document.end)
        return True
