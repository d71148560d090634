"""Image preprocessing against HF's Gemma 4 processor references, formats, and error paths."""

from __future__ import annotations

import hashlib
import io
import json
import os
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from safetensors.numpy import load_file

from core.model.image import (
    ImageError,
    ImageProcessorConfig,
    load_image,
    preprocess_image,
    soft_token_count,
    target_size,
)

PACK = Path(__file__).parents[1] / "data" / "pack"
IMAGES = PACK / "references" / "images"
PREPROCESS = json.loads((IMAGES / "preprocess.json").read_text())
CASES = [(name, int(budget)) for name, case in PREPROCESS["cases"].items() for budget in case["budgets"]]
ASSETS = Path(__file__).parents[2] / "assets" / "images"


@pytest.mark.parametrize("name,budget", CASES, ids=[f"{n}-{b}" for n, b in CASES])
def test_matches_hf_processor_reference(name, budget):
    case = PREPROCESS["cases"][name]
    ref = case["budgets"][str(budget)]
    im = preprocess_image(IMAGES / case["input"]["file"], max_soft_tokens=budget)
    n = im.num_patches

    assert im.resized_size == (ref["resized_height"], ref["resized_width"])
    assert im.grid == (ref["patches_high"], ref["patches_wide"])
    assert n == ref["num_patches"]
    assert im.num_soft_tokens == ref["num_soft_tokens"]
    assert soft_token_count(case["input"]["height"], case["input"]["width"], budget) == ref["num_soft_tokens"]
    assert [1, *im.pixel_values.shape] == ref["pixel_values_shape"]
    assert im.pixel_values.dtype == np.float32

    real = im.pixel_values[:n]
    u8 = np.rint(real * 255).astype(np.uint8)
    assert np.array_equal(u8.astype(np.float32) / np.float32(255), real)  # exactly k/255
    assert hashlib.sha256(u8.tobytes()).hexdigest() == ref["pixel_values_u8_sha256"]
    assert real[0, :8].tolist() == ref["patch0_first8"]
    assert real[-1, :8].tolist() == ref["last_real_patch_first8"]
    assert real[-1, -8:].tolist() == ref["last_real_patch_last8"]
    stats = ref["pixel_values_real_stats"]
    assert real.astype(np.float64).sum() == pytest.approx(stats["sum"], rel=1e-9)
    assert (real.astype(np.float64) ** 2).sum() == pytest.approx(stats["sum_sq"], rel=1e-9)
    assert real.min() == stats["min"] and real.max() == stats["max"]

    assert not im.pixel_values[n:].any()
    assert im.position_ids[:4].tolist() == ref["position_ids_first4"]
    assert im.position_ids[n - 4 : n].tolist() == ref["position_ids_last_real4"]
    assert len(im.position_ids) - n == ref["position_ids_num_padding"]
    assert (im.position_ids[n:] == ref["position_ids_padding_value"]).all()


def test_test_image_matches_exact_model_inputs():
    ref = load_file(str(IMAGES / "test_image_inputs.safetensors"))
    config = ImageProcessorConfig.from_model_dir(PACK / "models" / "e-style-target")
    assert config.max_soft_tokens == 140
    im = preprocess_image(IMAGES / "test_image.png", config)
    assert np.array_equal(im.pixel_values, ref["pixel_values_u8"][0].astype(np.float32) / np.float32(255))
    assert np.array_equal(im.position_ids, ref["image_position_ids"][0])
    assert im.num_soft_tokens == 130 and im.resized_size == (480, 624)


def test_budget_setting_and_rejection(tmp_path):
    model_dir = PACK / "models" / "moe-style-target"
    assert ImageProcessorConfig.from_model_dir(model_dir, max_soft_tokens=560).max_soft_tokens == 560
    with pytest.raises(ImageError, match="70, 140, 280, 560, 1120"):
        ImageProcessorConfig.from_model_dir(model_dir, max_soft_tokens=100)
    with pytest.raises(ImageError, match="got 0"):
        preprocess_image(IMAGES / "test_image.png", max_soft_tokens=0)
    # transformers-5 style: settings nested under processor_config.json's image_processor
    (tmp_path / "processor_config.json").write_text(json.dumps({"image_processor": {"max_soft_tokens": 70}}))
    assert ImageProcessorConfig.from_model_dir(tmp_path).max_soft_tokens == 70
    assert ImageProcessorConfig.from_model_dir(tmp_path / "missing").max_soft_tokens == 280


def test_target_size_rules():
    assert target_size(1000, 1000, 280) == (768, 768)  # a square image at the default budget: 256 soft tokens
    assert target_size(1, 1, 70) == (384, 384)
    # thin images: the short side gets one unit, the long side is capped at the budget's side
    assert target_size(100_000, 1, 140) == (140 * 48, 48)
    assert target_size(1, 100_000, 70) == (48, 70 * 48)
    for budget in (70, 140, 280, 560, 1120):
        for h, w in [(17, 2000), (3000, 2000), (5, 7), (4000, 30)]:
            th, tw = target_size(h, w, budget)
            assert th % 48 == 0 and tw % 48 == 0 and (th // 16) * (tw // 16) <= 9 * budget


def _pattern(w=40, h=30):
    x = np.arange(w)[None, :, None]
    y = np.arange(h)[:, None, None]
    c = np.arange(3)[None, None, :]
    return Image.fromarray(((x * 6 + y * 4 + c * 70) % 256).astype(np.uint8), "RGB")


@pytest.mark.parametrize(
    "fmt,kwargs,lossless",
    [
        ("PNG", {}, True),
        ("BMP", {}, True),
        ("TIFF", {}, True),
        ("WEBP", {"lossless": True}, True),
        ("JPEG", {"quality": 95}, False),
        ("GIF", {}, False),
    ],
)
def test_common_formats(tmp_path, fmt, kwargs, lossless):
    src = _pattern()
    path = tmp_path / f"img.{fmt.lower()}"
    src.save(path, fmt, **kwargs)
    im = preprocess_image(path, max_soft_tokens=70)
    ref = preprocess_image(src, max_soft_tokens=70)
    assert im.resized_size == ref.resized_size and im.num_soft_tokens == ref.num_soft_tokens
    diff = np.abs(im.pixel_values - ref.pixel_values).max()
    assert diff == 0 if lossless else diff < 0.5


def test_animated_gif_uses_first_frame(tmp_path):
    red, blue = Image.new("RGB", (20, 20), (255, 0, 0)), Image.new("RGB", (20, 20), (0, 0, 255))
    red.save(tmp_path / "anim.gif", save_all=True, append_images=[blue], duration=100)
    rgb = np.asarray(load_image(tmp_path / "anim.gif"))
    assert (rgb == [255, 0, 0]).all()


def test_exif_orientation_applied(tmp_path):
    src = _pattern(40, 20)
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 clockwise when displayed
    src.save(tmp_path / "rot.jpg", quality=95, exif=exif)
    im = preprocess_image(tmp_path / "rot.jpg", max_soft_tokens=70)
    assert im.original_size == (40, 20)  # (height, width): upright
    assert load_image(tmp_path / "rot.jpg").size == (20, 40)


def test_modes_become_rgb(tmp_path):
    rgba = Image.new("RGBA", (4, 4), (10, 20, 30, 0))  # fully transparent -> white
    assert (np.asarray(load_image(rgba)) == 255).all()
    half = Image.new("RGBA", (4, 4), (0, 0, 0, 128))
    assert np.asarray(load_image(half)).max() == 127  # black at 50% over white
    la = Image.new("LA", (4, 4), (0, 0))
    assert (np.asarray(load_image(la)) == 255).all()
    pal = Image.new("P", (4, 4), 1)
    pal.putpalette([0, 0, 0, 200, 10, 10] + [0] * 762)
    pal.info["transparency"] = 0
    assert (np.asarray(load_image(pal)) == [200, 10, 10]).all()
    gray = Image.new("L", (4, 4), 77)
    assert (np.asarray(load_image(gray)) == 77).all()
    deep = Image.fromarray(np.full((4, 4), 65535, dtype=np.uint16))  # 16-bit gray: white, not clipped garbage
    deep.save(tmp_path / "deep.png")
    assert (np.asarray(load_image(tmp_path / "deep.png")) == 255).all()
    assert load_image(Image.new("CMYK", (3, 3))).mode == "RGB"


def _png_header_only(width, height):
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 10)) + chunk(b"IEND", b"")


def test_errors_have_clear_messages(tmp_path):
    with pytest.raises(ImageError, match="not found"):
        preprocess_image(tmp_path / "nope.png")
    with pytest.raises(ImageError, match="folder"):
        preprocess_image(tmp_path)
    (tmp_path / "empty.png").write_bytes(b"")
    with pytest.raises(ImageError, match="empty"):
        preprocess_image(tmp_path / "empty.png")
    os.mkfifo(tmp_path / "pipe.png")  # a FIFO would block the read; /dev/zero would never end
    for special in (tmp_path / "pipe.png", Path("/dev/zero")):
        with pytest.raises(ImageError, match="is not a regular file"):
            preprocess_image(special)
    (tmp_path / "notes.txt").write_text("hello, not a picture")
    with pytest.raises(ImageError, match="not an image"):
        preprocess_image(tmp_path / "notes.txt")
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(buf, "PNG")
    (tmp_path / "cut.png").write_bytes(buf.getvalue()[: len(buf.getvalue()) // 2])
    with pytest.raises(ImageError, match="damaged or truncated"):
        preprocess_image(tmp_path / "cut.png")
    with pytest.raises(ImageError, match="no pixels"):
        preprocess_image(Image.new("RGB", (0, 5)))
    with pytest.raises(ImageError, match="too large"):
        preprocess_image(_pattern(), max_pixels=100)
    with pytest.raises(ImageError, match="too large to decode"):  # past twice Pillow's limit: its error
        preprocess_image(_png_header_only(50_000, 50_000))
    with pytest.raises(ImageError, match="too large to decode"):  # between 1x and 2x: Pillow only warns
        preprocess_image(_png_header_only(10_000, 10_000))
    with pytest.raises(ImageError, match="empty"):
        preprocess_image(b"")
    assert issubclass(ImageError, ValueError)


def test_sample_assets_preprocess():
    files = sorted(ASSETS.iterdir())
    assert len(files) >= 2 and sum(f.stat().st_size for f in files) < 100_000
    for f in files:
        im = preprocess_image(f, max_soft_tokens=70)
        assert 0 < im.num_soft_tokens <= 70
