"""What a prompt costs is checked before it is paid (issue 24, item 4): on the pack's e-style pairing with
a 300-token context, prompts that cannot fit are refused before a pixel buffer is made (images' soft tokens
come from their headers) or before the text is tokenised (its byte length alone says it cannot fit)."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest

from core.engine.contract import PairingSpec
from core.engine.local import Engine
from core.settings import GenerationSettings

PACK = Path("tests/data/pack/models")


@pytest.fixture(scope="module")
def small_engine(tmp_path_factory):
    root = tmp_path_factory.mktemp("ctx300")
    for name in ("e-style-target", "e-style-assistant"):
        shutil.copytree(PACK / name, root / name)
    config_path = root / "e-style-target" / "config.json"
    config = json.loads(config_path.read_text())
    config["text_config"]["max_position_embeddings"] = 300
    config_path.write_text(json.dumps(config))
    engine = Engine()
    engine.load(PairingSpec("ctx300", str(root / "e-style-target"), str(root / "e-style-assistant")), None).result(120)
    assert engine.info is not None and engine.info.has_vision
    yield engine
    engine.close()


def png(width: int, height: int) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (width, height), (10, 200, 10)).save(out, format="PNG")
    return out.getvalue()


def turn(engine: Engine, content) -> str | None:
    done = engine.chat([{"role": "user", "content": content}], GenerationSettings(max_tokens=2), None).result(60)
    return done.error


@pytest.fixture
def counted(monkeypatch):
    """How often each costly step ran: an image's pixel buffers, the text's tokenisation."""
    import core.decode.prompt as prompt
    import core.model.image as image

    calls = {"preprocess_image": 0, "encode_messages": 0}

    def count(module, name):
        real = getattr(module, name)

        def wrapper(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, wrapper)

    count(image, "preprocess_image")
    count(prompt, "encode_messages")
    return calls


def test_04_images_past_the_context_are_refused_before_their_buffers(small_engine, counted):
    # a one-pixel image is 121 soft tokens at the checkpoint's budget (140): three cannot fit 300
    items = [{"type": "image", "image": png(1, 1)} for _ in range(3)]
    error = turn(small_engine, [*items, {"type": "text", "text": "hi"}])
    assert error and "context is 300" in error
    assert counted["preprocess_image"] == 0


def test_04_more_images_than_the_cap_are_refused_before_any_is_read(small_engine, counted):
    items = [{"type": "image", "image": png(1, 1)} for _ in range(33)]
    error = turn(small_engine, [*items, {"type": "text", "text": "hi"}])
    assert error and "33 images" in error
    assert counted["preprocess_image"] == 0


def test_04_text_that_cannot_fit_by_its_bytes_is_refused_before_tokenizing(small_engine, counted):
    error = turn(small_engine, "word " * 40_000)  # 200 KB
    assert error and "bytes" in error and "context is 300" in error
    assert counted["encode_messages"] == 0


def test_04_a_prompt_that_fits_still_runs(small_engine, counted):
    assert turn(small_engine, [{"type": "image", "image": png(1, 1)}, {"type": "text", "text": "hi"}]) is None
    assert counted["preprocess_image"] == 1
