"""Pick an image or audio file: a folder tree showing only folders, image and audio files, a path
line above it, and a live preview of the highlighted (or typed) file (an image's thumbnail, format,
size and image tokens at the pairing's budget; an audio clip's length, rate, size and waveform, or
why the pairing takes none).

Enter (or a click on a file) attaches it, Backspace goes up a folder, Esc cancels. Typing or pasting
anywhere in the picker goes to the path line (quoted, backslash-escaped, `~` and file:// paths as a
terminal's drop spells them; relative to the folder shown); Tab completes it from the folder's
entries, and Enter there attaches a file or opens a folder, or says why it cannot and keeps the text.
Dismisses with the chosen path, or None. Previews are read in a thread worker; the newest wins.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from textual import events, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.suggester import Suggester
from textual.widgets import DirectoryTree, Input, Static, Tree
from textual.widgets.directory_tree import DirEntry

from app.resources import style_path
from app.tui.paths_in_text import IMAGE_SUFFIXES, file_path, is_attachment_name, is_audio_name, split_words
from app.tui.widgets.audio_clip import AudioInfo, describe_audio, inspect_audio
from app.tui.widgets.ordered_input import OrderedInput, run_own_binding
from app.tui.widgets.thumbnail import ImageInfo, Thumbnail, describe, inspect_image
from core.limits import AUDIO_SUFFIXES

if TYPE_CHECKING:
    from core.engine.contract import PairingInfo


THUMB_ROWS = 10  # the preview's picture, where the dialog is tall enough
MIN_THUMB_ROWS = 3  # below this the preview is the details alone


class ImageTree(DirectoryTree):
    """Folders, image and audio files; hidden entries left out."""

    def filter_paths(self, paths: Iterable[Path]) -> Iterable[Path]:
        out = []
        for p in paths:
            if p.name.startswith("."):
                continue
            try:
                if p.is_dir() or is_attachment_name(p.name):
                    out.append(p)
            except OSError:  # a dangling link or a folder we may not stat
                continue
        return out


def typed_path(text: str, folder: Path) -> Path:
    """The path a typed or pasted line names: as it is if that exists, else as one shell-like word
    (a drop's quotes and escapes undone); file:// and ~ expanded; relative to `folder` (or, where only
    that exists, to the folder gemma-chat started in, as `/image PATH` reads it); absolute."""
    raw = text.strip()
    words = split_words(raw)
    candidates = [raw] + ([words[0].value] if len(words) == 1 and words[0].value != raw else [])
    # an absolute path replaces `folder`; "..", "." and doubled separators are folded away (links kept)
    paths = [Path(os.path.abspath(folder / file_path(c))) for c in candidates]
    try:
        started_in = Path.cwd()
    except OSError:  # the folder was removed since
        started_in = folder
    # a path typed from where the user started the app, while the picker shows another folder
    from_start = [Path(os.path.abspath(started_in / file_path(c))) for c in candidates]
    return next((p for p in paths + from_start if _exists(p)), paths[-1])


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except OSError:  # a folder on the way we may not read
        return False


def completion(text: str, folder: Path) -> str | None:
    """`text` completed by the first entry of its folder that its last part begins (folders end in
    "/"; only folders and attachable files; hidden ones only when the part begins with a dot). A path
    begun with a quote is completed inside it, and a file closes the quote."""
    quote = text[:1] if text[:1] in "'\"" else ""
    body = text[len(quote) :]
    if not body or (quote and body.endswith(quote)):
        return None  # nothing typed, or a closed quote
    head, part = os.path.split(body)
    where = folder / file_path(head) if head else folder
    try:
        names = sorted(e.name for e in os.scandir(where) if e.name.startswith(part))
    except (OSError, ValueError):  # ValueError: a NUL in what was pasted
        return None
    for name in names:
        if name == part or (name.startswith(".") and not part.startswith(".")):
            continue
        full = where / name
        try:
            if full.is_dir():
                return text + name[len(part) :] + os.sep
            if is_attachment_name(name):
                return text + name[len(part) :] + quote
        except OSError:
            continue
    return None


class PathSuggester(Suggester):
    """Suggests `completion` of the typed path in the picker's current folder."""

    def __init__(self, folder: Callable[[], Path]) -> None:
        super().__init__(use_cache=False, case_sensitive=True)
        self.folder = folder

    async def get_suggestion(self, value: str) -> str | None:
        return completion(value, self.folder())


class PathInput(OrderedInput):
    """The picker's path line: Tab takes the suggested completion (or moves on when there is none)."""

    BINDINGS = [Binding("tab", "complete", "Complete the path", show=False)]

    def action_complete(self) -> None:
        if self._suggestion and self._suggestion != self.value:
            self.value = self._suggestion
            self.cursor_position = len(self.value)
        else:
            self.screen.focus_next()


class FilePicker(ModalScreen[str | None]):
    CSS_PATH = str(style_path("file_picker.tcss"))
    BINDINGS = [
        Binding("escape", "cancel", "Cancel"),
        Binding("backspace", "up", "Up a folder"),
    ]
    last_dir: Path | None = None  # where the previous pick was made (per process)

    def __init__(
        self, start: str | Path | None = None, pairing: PairingInfo | None = None, no_audio: str | None = None
    ) -> None:
        super().__init__()
        self.no_audio = no_audio  # why the pairing takes no audio (the preview says it), or None
        self._typing = False  # keys typed in the tree went to the path line, whose focus may be on its way
        start_dir = Path(start or FilePicker.last_dir or Path.cwd()).expanduser()
        self.start_dir = start_dir if start_dir.is_dir() else Path.cwd()
        self.pairing = pairing
        self.files = ImageTree(self.start_dir, id="picker-tree")
        self.preview_pane = Vertical(id="picker-preview")
        self.details = Static("Highlight a file to preview it.", id="picker-details", markup=False)
        self.path_line = PathInput(
            placeholder="type or paste a path",
            id="picker-path",
            suggester=PathSuggester(self.folder),
            select_on_focus=False,  # the key that moved the focus here is already in it
        )
        self.previewed: ImageInfo | AudioInfo | None = None
        self.preview_for: str | None = None  # the path whose preview is wanted (the newest highlight or typed file)

    def compose(self) -> ComposeResult:
        with Vertical(id="picker-dialog"):
            yield Static(self._title(self.start_dir), id="picker-title", markup=False)
            yield self.path_line
            with Horizontal(id="picker-body"):
                yield self.files
                with self.preview_pane:
                    yield Vertical(id="picker-thumb")
                    yield self.details
            yield Static("Enter attach · type a path, Tab completes · Bksp up · Esc cancel", id="picker-hint")

    def on_mount(self) -> None:
        self.files.focus()

    def folder(self) -> Path:
        return Path(self.files.path)

    # -- the path line ----------------------------------------------------------------------------
    async def on_key(self, event: events.Key) -> None:
        # typing in the tree starts a path (Space stays the tree's until a path is begun: keys typed fast
        # can still reach the tree before the focus has moved)
        c = event.character
        if self.focused is self.files and event.is_printable and c and (c != " " or self.path_line.value):
            event.stop()
            event.prevent_default()
            self._typing = True
            self.path_line.focus()
            self.path_line.insert_text_at_cursor(c)
        elif self.focused is self.files and self._typing:
            # an editing key (Backspace, an arrow, Enter) queued behind the typed ones, still on its way to
            # the tree: it edits the path line where it came (left to the app, it ran after the keys behind it)
            await run_own_binding(self.path_line, event)

    def on_descendant_focus(self, event: events.DescendantFocus) -> None:
        if event.widget is self.files:  # the tree's keys are the tree's again
            self._typing = False

    def on_paste(self, event: events.Paste) -> None:
        if self.focused is not self.path_line:
            event.stop()
            self.path_line.value = " ".join(event.text.split("\n")).strip()  # a one-line input
            self.path_line.cursor_position = len(self.path_line.value)
            self.path_line.focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        if not event.value.strip():
            return
        path = typed_path(event.value, self.folder())
        try:
            if path.is_file() and is_attachment_name(path.name):
                self._preview(path)
        except OSError:
            pass

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        if not event.value.strip():
            self.files.focus()
            return
        path = typed_path(event.value, self.folder())
        try:
            is_dir, is_file = path.is_dir(), path.is_file()
        except OSError as e:
            self._refuse(f"✗ {path}: {e.strerror or e}")
            return
        if is_dir:
            self._open_folder(path)
            self.path_line.value = ""
            self.files.focus()
        elif not is_file:
            self._refuse(f"✗ No such file or folder:\n{path}")
        elif not is_attachment_name(path.name):
            suffixes = " ".join(IMAGE_SUFFIXES + tuple(AUDIO_SUFFIXES))
            self._refuse(f"✗ {path.name} is not an image or audio file\n({suffixes})")
        else:
            FilePicker.last_dir = path.parent
            self.dismiss(str(path))

    def _refuse(self, text: str) -> None:
        """Say why the typed path cannot be attached; the text stays to be mended."""
        self.preview_for, self.previewed = None, None
        self.query_one("#picker-thumb", Vertical).remove_children()
        self.details.update(text)

    def on_directory_tree_file_selected(self, event: DirectoryTree.FileSelected) -> None:
        event.stop()
        FilePicker.last_dir = Path(event.path).parent
        self.dismiss(str(event.path))

    def on_tree_node_highlighted(self, event: Tree.NodeHighlighted[DirEntry]) -> None:
        data = event.node.data
        path = data.path if data is not None else None
        if path is None or path.is_dir():
            return
        self._preview(path)

    def _preview(self, path: Path) -> None:
        if self.preview_for == str(path):
            return
        self.preview_for = str(path)
        self.details.update(f"{path.name}\nreading…")
        self._load_preview(str(path))

    @work(thread=True, exclusive=True, group="preview", exit_on_error=False)
    def _load_preview(self, path: str) -> None:
        from core.model.audio_input import AudioError
        from core.model.image import ImageError

        info: ImageInfo | AudioInfo | None = None
        try:
            if is_audio_name(path):
                info = clip = inspect_audio(path)
                text = describe_audio(clip, self.no_audio)
            else:
                info = inspected = inspect_image(path)
                text = describe(inspected, self.pairing)
        except (ImageError, AudioError) as e:
            info, text = None, f"{Path(path).name}\n✗ {e}"
        except Exception as e:
            info, text = None, f"{Path(path).name}\n✗ {type(e).__name__}: {e}"
        self.app.call_from_thread(self._show_preview, path, info, text)

    def _show_preview(self, path: str, info: ImageInfo | AudioInfo | None, text: str) -> None:
        if path != self.preview_for:
            return  # the cursor (or the typed path) moved on; a newer preview is on its way
        self.previewed = info
        self.details.update(text)
        holder = self.query_one("#picker-thumb", Vertical)
        holder.remove_children()
        if isinstance(info, ImageInfo):
            # the picture gives way to the details (the image tokens): its caption, their margin and lines
            rows = min(THUMB_ROWS, self.preview_pane.size.height - 2 - (text.count("\n") + 1))
            if rows >= MIN_THUMB_ROWS:
                holder.mount(Thumbnail(info, cells=(30, rows)))

    @staticmethod
    def _title(folder: Path) -> str:
        # as given: the start folder is absolute unless a caller says otherwise
        return f"Attach an image or audio clip · {folder}"

    def action_cancel(self) -> None:
        self.dismiss(None)

    def action_up(self) -> None:
        self._open_folder(Path(self.files.path).resolve().parent)

    def _open_folder(self, folder: Path) -> None:
        self.files.path = folder
        self.query_one("#picker-title", Static).update(self._title(folder))
        FilePicker.last_dir = folder
