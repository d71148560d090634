"""The chat screen's images: attaching them (Ctrl+O picker, pasted paths, `/image`), handing them to
the message being sent, and giving them back when its turn fails.

`ChatImages` gets everything it touches passed in: the screen it notifies from and opens the picker
over, the attachment bar, the conversation (where a sent message's thumbnails go), the prompt, and
the loaded pairing's info (None while loading). The screen's actions and message handlers call it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from textual.containers import VerticalScroll
from textual.screen import Screen

from app.tui.widgets.attachments import AttachmentBar, no_vision_message, parse_image_command
from app.tui.widgets.prompt import PromptArea
from app.tui.widgets.thumbnail import ImageInfo, ImageStrip

if TYPE_CHECKING:
    from core.engine.contract import PairingInfo


class ChatImages:
    def __init__(
        self,
        screen: Screen,
        bar: AttachmentBar,
        conversation: VerticalScroll,
        prompt: PromptArea,
        pairing: Callable[[], PairingInfo | None],
    ) -> None:
        self._screen = screen
        self._bar = bar
        self._conversation = conversation
        self._prompt = prompt
        self._pairing = pairing
        # the images of the turn being generated and their thumbnails (given back if it fails)
        self._turn: tuple[list[ImageInfo], ImageStrip | None] | None = None

    # -- attaching --------------------------------------------------------------------------------
    def open_picker(self) -> None:
        from app.tui.screens.file_picker import FilePicker

        app = self._screen.app
        if isinstance(app.screen, FilePicker):
            return
        info = self._pairing()
        if info is not None and not info.has_vision:
            self._screen.notify(f"Not attached: {no_vision_message(info)}", severity="error", timeout=8)
            return
        app.push_screen(FilePicker(pairing=info), callback=self._picked)

    def _picked(self, path: str | None) -> None:
        if path:
            self._bar.attach([path])
        self._prompt.focus()

    def attach(self, paths: list[str]) -> None:
        """Paths found in pasted text (a terminal's file drop)."""
        self._bar.attach(paths)

    def command(self, text: str, send: Callable[[str], bool]) -> bool:
        """Handle a `/image PATH [PATH...] [message]` prompt; False if the prompt is an ordinary
        message. The command stays in the prompt until every path attached, so a mistyped path can
        be fixed; then any message after the paths is sent with them by `send` (or, if it cannot be
        sent yet, left in the prompt)."""
        parsed = parse_image_command(text)
        if parsed is None:
            return False
        paths, message = parsed
        prompt = self._prompt
        if not paths:
            prompt.accept()
            self.open_picker()
            return True

        def done(ok: bool) -> None:
            if ok and prompt.text == text:
                prompt.accept()
                # `/image cat.png what is this?` sends the question with the image in the same Enter;
                # if it cannot be sent now (still loading, a reply streaming) it waits in the prompt
                if message and not send(message):
                    prompt.text = message
                    prompt.move_cursor(prompt.document.end)

        self._bar.attach(paths, done)
        return True

    # -- sending ----------------------------------------------------------------------------------
    def not_ready(self) -> str | None:
        if self._bar.busy:
            return "an attached image is still being checked"
        return None

    def take(self) -> list[ImageInfo]:
        """Hand the attached images to a message being sent; thumbnails go into the conversation."""
        images = self._bar.take()
        strip = None
        if images:
            strip = ImageStrip(images)
            self._conversation.mount(strip)
        self._turn = (images, strip)
        return images

    def turn_done(self, failed: bool) -> None:
        """A turn ended; a failed one gives its images back to the attachment bar."""
        turn, self._turn = self._turn, None
        if not failed or turn is None:
            return
        images, strip = turn
        if strip is not None:
            strip.remove()
        if images:
            self._bar.restore(images)
