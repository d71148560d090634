"""Pick an image or audio file: a folder tree showing only folders, image and audio files, and a
live preview of the highlighted file (an image's thumbnail, format, size and image tokens at the
pairing's budget; an audio clip's length, rate, size and waveform, or why the pairing takes none).

Enter (or a click on a file) attaches it, Backspace goes up a folder, Esc cancels. Dismisses with
the chosen path, or None. Previews are read in a thread worker; the newest highlight wins.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import DirectoryTree, Static, Tree
from textual.widgets.directory_tree import DirEntry

from app.resources import style_path
from app.tui.paths_in_text import is_attachment_name, is_audio_name
from app.tui.widgets.audio_clip import AudioInfo, describe_audio, inspect_audio
from app.tui.widgets.thumbnail import ImageInfo, Thumbnail, describe, inspect_image

if TYPE_CHECKING:
    from core.engine.contract import PairingInfo


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
        start_dir = Path(start or FilePicker.last_dir or Path.cwd()).expanduser()
        self.start_dir = start_dir if start_dir.is_dir() else Path.cwd()
        self.pairing = pairing
        self.files = ImageTree(self.start_dir, id="picker-tree")
        self.preview_pane = Vertical(id="picker-preview")
        self.details = Static("Highlight a file to preview it.", id="picker-details", markup=False)
        self.previewed: ImageInfo | AudioInfo | None = None

    def compose(self) -> ComposeResult:
        with Vertical(id="picker-dialog"):
            yield Static(self._title(self.start_dir), id="picker-title", markup=False)
            with Horizontal(id="picker-body"):
                yield self.files
                with self.preview_pane:
                    yield Vertical(id="picker-thumb")
                    yield self.details
            yield Static("Enter attach · Backspace up a folder · Esc cancel", id="picker-hint")

    def on_mount(self) -> None:
        self.files.focus()

    def on_directory_tree_file_selected(self, event: DirectoryTree.FileSelected) -> None:
        event.stop()
        FilePicker.last_dir = Path(event.path).parent
        self.dismiss(str(event.path))

    def on_tree_node_highlighted(self, event: Tree.NodeHighlighted[DirEntry]) -> None:
        data = event.node.data
        path = data.path if data is not None else None
        if path is None or path.is_dir():
            return
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
        highlighted = self.files.cursor_node
        data = highlighted.data if highlighted is not None else None
        if data is None or str(data.path) != path:
            return  # the cursor moved on; a newer preview is on its way
        self.previewed = info
        self.details.update(text)
        holder = self.query_one("#picker-thumb", Vertical)
        holder.remove_children()
        if isinstance(info, ImageInfo):
            holder.mount(Thumbnail(info, cells=(30, 10)))

    @staticmethod
    def _title(folder: Path) -> str:
        # as given: the start folder is absolute unless a caller says otherwise
        return f"Attach an image or audio clip · {folder}"

    def action_cancel(self) -> None:
        self.dismiss(None)

    def action_up(self) -> None:
        parent = Path(self.files.path).resolve().parent
        self.files.path = parent
        self.query_one("#picker-title", Static).update(self._title(parent))
        FilePicker.last_dir = parent
