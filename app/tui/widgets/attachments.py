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
from typing import TYPE_CHECKING, Any

from textual.binding import Binding
from textual.containers import Horizontal
from textual.widgets import Static

from app.tui.widgets.thumbnail import ImageInfo, inspect_image

if TYPE_CHECKING:
    from core.engine.contract import PairingInfo

Done = Callable[[bool], None]


def no_vision_message(pairing: PairingInfo) -> str:
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
        self,
        pairing: Callable[[], PairingInfo | None] = lambda: None,
        return_focus: Callable[[], object] | None = None,
        **kwargs: Any,
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
        if pairing is not None and not pairing.has_vision:
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
        from core.model.image import ImageError

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
