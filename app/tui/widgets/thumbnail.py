"""Image thumbnails: terminal graphics where the terminal has them, half-cell blocks otherwise, and a
plain `[image: name WxH]` label when neither works (no terminal, or forced for tests).

How a thumbnail is drawn (`thumbnail_mode`), from env GEMMA_CHAT_THUMBNAILS:
  graphics   textual-image's auto widget (Sixel or the kitty graphics protocol)
  halfcell   "▀" cells, foreground = upper pixel, background = lower pixel (every truecolor terminal)
  label      text only: deterministic, what tests and snapshots use
  auto       (default) graphics if `prime_terminal_graphics()` ran before Textual started and the
             terminal answered for Sixel/TGP, else halfcell on a terminal, else label.
textual-image must query the terminal before Textual owns stdin, hence the priming step.

`inspect_image` is the cheap attach-time check (decode once with core.model.image's guards, keep a small
copy for thumbnails); it does blocking I/O, so callers run it in a thread worker.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widget import Widget
from textual.widgets import Static

if TYPE_CHECKING:
    from PIL.Image import Image as PILImage

    from core.engine.contract import PairingInfo

MODE_ENV = "GEMMA_CHAT_THUMBNAILS"
MODES = ("auto", "graphics", "halfcell", "label")
PREVIEW_PX = 256  # the longest side of the copy kept for thumbnails


@dataclass(frozen=True)
class ImageInfo:
    """An attached image, checked: what the chips, thumbnails and the picker show."""

    path: str
    width: int
    height: int
    format: str  # Pillow's format name ("PNG", "JPEG"), "" if unknown
    size_bytes: int
    preview: PILImage | None = field(default=None, compare=False, repr=False)  # small RGB copy

    @property
    def name(self) -> str:
        return Path(self.path).name

    def label(self) -> str:
        return f"[image: {self.name} {self.width}x{self.height}]"


def inspect_image(path: str) -> ImageInfo:
    """Open, decode and measure an image file; raises core.model.image.ImageError (user-facing message)."""
    from PIL import Image

    from core.model.image import ImageError, load_image

    if not str(path).strip():
        raise ImageError("No image path given.")
    p = Path(path).expanduser()
    rgb = load_image(p)  # missing, folder, empty, not an image, too many pixels, truncated
    try:
        with Image.open(p) as raw:  # header only: the format name
            fmt = raw.format or ""
    except Exception:
        fmt = ""
    preview = rgb.copy()
    preview.thumbnail((PREVIEW_PX, PREVIEW_PX))
    return ImageInfo(str(p), rgb.width, rgb.height, fmt, p.stat().st_size, preview)


def soft_tokens(info: ImageInfo, pairing: PairingInfo | None) -> tuple[int, int] | None:
    """(soft tokens this image takes, the budget) for the pairing's processor, or None if unknown."""
    from core.model.image import ImageError, ImageProcessorConfig, soft_token_count

    target = pairing.target_path if pairing is not None else None
    try:
        config = ImageProcessorConfig.from_model_dir(target) if target else ImageProcessorConfig()
        count = soft_token_count(
            info.height, info.width, config.max_soft_tokens, config.patch_size, config.pooling_kernel_size
        )
    except (ImageError, ValueError, TypeError):
        return None
    return count, config.max_soft_tokens


def describe(info: ImageInfo, pairing: PairingInfo | None = None) -> str:
    """Two or three lines for the picker's preview pane."""
    n = info.size_bytes
    size = f"{n} B" if n < 1024 else f"{n / 1024:.0f} KB" if n < 1024**2 else f"{n / 1024**2:.1f} MB"
    lines = [info.name, f"{info.format or 'image'} {info.width}x{info.height}, {size}"]
    tokens = soft_tokens(info, pairing)
    if tokens is not None:
        lines.append(f"{tokens[0]} image tokens (budget {tokens[1]})")
    return "\n".join(lines)


# -- drawing ----------------------------------------------------------------------------------


def thumbnail_mode() -> str:
    mode = os.environ.get(MODE_ENV, "auto").strip().lower()
    if mode in MODES and mode != "auto":
        return mode
    if _graphics_widget() is not None:
        return "graphics"
    out = sys.__stdout__
    return "halfcell" if out is not None and out.isatty() else "label"


def prime_terminal_graphics() -> None:
    """Let textual-image ask the terminal what it can draw. Call before the Textual app runs."""
    if os.environ.get(MODE_ENV, "auto").strip().lower() not in ("auto", "graphics"):
        return
    out = sys.__stdout__
    if out is None or not out.isatty():
        return
    try:
        import textual_image.widget  # noqa: F401  (the import is the query)
    except Exception:  # any trouble talking to the terminal: half-cell blocks still work
        pass


def _graphics_widget() -> Callable[..., Widget] | None:
    """textual-image's widget class if it was primed and picked Sixel or TGP, else None."""
    module = sys.modules.get("textual_image.widget")
    if module is None:
        return None
    from textual_image.renderable import Image as chosen
    from textual_image.renderable.sixel import Image as SixelRenderable
    from textual_image.renderable.tgp import Image as TGPRenderable

    return module.Image if chosen in (SixelRenderable, TGPRenderable) else None


def halfcell_text(image: PILImage, max_width: int, max_height: int) -> Text:
    """The image in at most max_width x max_height cells, two pixels per cell ("▀"), aspect kept.
    A cell is about twice as tall as wide, so a half cell is about square."""
    from PIL import Image

    w, h = image.size
    scale = min(max_width / w, 2 * max_height / h)
    cols = max(1, round(w * scale))
    rows = max(2, round(h * scale / 2) * 2)
    small = image.convert("RGB").resize((cols, rows), Image.Resampling.BILINEAR)
    px = small.load()
    assert px is not None  # loaded by the resize
    text = Text(no_wrap=True, overflow="crop")
    for y in range(0, rows, 2):
        for x in range(cols):
            top, bottom = cast("tuple[int, int, int]", px[x, y]), cast("tuple[int, int, int]", px[x, y + 1])
            text.append(
                "▀",
                Style(color=f"rgb({top[0]},{top[1]},{top[2]})", bgcolor=f"rgb({bottom[0]},{bottom[1]},{bottom[2]})"),
            )
        if y + 2 < rows:
            text.append("\n")
    return text


class Thumbnail(Vertical):
    """One image: its picture (per `thumbnail_mode`) and a caption, or just the label."""

    DEFAULT_CSS = """
    Thumbnail { width: auto; height: auto; margin: 0 1 0 0; }
    Thumbnail .thumb-caption { color: $text-muted; width: auto; }
    Thumbnail .thumb-picture { width: auto; height: auto; }
    """

    def __init__(
        self, info: ImageInfo, cells: tuple[int, int] = (24, 8), mode: str | None = None, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.info = info
        self.cells = cells
        self.mode = mode or thumbnail_mode()

    def compose(self) -> ComposeResult:
        info = self.info
        if self.mode == "label" or info.preview is None:
            yield Static(info.label(), classes="thumb-caption thumb-label", markup=False)
            return
        if self.mode == "graphics" and (cls := _graphics_widget()) is not None:
            picture = cls(info.preview, classes="thumb-picture")
            w, h = self.cells
            picture.styles.width, picture.styles.height = w, h
            yield picture
        else:
            yield Static(halfcell_text(info.preview, *self.cells), classes="thumb-picture")
        yield Static(f"{info.name} {info.width}x{info.height}", classes="thumb-caption", markup=False)


class ImageStrip(Horizontal):
    """The thumbnails of a user message's images, shown above its text in the conversation."""

    DEFAULT_CSS = "ImageStrip { height: auto; }"

    def __init__(self, images: list[ImageInfo], cells: tuple[int, int] = (24, 8), **kwargs: Any) -> None:
        super().__init__(classes="user-images", **kwargs)
        self.images = list(images)
        self.cells = cells

    def compose(self) -> ComposeResult:
        for info in self.images:
            yield Thumbnail(info, self.cells)
