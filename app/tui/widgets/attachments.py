"""The images and audio clips attached to the message being written: one removable chip each,
above the prompt.

Attaching checks each file in a thread worker so the UI never waits on the disk: an image with
`thumbnail.inspect_image` (exists, readable, an image, not empty, not a decompression bomb, decodes),
an audio clip with `audio_clip.inspect_audio` (the engine's decoder: exists, not empty, audio, not
damaged). A pairing that reports no vision tower refuses images up front, one without audio refuses
clips up front (the screen says which: `audio_refusal`). Every refusal is a notification; nothing
else (the prompt's text, the other chips) changes. The full Gemma preprocessing is the engine's job.

Chips are focusable (Shift+Tab from the prompt reaches them): Delete, Backspace or x removes the
focused one; a click on a chip removes it too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from textual.binding import Binding
from textual.containers import Horizontal
from textual.widgets import Static

from app.tui.paths_in_text import is_audio_name
from app.tui.widgets.audio_clip import AudioInfo, inspect_audio
from app.tui.widgets.thumbnail import ImageInfo, inspect_image

if TYPE_CHECKING:
    from core.engine.contract import PairingInfo

Done = Callable[[bool], None]
Attached = ImageInfo | AudioInfo  # what a chip holds


def no_vision_message(pairing: PairingInfo) -> str:
    return f"{pairing.name} has no vision tower: it cannot take images. Pick a pairing with vision (F2)."


def no_audio_text(name: str) -> str:
    """Why the chat refuses a clip: the engine's sentence, and what to do about it."""
    from core.engine.local import no_audio_message

    return f"{no_audio_message(name)}. Pick E2B, E4B or 12B (F2)."


class AttachmentChip(Static, can_focus=True):
    DEFAULT_CSS = """
    AttachmentChip { width: auto; height: 1; padding: 0 1; margin: 0 1 0 0; background: $boost; }
    AttachmentChip:hover { background: $error 30%; }
    AttachmentChip:focus { background: $accent; color: $text; text-style: bold; }
    """
    BINDINGS = [Binding("delete,backspace,x", "remove_chip", "Remove attachment")]

    def __init__(self, info: Attached) -> None:
        label = info.chip_label() if isinstance(info, AudioInfo) else f"▣ {info.name} {info.width}x{info.height}"
        super().__init__(f"{label} ✕", markup=False, classes="chip")
        self.info = info
        self.tooltip = f"{info.path}\nclick, Delete or x to remove"

    def action_remove_chip(self) -> None:
        bar = self.parent
        if isinstance(bar, AttachmentBar):
            bar.remove_chip(self)

    def on_click(self) -> None:
        self.action_remove_chip()


class AttachmentBar(Horizontal):
    """Chips for the attached images and audio clips; hidden while there are none."""

    DEFAULT_CSS = "AttachmentBar { height: auto; padding: 0 1; } AttachmentBar.-empty { display: none; }"

    def __init__(
        self,
        pairing: Callable[[], PairingInfo | None] = lambda: None,
        return_focus: Callable[[], object] | None = None,
        audio_refusal: Callable[[], str | None] = lambda: None,
        **kwargs: Any,
    ) -> None:
        super().__init__(classes="-empty", **kwargs)
        self._pairing = pairing  # the engine's PairingInfo, or None while loading
        self._return_focus = return_focus
        self._audio_refusal = audio_refusal  # why the pairing takes no audio clip, or None
        self.items: list[Attached] = []  # in the order attached
        self.checking = 0  # paths being checked right now

    @property
    def images(self) -> list[ImageInfo]:
        return [i for i in self.items if isinstance(i, ImageInfo)]

    @property
    def clips(self) -> list[AudioInfo]:
        return [i for i in self.items if isinstance(i, AudioInfo)]

    @property
    def paths(self) -> list[str]:
        return [i.path for i in self.items]

    @property
    def busy(self) -> bool:
        return self.checking > 0

    # -- attaching --------------------------------------------------------------------------------
    def attach(self, paths: list[str], on_done: Done | None = None, as_audio: bool | None = None) -> None:
        """Check `paths` off the UI thread, then add a chip per good one; notify per bad one.
        `on_done(all_ok)` runs on the UI thread afterwards. `as_audio`: every path is an audio clip
        (True, `/audio`) or an image (False), whatever its name; None: by its name."""
        refused = self.refusals(paths, as_audio)
        for message in dict.fromkeys(refused.values()):
            self.notify(f"Not attached: {message}", severity="error", timeout=8)
        if refused:
            paths = [p for p in paths if p not in refused]
            if not paths:
                if on_done:
                    on_done(False)
                return
            on_done = _failed(on_done)
        if not paths:
            if on_done:
                on_done(True)
            return
        self.checking += len(paths)
        self.run_worker(
            lambda: self._check(list(paths), on_done, as_audio),
            thread=True,
            group="attach",
            name="check-attachments",
            exit_on_error=False,
        )

    def audio_refusal(self) -> str | None:
        """Why the pairing takes no audio clip now, or None (it does, or it is not known yet)."""
        return self._audio_refusal()

    def refusals(self, paths: list[str], as_audio: bool | None = None) -> dict[str, str]:
        """path -> why the loaded pairing cannot take it (an image without vision, a clip without
        audio), for the paths it refuses before any file is read."""
        pairing = self._pairing()
        no_vision = no_vision_message(pairing) if pairing is not None and not pairing.has_vision else None
        audio: str | None = None
        if any(_is_audio(p, as_audio) for p in paths):
            audio = self._audio_refusal()
        out = {}
        for p in paths:
            why = audio if _is_audio(p, as_audio) else no_vision
            if why:
                out[p] = why
        return out

    def _check(self, paths: list[str], on_done: Done | None, as_audio: bool | None) -> None:
        from core.model.audio_input import AudioError
        from core.model.image import ImageError

        good: list[Attached] = []
        bad: list[str] = []
        for path in paths:
            try:
                good.append(inspect_audio(path) if _is_audio(path, as_audio) else inspect_image(path))
            except (ImageError, AudioError) as e:
                bad.append(str(e))
            except Exception as e:  # anything else Pillow, libsndfile or the OS throws: a message, never a crash
                bad.append(f"Cannot use {path}: {type(e).__name__}: {e}")
        self.app.call_from_thread(self._checked, len(paths), good, bad, on_done)

    def _checked(self, n: int, good: list[Attached], bad: list[str], on_done: Done | None) -> None:
        self.checking -= n
        for info in good:
            self.add(info)
        for message in bad:
            self.notify(f"Not attached: {message}", severity="error", timeout=8)
        if on_done:
            on_done(not bad)

    def add(self, info: Attached) -> None:
        if info.path in self.paths:
            return
        self.items.append(info)
        self.mount(AttachmentChip(info))
        self.set_class(False, "-empty")

    # -- removing / handing over -----------------------------------------------------------------
    def remove_chip(self, chip: AttachmentChip) -> None:
        chips = list(self.query(AttachmentChip))
        index = chips.index(chip)
        self.items = [i for i in self.items if i.path != chip.info.path]
        chip.remove()
        rest = chips[:index] + chips[index + 1 :]
        if not rest:
            self.set_class(True, "-empty")
        if chip.has_focus:
            if rest:
                rest[min(index, len(rest) - 1)].focus()
            elif self._return_focus is not None:
                self._return_focus()

    def take(self) -> list[Attached]:
        """The attached images and clips, leaving the bar empty (the message took them)."""
        items, self.items = self.items, []
        self.query(AttachmentChip).remove()
        self.set_class(True, "-empty")
        return items

    def restore(self, items: list[Attached]) -> None:
        """Put back what a failed send took, ahead of anything attached since."""
        later = self.take()
        for info in [*items, *later]:
            self.add(info)


def _is_audio(path: str, as_audio: bool | None) -> bool:
    return is_audio_name(path) if as_audio is None else as_audio


def _failed(on_done: Done | None) -> Done | None:
    """`on_done` told that not every path attached, whatever the check of the rest says."""
    if on_done is None:
        return None
    return lambda _ok: on_done(False)


# -- the chat screen's side -------------------------------------------------------------------

IMAGE_COMMAND = "/image"
AUDIO_COMMAND = "/audio"


def user_content(text: str, items: list[Attached]) -> str | list[dict]:
    """A user message's content for the engine: images first, then audio clips, then the text."""
    if not items:
        return text
    images = [{"type": "image", "path": i.path} for i in items if isinstance(i, ImageInfo)]
    clips = [{"type": "audio", "path": i.path} for i in items if isinstance(i, AudioInfo)]
    return [*images, *clips, {"type": "text", "text": text}]


def parse_image_command(text: str) -> tuple[list[str], str] | None:
    """`/image PATH [PATH...] [message]` -> (paths, message); None when the prompt is not that
    command. The first word is always a path (so `/image notes.txt` says why it is no image);
    later words are paths when they name image files (see paths_in_text), the rest is the message."""
    return parse_attach_command(text, IMAGE_COMMAND)


def parse_attach_command(text: str, command: str) -> tuple[list[str], str] | None:
    """`/image ...` or `/audio PATH [PATH...] [message]` -> (paths, message), as parse_image_command
    says; `/audio`'s later paths are audio files."""
    from app.tui.paths_in_text import file_path, find_image_paths, is_audio_name, is_image_name, split_words

    stripped = text.strip()
    if stripped != command and not stripped.startswith(command + " "):
        return None
    rest = stripped[len(command) :].lstrip()
    words = split_words(rest)
    if not words:
        return [], ""
    first = file_path(words[0].value)
    accept = is_audio_name if command == AUDIO_COMMAND else is_image_name
    found = find_image_paths(rest[words[0].end :].lstrip(), accept=accept)
    return [first, *(p for p in found.paths if p != first)], found.text.strip()
