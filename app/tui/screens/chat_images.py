"""The chat screen's attachments, images and audio clips: attaching them (Ctrl+O picker, pasted
paths, `/image`, `/audio`), handing them to the message being sent, and giving them back when its
turn fails.

`ChatImages` gets everything it touches passed in: the screen it notifies from and opens the picker
over, the attachment bar, the conversation (where a sent message's thumbnails and clips go), the
prompt, and the loaded pairing's info (None while loading). The screen's actions and message
handlers call it. Whether the pairing takes audio is the bar's `refusals` (the screen's rule).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from textual.containers import VerticalScroll
from textual.screen import Screen

from app.tui.widgets.attachments import (
    AUDIO_COMMAND,
    IMAGE_COMMAND,
    Attached,
    AttachmentBar,
    no_vision_message,
    parse_attach_command,
)
from app.tui.widgets.audio_clip import AudioInfo, AudioStrip
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
        # what the turn being generated took and the widgets showing it (given back if it fails)
        self._turn: tuple[list[Attached], list[ImageStrip | AudioStrip]] | None = None

    # -- attaching --------------------------------------------------------------------------------
    def open_picker(self) -> None:
        from app.tui.screens.file_picker import FilePicker

        app = self._screen.app
        if isinstance(app.screen, FilePicker):
            return
        info = self._pairing()
        no_audio = self._bar.audio_refusal()
        if info is not None and not info.has_vision and no_audio:
            self._screen.notify(f"Not attached: {no_vision_message(info)}", severity="error", timeout=8)
            return
        app.push_screen(FilePicker(pairing=info, no_audio=no_audio), callback=self._picked)

    def _picked(self, path: str | None) -> None:
        if path:
            self._bar.attach([path])
        self._prompt.focus()

    def attach(self, paths: list[str]) -> None:
        """Paths found in pasted text (a terminal's file drop)."""
        self._bar.attach(paths)

    def command(self, text: str, send: Callable[[str], bool]) -> bool:
        """Handle a `/image PATH [PATH...] [message]` or `/audio PATH [PATH...] [message]` prompt;
        False if the prompt is an ordinary message. The command stays in the prompt until every path
        attached, so a mistyped path (or a pairing that takes no audio) loses nothing typed; then any
        message after the paths is sent with them by `send` (or, if it cannot be sent yet, left in
        the prompt)."""
        for command in (IMAGE_COMMAND, AUDIO_COMMAND):
            parsed = parse_attach_command(text, command)
            if parsed is not None:
                break
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

        self._bar.attach(paths, done, as_audio=command == AUDIO_COMMAND)
        return True

    # -- sending ----------------------------------------------------------------------------------
    def not_ready(self) -> str | None:
        """Why the attachments cannot be sent now: one is still being checked, or the pairing (loaded
        since it was attached) takes no audio; None when they can."""
        if self._bar.busy:
            return "an attachment is still being checked"
        return self._bar.audio_refusal() if self._bar.clips else None

    def take(self) -> list[Attached]:
        """Hand the attachments to a message being sent; thumbnails and clips go into the conversation."""
        items = self._bar.take()
        images = [i for i in items if isinstance(i, ImageInfo)]
        clips = [i for i in items if isinstance(i, AudioInfo)]
        shown: list[ImageStrip | AudioStrip] = []
        if images:
            shown.append(ImageStrip(images))
        if clips:
            strip = AudioStrip(clips)
            strip.set_class(bool(images), "-after-images")
            shown.append(strip)
        for widget in shown:
            self._conversation.mount(widget)
        self._turn = (items, shown)
        return items

    def turn_done(self, failed: bool) -> None:
        """A turn ended; a failed one gives its attachments back to the attachment bar."""
        turn, self._turn = self._turn, None
        if not failed or turn is None:
            return
        items, shown = turn
        for widget in shown:
            widget.remove()
        if items:
            self._bar.restore(items)
