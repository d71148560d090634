"""The multi-line prompt: Enter sends, Shift+Enter / Ctrl+J add a newline."""

from __future__ import annotations

from collections.abc import Callable

from textual import events
from textual.widgets import TextArea

from app.tui.keys import quick_actions
from app.tui.messages import ImagesPasted, PromptSubmitted, QuickKey

NEWLINE_KEYS = ("shift+enter", "ctrl+j", "newline")


class PromptArea(TextArea, inherit_bindings=False):
    # TextArea's own keys minus f6/f7 (select line / all), which the screen uses for tuning; with
    # them gone the footer also lists the screen's keys in the screen's order.
    BINDINGS = [b for b in TextArea.BINDINGS if not {"f6", "f7"} & set(getattr(b, "key", "").split(","))]

    def __init__(self, quick: dict[str, str] | None = None, **kwargs) -> None:
        super().__init__(soft_wrap=True, show_line_numbers=False, tab_behavior="focus", **kwargs)
        self._quick = quick if quick is not None else quick_actions()
        self.live = False  # a reply is streaming (set by the screen)
        # Up/Down in an empty prompt recall earlier messages: the screen sets where they come from
        self.recall_source: Callable[[], list[str]] = lambda: []
        self._recall_index: int | None = None  # position in recall_source() while browsing

    async def _on_key(self, event: events.Key) -> None:
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
        # Plain tuning keys act only while nothing is typed; otherwise they are text. Letters (a, d)
        # start many messages, so on an empty prompt they act only while a reply is streaming.
        if not self.text and event.key in self._quick and (self.live or not (event.character or "").isalpha()):
            event.stop()
            event.prevent_default()
            self.post_message(QuickKey(self._quick[event.key]))
            return
        await super()._on_key(event)

    async def _on_paste(self, event: events.Paste) -> None:
        # Terminals deliver a dropped file as pasted text: image paths become attachments (the
        # screen checks them), the rest is pasted as usual. No paths: TextArea's own paste runs.
        from app.tui.paths_in_text import find_image_paths

        found = find_image_paths(event.text, keep_missing=True)
        if found.missing and not self.read_only:
            names = ", ".join(found.missing)
            self.notify(f"No such image file: {names} (left in the text)", severity="warning", markup=False)
        if not found.paths or self.read_only:
            return
        event.stop()
        event.prevent_default()
        if found.text and (result := self._replace_via_keyboard(found.text, *self.selection)):
            self.move_cursor(result.end_location)
        self.post_message(ImagesPasted(found.paths))

    def accept(self) -> None:
        """The screen took the message: clear the prompt."""
        self.clear()
        self._recall_index = None

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
