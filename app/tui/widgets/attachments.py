"""The images attached to the message being written: one removable chip each, above the prompt.

Attaching checks each file in a thread worker (`thumbnail.inspect_image`: exists, readable, an image,
not empty, not a decompression bomb, decodes) so the UI never waits on the disk; a pairing that
reports no vision tower refuses attachments up front. Every refusal is a notification; nothing else
(the prompt's text, the other chips) changes. The full Gemma preprocessing is the engine's job.

Chips are focusable (Shift+Tab from the prompt reaches them): Delete, Backspace or x removes the
focused one; a click on a chip removes it too.
"""

from __future__ import annotations

from collections.abc import Callable

from textual.binding import Binding
from textual.containers import Horizontal
from textual.widgets import Static

from app.tui.widgets.thumbnail import ImageInfo, inspect_image

Done = Callable[[bool], None]


def no_vision_message(pairing) -> str:
    return f"{pairing.name} has no vision tower: it cannot take images. Pick a pairing with vision (F2)."


class AttachmentChip(Static, can_focus=True):
    DEFAULT_CSS = """
    AttachmentChip { width: auto; height: 1; padding: 0 1; margin: 0 1 0 0; background: $boost; }
    AttachmentChip:hover { background: $error 30%; }
    AttachmentChip:focus { background: $accent; color: $text; text-style: bold; }
    """
    BINDINGS = [Binding("delete,backspace,x", "remove_chip", "Remove image")]

    def __init__(self, info: ImageInfo) -> None:
        super().__init__(f"▣ {info.name} {info.width}x{info.height} ✕", markup=False, classes="chip")
        self.info = info
        self.tooltip = f"{info.path}\nclick, Delete or x to remove"

    def action_remove_chip(self) -> None:
        bar = self.parent
        if isinstance(bar, AttachmentBar):
            bar.remove_chip(self)

    def on_click(self) -> None:
        self.action_remove_chip()


class AttachmentBar(Horizontal):
    """Chips for the attached images; hidden while there are none."""

    DEFAULT_CSS = "AttachmentBar { height: auto; padding: 0 1; } AttachmentBar.-empty { display: none; }"

    def __init__(
        self, pairing: Callable[[], object] = lambda: None, return_focus: Callable[[], object] | None = None, **kwargs
    ) -> None:
        super().__init__(classes="-empty", **kwargs)
        self._pairing = pairing  # the engine's PairingInfo, or None while loading
        self._return_focus = return_focus
        self.images: list[ImageInfo] = []
        self.checking = 0  # paths being checked right now

    @property
    def paths(self) -> list[str]:
        return [i.path for i in self.images]

    @property
    def busy(self) -> bool:
        return self.checking > 0

    # -- attaching --------------------------------------------------------------------------------
    def attach(self, paths: list[str], on_done: Done | None = None) -> None:
        """Check `paths` off the UI thread, then add a chip per good one; notify per bad one.
        `on_done(all_ok)` runs on the UI thread afterwards."""
        pairing = self._pairing()
        if pairing is not None and not getattr(pairing, "has_vision", True):
            self.notify(f"Not attached: {no_vision_message(pairing)}", severity="error", timeout=8)
            if on_done:
                on_done(False)
            return
        if not paths:
            if on_done:
                on_done(True)
            return
        self.checking += len(paths)
        self.run_worker(
            lambda: self._check(list(paths), on_done),
            thread=True,
            group="attach",
            name="check-images",
            exit_on_error=False,
        )

    def _check(self, paths: list[str], on_done: Done | None) -> None:
        from core.image import ImageError

        good: list[ImageInfo] = []
        bad: list[str] = []
        for path in paths:
            try:
                good.append(inspect_image(path))
            except ImageError as e:
                bad.append(str(e))
            except Exception as e:  # anything else Pillow or the OS throws: still a message, never a crash
                bad.append(f"Cannot use {path}: {type(e).__name__}: {e}")
        self.app.call_from_thread(self._checked, len(paths), good, bad, on_done)

    def _checked(self, n: int, good: list[ImageInfo], bad: list[str], on_done: Done | None) -> None:
        self.checking -= n
        for info in good:
            self.add(info)
        for message in bad:
            self.notify(f"Not attached: {message}", severity="error", timeout=8)
        if on_done:
            on_done(not bad)

    def add(self, info: ImageInfo) -> None:
        if info.path in self.paths:
            return
        self.images.append(info)
        self.mount(AttachmentChip(info))
        self.set_class(False, "-empty")

    # -- removing / handing over -----------------------------------------------------------------
    def remove_chip(self, chip: AttachmentChip) -> None:
        chips = list(self.query(AttachmentChip))
        index = chips.index(chip)
        self.images = [i for i in self.images if i.path != chip.info.path]
        chip.remove()
        rest = chips[:index] + chips[index + 1 :]
        if not rest:
            self.set_class(True, "-empty")
        if chip.has_focus:
            if rest:
                rest[min(index, len(rest) - 1)].focus()
            elif self._return_focus is not None:
                self._return_focus()

    def take(self) -> list[ImageInfo]:
        """The attached images, leaving the bar empty (the message took them)."""
        images, self.images = self.images, []
        self.query(AttachmentChip).remove()
        self.set_class(True, "-empty")
        return images

    def restore(self, images: list[ImageInfo]) -> None:
        """Put back images a failed send took, ahead of any attached since."""
        later = self.take()
        for info in [*images, *later]:
            self.add(info)


# -- the chat screen's side -------------------------------------------------------------------

IMAGE_COMMAND = "/image"


def user_content(text: str, images: list[ImageInfo]) -> str | list[dict]:
    """A user message's content for the engine: images first, then the text."""
    if not images:
        return text
    return [*({"type": "image", "path": i.path} for i in images), {"type": "text", "text": text}]


def parse_image_command(text: str) -> tuple[list[str], str] | None:
    """`/image PATH [PATH...] [message]` -> (paths, message); None when the prompt is not that
    command. The first word is always a path (so `/image notes.txt` says why it is no image);
    later words are paths when they name image files (see paths_in_text), the rest is the message."""
    from app.tui.paths_in_text import file_path, find_image_paths, split_words

    stripped = text.strip()
    if stripped != IMAGE_COMMAND and not stripped.startswith(IMAGE_COMMAND + " "):
        return None
    rest = stripped[len(IMAGE_COMMAND) :].lstrip()
    words = split_words(rest)
    if not words:
        return [], ""
    first = file_path(words[0].value)
    found = find_image_paths(rest[words[0].end :].lstrip())
    return [first, *(p for p in found.paths if p != first)], found.text.strip()


class ImageActions:
    """Mixed into ChatScreen: attaching (Ctrl+O picker, pasted paths, `/image`), sending the images
    with the message, and giving them back when the turn fails. Expects `engine`, `prompt`,
    `conversation` and `attachments` (an AttachmentBar) on the screen."""

    _turn_images: tuple[list[ImageInfo], object] | None = None

    def action_attach_image(self) -> None:
        from app.tui.screens.file_picker import FilePicker

        if isinstance(self.app.screen, FilePicker):
            return
        info = self.engine.info
        if info is not None and not info.has_vision:
            self.notify(f"Not attached: {no_vision_message(info)}", severity="error", timeout=8)
            return
        self.app.push_screen(FilePicker(pairing=info), callback=self._picked)

    def _picked(self, path: str | None) -> None:
        if path:
            self.attachments.attach([path])
        self.prompt.focus()

    def on_images_pasted(self, message) -> None:
        message.stop()
        self.attachments.attach(message.paths)

    def image_command(self, text: str) -> bool:
        """Handle a `/image PATH [PATH...] [message]` prompt; False if the prompt is an ordinary
        message. The command stays in the prompt until every path attached, so a mistyped path can
        be fixed; then any message after the paths is sent with them (or, if it cannot be sent yet,
        left in the prompt)."""
        parsed = parse_image_command(text)
        if parsed is None:
            return False
        paths, message = parsed
        if not paths:
            self.prompt.accept()
            self.action_attach_image()
            return True

        def done(ok: bool) -> None:
            if ok and self.prompt.text == text:
                self.prompt.accept()
                # `/image cat.png what is this?` sends the question with the image in the same Enter;
                # if it cannot be sent now (still loading, a reply streaming) it waits in the prompt
                if message and not self.send(message):
                    self.prompt.text = message
                    self.prompt.move_cursor(self.prompt.document.end)

        self.attachments.attach(paths, done)
        return True

    def images_not_ready(self) -> str | None:
        if self.attachments.busy:
            return "an attached image is still being checked"
        return None

    def take_images(self) -> list[ImageInfo]:
        """Hand the attached images to a message being sent; thumbnails go into the conversation."""
        from app.tui.widgets.thumbnail import ImageStrip

        images = self.attachments.take()
        strip = None
        if images:
            strip = ImageStrip(images)
            self.conversation.mount(strip)
        self._turn_images = (images, strip)
        return images

    def images_turn_done(self, failed: bool) -> None:
        """A turn ended; a failed one gives its images back to the attachment bar."""
        turn, self._turn_images = self._turn_images, None
        if not failed or turn is None:
            return
        images, strip = turn
        if strip is not None:
            strip.remove()
        if images:
            self.attachments.restore(images)
