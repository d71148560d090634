"""Gemma 4 image preprocessing: any common image file -> padded patch rows + patch positions.

Pure Pillow + numpy (no mlx), so the UI can validate an attachment without loading a model.

The rule (it must match HF's `Gemma4ImageProcessorPil` bit for bit, see tests/data/pack):
RGB (transparency composited over white) -> aspect-preserving PIL-bicubic resize of the uint8
image to the largest H x W, both multiples of patch*pool (48), with (H/16)*(W/16) <= 9*budget
-> /255 -> 16x16 patches in row-major order, each flattened (row, col, channel) -> zero rows up to
9*budget, with position (x=col, y=row) per real patch and (-1, -1) per padding row.
"""

from __future__ import annotations

import io
import math
import os
import stat
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np

from core.limits import IMAGE_BUDGETS

if TYPE_CHECKING:
    from PIL.Image import Image as PILImage

# a file path, the file's bytes, or an image already open
ImageSource: TypeAlias = "str | os.PathLike[str] | bytes | bytearray | memoryview | PILImage"

SUPPORTED_SOFT_TOKENS = IMAGE_BUDGETS
DEFAULT_MAX_SOFT_TOKENS = 280  # HF's default when a checkpoint says nothing
# Pillow's own default limit; a bigger image is refused before it is decoded.
DEFAULT_MAX_PIXELS = 89_478_485
MAX_IMAGE_FILE_BYTES = 256 << 20  # far above any photo; bounds what one attachment can cost in memory


class ImageError(ValueError):
    """An image could not be used. The message is meant for the user, as is."""


@dataclass(frozen=True)
class ImageProcessorConfig:
    max_soft_tokens: int = DEFAULT_MAX_SOFT_TOKENS
    patch_size: int = 16
    pooling_kernel_size: int = 3

    def __post_init__(self) -> None:
        check_max_soft_tokens(self.max_soft_tokens)

    @property
    def max_patches(self) -> int:
        return self.max_soft_tokens * self.pooling_kernel_size**2

    def with_max_soft_tokens(self, max_soft_tokens: int | None) -> ImageProcessorConfig:
        if max_soft_tokens is None:
            return self
        return ImageProcessorConfig(max_soft_tokens, self.patch_size, self.pooling_kernel_size)

    @classmethod
    def from_model_dir(cls, model_dir: str | os.PathLike, max_soft_tokens: int | None = None) -> ImageProcessorConfig:
        """Read the checkpoint's processor settings; `max_soft_tokens` (a user setting) overrides the budget.

        Looks in `preprocessor_config.json`, then `processor_config.json` (top level or its
        nested `image_processor`), then `config.json` (`vision_soft_tokens_per_image`,
        `vision_config.patch_size/pooling_kernel_size`).
        """
        model_dir = Path(model_dir)
        found: dict = {}
        sources = []
        for name in ("preprocessor_config.json", "processor_config.json"):
            data = _read_json(model_dir / name)
            if data:
                sources.append(data)
                if isinstance(data.get("image_processor"), dict):
                    sources.append(data["image_processor"])
        config = _read_json(model_dir / "config.json")
        vision = (config or {}).get("vision_config") or {}
        for src in sources:
            for key in ("max_soft_tokens", "patch_size", "pooling_kernel_size"):
                if key not in found and src.get(key) is not None:
                    found[key] = src[key]
        found.setdefault(
            "max_soft_tokens", (config or {}).get("vision_soft_tokens_per_image") or DEFAULT_MAX_SOFT_TOKENS
        )
        found.setdefault("patch_size", vision.get("patch_size", 16))
        found.setdefault("pooling_kernel_size", vision.get("pooling_kernel_size", 3))
        if max_soft_tokens is not None:
            found["max_soft_tokens"] = max_soft_tokens
        return cls(int(found["max_soft_tokens"]), int(found["patch_size"]), int(found["pooling_kernel_size"]))


@dataclass
class PreparedImage:
    """One image ready for the vision tower."""

    pixel_values: np.ndarray  # [9*budget, patch*patch*3] float32 in [0, 1]; padding rows are 0
    position_ids: np.ndarray  # [9*budget, 2] int64 (x=col, y=row); padding rows are (-1, -1)
    num_patches: int  # real (non-padding) rows
    num_soft_tokens: int  # what the tower returns: num_patches / pool**2
    resized_size: tuple[int, int]  # (height, width) fed to the patchifier
    original_size: tuple[int, int]  # (height, width) after EXIF orientation

    @property
    def grid(self) -> tuple[int, int]:
        """(patches high, patches wide)."""
        rows = int(self.position_ids[: self.num_patches, 1].max()) + 1
        cols = int(self.position_ids[: self.num_patches, 0].max()) + 1
        return rows, cols


def check_max_soft_tokens(max_soft_tokens: int) -> int:
    if max_soft_tokens not in SUPPORTED_SOFT_TOKENS:
        allowed = ", ".join(str(n) for n in SUPPORTED_SOFT_TOKENS)
        raise ImageError(f"Image token budget must be one of {allowed} (got {max_soft_tokens!r}).")
    return max_soft_tokens


def target_size(
    height: int, width: int, max_soft_tokens: int, patch_size: int = 16, pooling_kernel_size: int = 3
) -> tuple[int, int]:
    """(H, W) the Gemma 4 processor resizes a `height` x `width` image to."""
    if height <= 0 or width <= 0:
        raise ImageError(f"The image has no pixels ({width}x{height}).")
    max_patches = max_soft_tokens * pooling_kernel_size**2
    budget_px = max_patches * patch_size**2
    unit = patch_size * pooling_kernel_size
    # Same float operations, in the same order, as the reference: the floors must agree exactly.
    factor = math.sqrt(budget_px / (height * width))
    new_h = int(math.floor(factor * height / unit)) * unit
    new_w = int(math.floor(factor * width / unit)) * unit
    # A very thin image: its short side rounds to 0, so it gets one unit and the long side
    # grows with the aspect ratio, but never past the side that the whole budget would fill.
    max_side = (max_patches // pooling_kernel_size**2) * unit
    if new_h == 0:
        new_h, new_w = unit, min((width // height) * unit, max_side)
    elif new_w == 0:
        new_h, new_w = min((height // width) * unit, max_side), unit
    return new_h, new_w


def soft_token_count(
    height: int, width: int, max_soft_tokens: int, patch_size: int = 16, pooling_kernel_size: int = 3
) -> int:
    """Soft tokens (placeholders in the prompt) for an image of this size at this budget."""
    unit = patch_size * pooling_kernel_size
    h, w = target_size(height, width, max_soft_tokens, patch_size, pooling_kernel_size)
    return (h // unit) * (w // unit)


def _probe_file(path: Path, label: str, max_pixels: int) -> tuple[int, int]:
    """(width, height) of an image file from its header, after the checks that need no decoding:
    there, not a folder, not empty, not huge, an image Pillow knows, not too many pixels."""
    from PIL import Image, UnidentifiedImageError

    if not path.exists():
        raise ImageError(f"Image file not found: {path}")
    if path.is_dir():
        raise ImageError(f"{path} is a folder, not an image file.")
    try:
        st = path.stat()
    except OSError as exc:
        raise ImageError(f"Cannot read image file {path}: {exc.strerror or exc}") from exc
    if not stat.S_ISREG(st.st_mode):  # a FIFO would block the read, /dev/zero never end (their size is 0)
        raise ImageError(f"{path} is not a regular file.")
    size = st.st_size
    if size == 0:
        raise ImageError(f"Image file{label} is empty (0 bytes).")
    if size > MAX_IMAGE_FILE_BYTES:
        raise ImageError(
            f"Image file{label} is {size / 2**20:,.0f} MiB; the limit is {MAX_IMAGE_FILE_BYTES >> 20} MiB."
        )
    # The header first (Pillow reads only what it needs to identify the format and the size), so
    # a huge file that is not an image, or an image of too many pixels, is refused unread.
    try:
        with open(path, "rb") as head:
            w, h = _open(head, label, max_pixels, Image, UnidentifiedImageError).size
    except PermissionError as exc:
        raise ImageError(f"Permission denied reading image{label}.") from exc
    except OSError as exc:
        raise ImageError(f"Cannot read image file {path}: {exc.strerror or exc}") from exc
    if w * h > max_pixels:
        raise ImageError(f"Image{label} is too large ({w}x{h} = {w * h:,} pixels; the limit is {max_pixels:,}).")
    return w, h


def image_size(source: ImageSource, max_pixels: int = DEFAULT_MAX_PIXELS) -> tuple[int, int]:
    """(height, width) of an image file or bytes from its header alone, nothing decoded: what the
    soft-token count (soft_token_count) needs before any pixel buffer is made. EXIF rotation may swap the
    two; the count does not depend on which is which."""
    from PIL import Image, UnidentifiedImageError

    if isinstance(source, (bytes, bytearray, memoryview)):
        if len(source) == 0:
            raise ImageError("The image data is empty.")
        w, h = _open(io.BytesIO(bytes(source)), "", max_pixels, Image, UnidentifiedImageError).size
    elif isinstance(source, Image.Image):
        w, h = source.size
    else:
        path = Path(source).expanduser()
        w, h = _probe_file(path, f" '{path.name}'", max_pixels)
    if w <= 0 or h <= 0:
        raise ImageError(f"The image has no pixels ({w}x{h}).")
    if w * h > max_pixels:
        raise ImageError(f"The image is too large ({w}x{h} = {w * h:,} pixels; the limit is {max_pixels:,}).")
    return h, w


def load_image(source: ImageSource, max_pixels: int = DEFAULT_MAX_PIXELS) -> PILImage:
    """Open a file path, bytes or PIL image and return an upright RGB PIL image.

    The first frame of an animation is used. Raises ImageError with a user-facing message.
    """
    from PIL import Image, ImageOps, UnidentifiedImageError

    label = ""  # " 'name.png'" for files, so messages read "Image 'name.png' ..."
    if isinstance(source, Image.Image):
        image = source
    else:
        if isinstance(source, (bytes, bytearray, memoryview)):
            if len(source) == 0:
                raise ImageError("The image data is empty.")
            fp = io.BytesIO(bytes(source))
        else:
            path = Path(source).expanduser()
            label = f" '{path.name}'"
            _probe_file(path, label, max_pixels)
            try:
                # Read it whole: no file handle outlives this call, even for animations.
                fp = io.BytesIO(path.read_bytes())
            except PermissionError as exc:
                raise ImageError(f"Permission denied reading image{label}.") from exc
            except OSError as exc:
                raise ImageError(f"Cannot read image file {path}: {exc.strerror or exc}") from exc
        image = _open(fp, label, max_pixels, Image, UnidentifiedImageError)

    width, height = image.size
    if width <= 0 or height <= 0:
        raise ImageError(f"Image{label} has no pixels ({width}x{height}).")
    if width * height > max_pixels:
        raise ImageError(
            f"Image{label} is too large ({width}x{height} = {width * height:,} pixels; the limit is {max_pixels:,})."
        )
    try:
        if getattr(image, "n_frames", 1) > 1:
            image.seek(0)
        image.load()  # decode now so a truncated or corrupt file fails here, with a clear message
        try:
            image = ImageOps.exif_transpose(image)
        except Exception:  # a malformed EXIF block: show the pixels as stored rather than fail
            pass
        return _to_rgb(image)
    except ImageError:
        raise
    except (OSError, ValueError, SyntaxError, EOFError) as exc:
        raise ImageError(f"Image{label} is damaged or truncated and cannot be decoded ({exc}).") from exc


def _open(fp: Any, label: str, max_pixels: int, Image: Any, UnidentifiedImageError: type[Exception]) -> PILImage:
    try:
        with warnings.catch_warnings():
            # Pillow only warns between its limit and twice its limit; treat both alike.
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            return Image.open(fp)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise ImageError(f"Image{label} is too large to decode safely ({exc}).") from exc
    except UnidentifiedImageError as exc:
        raise ImageError(
            f"File{label} is not an image Pillow can read." if label else "The data is not an image Pillow can read."
        ) from exc
    except (OSError, ValueError, SyntaxError, EOFError) as exc:
        raise ImageError(f"Cannot read image{label}: {exc}") from exc


def _to_rgb(image: PILImage) -> PILImage:
    from PIL import Image

    if image.mode in ("I", "I;16", "I;16B", "I;16L", "I;16N", "F"):
        # Deep grayscale (16-bit PNG/TIFF, float TIFF): Pillow's convert("RGB") would clip at 255.
        values = np.asarray(image, dtype=np.float64)
        top = (
            1.0
            if image.mode == "F" and values.max(initial=0) <= 1.0
            else (255.0 if values.max(initial=0) <= 255 else 65535.0)
        )
        gray = np.clip(np.rint(values * (255.0 / top)), 0, 255).astype(np.uint8)
        return Image.fromarray(gray, "L").convert("RGB")
    has_alpha = "A" in image.getbands() or image.info.get("transparency") is not None
    if has_alpha:
        # Transparent pixels become white, as in HF's processor (not black, as convert("RGB") does).
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return image.convert("RGB")


def preprocess_image(
    source: ImageSource,
    config: ImageProcessorConfig | None = None,
    *,
    max_soft_tokens: int | None = None,
    max_pixels: int = DEFAULT_MAX_PIXELS,
) -> PreparedImage:
    """Image file/bytes/PIL image -> PreparedImage for the given processor config and budget."""
    from PIL import Image

    config = (config or ImageProcessorConfig()).with_max_soft_tokens(max_soft_tokens)
    rgb = load_image(source, max_pixels=max_pixels)
    width, height = rgb.size
    p, k = config.patch_size, config.pooling_kernel_size
    new_h, new_w = target_size(height, width, config.max_soft_tokens, p, k)
    if (new_h, new_w) != (height, width):
        rgb = rgb.resize((new_w, new_h), resample=Image.Resampling.BICUBIC)
    pixels = np.asarray(rgb, dtype=np.uint8)  # [H, W, 3]
    rows, cols = new_h // p, new_w // p
    num_patches = rows * cols
    if num_patches > config.max_patches:  # cannot happen with target_size; guards a future change
        raise ImageError(f"Resized image {new_w}x{new_h} exceeds {config.max_patches} patches.")

    # [rows, p, cols, p, 3] -> [rows, cols, p, p, 3]: patch-major, each patch row-major inside.
    patches = pixels.reshape(rows, p, cols, p, 3).transpose(0, 2, 1, 3, 4).reshape(num_patches, p * p * 3)
    pixel_values = np.zeros((config.max_patches, p * p * 3), dtype=np.float32)
    pixel_values[:num_patches] = patches.astype(np.float32) / np.float32(255.0)

    position_ids = np.full((config.max_patches, 2), -1, dtype=np.int64)
    ys, xs = np.divmod(np.arange(num_patches), cols)
    position_ids[:num_patches, 0] = xs
    position_ids[:num_patches, 1] = ys
    return PreparedImage(
        pixel_values=pixel_values,
        position_ids=position_ids,
        num_patches=num_patches,
        num_soft_tokens=num_patches // (k * k),
        resized_size=(new_h, new_w),
        original_size=(height, width),
    )


def _read_json(path: Path) -> dict | None:
    """A processor settings file, None when absent or not a JSON object (the defaults apply); a FIFO, a
    device or a folder in its place is an ImageError (core.model.loader): it would block the first image."""
    from core.model.loader import CheckpointError, checkpoint_file, read_checkpoint_json

    try:
        if checkpoint_file(path.parent, path.name) is None:
            return None
    except CheckpointError as e:
        raise ImageError(str(e)) from None
    try:
        return read_checkpoint_json(path.parent, path.name) or None
    except CheckpointError:
        return None
