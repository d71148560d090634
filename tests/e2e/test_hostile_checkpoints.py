"""Checkpoint folders that are not what they seem (issue 24, items 12 and 13): FIFOs where files should
be, a weight index that points outside the folder, configs no model can be built from, a chat template
the sandbox refuses. `gemma-chat generate` runs as a process with a timeout (a FIFO used to hang the
load forever) and a 3 GiB address-space cap (a billion layers used to take 7.9 GB); each case must end
with one sentence and exit status 1, never a traceback or a hang.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACK = REPO / "tests" / "data" / "pack" / "models"
IMAGE = REPO / "tests" / "data" / "pack" / "references" / "images" / "test_image.png"


def _cap_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))


def generate(target: Path, drafter: Path | None, *extra: str, timeout: float = 90) -> tuple[int, list[dict], str]:
    cmd = [sys.executable, "-m", "app.cli", "generate", "--model", str(target), "--prompt", "hi", "--max-tokens", "2"]
    if drafter is not None:
        cmd += ["--drafter", str(drafter)]
    try:
        r = subprocess.run(
            [*cmd, "--json", *extra],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=timeout,
            preexec_fn=_cap_memory,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"generate hung (no answer in {timeout:g} s)")
    lines = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    return r.returncode, lines, r.stderr


def refused(target: Path, drafter: Path | None, words: str, *extra: str) -> str:
    rc, lines, err = generate(target, drafter, *extra)
    assert "Traceback" not in err, err[-3000:]
    assert rc == 1 and lines and "error" in lines[-1], (rc, lines, err[-2000:])
    assert words in lines[-1]["error"], lines[-1]["error"]
    return lines[-1]["error"]


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path]:
    for name in ("e-style-target", "e-style-assistant"):
        shutil.copytree(PACK / name, tmp_path / name)
    return tmp_path / "e-style-target", tmp_path / "e-style-assistant"


def fifo_instead_of(path: Path) -> None:
    path.unlink(missing_ok=True)
    os.mkfifo(path)


# --- 12. FIFOs, a traversal ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["generation_config.json", "model.safetensors", "tokenizer_config.json"])
def test_12_fifo_in_the_target_is_refused_at_load(pair, name):
    target, drafter = pair
    fifo_instead_of(target / name)
    assert name in refused(target, drafter, "not a regular file")


def test_12_fifo_in_the_drafter_is_refused_at_load(pair):
    target, drafter = pair
    fifo_instead_of(drafter / "model.safetensors")
    refused(target, drafter, "not a regular file")


def test_12_fifo_processor_settings_do_not_hang_the_first_image(pair):
    target, drafter = pair
    fifo_instead_of(target / "preprocessor_config.json")
    refused(target, drafter, "not a regular file", "--image", str(IMAGE))


def test_12_weight_index_is_not_followed_out_of_the_folder(pair):
    target, drafter = pair
    outside = target.parent / "outside.safetensors"
    os.mkfifo(outside)  # reading it would block: following the index out of the folder is a hang
    index = {"metadata": {}, "weight_map": {"model.vision_tower.patch_embedder.weight": "../outside.safetensors"}}
    (target / "model.safetensors.index.json").write_text(json.dumps(index))
    rc, lines, err = generate(target, drafter)
    assert "Traceback" not in err
    # the language model loads (it never reads the index); the vision tower is refused with the reason
    assert rc == 0 and "outside the checkpoint folder" in err, (rc, lines, err[-2000:])


# --- 13. configs no model can be built from -----------------------------------------------------------
def _edit_text_config(target: Path, change) -> None:
    path = target / "config.json"
    config = json.loads(path.read_text())
    change(config)
    path.write_text(json.dumps(config))


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("num_attention_heads", 0, "num_attention_heads"),
        ("hidden_size", 0, "hidden_size"),
        ("num_hidden_layers", 10**9, "num_hidden_layers"),
        ("layer_types", ["sliding_attention"], "layer_types"),
    ],
)
def test_13_absurd_text_config_is_one_sentence(pair, field, value, words):
    target, drafter = pair
    _edit_text_config(target, lambda c: c["text_config"].__setitem__(field, value))
    refused(target, drafter, words)


def test_13_text_config_null_is_one_sentence(pair):
    target, drafter = pair
    _edit_text_config(target, lambda c: c.__setitem__("text_config", None))
    refused(target, drafter, "text_config")


def test_13_config_nested_100k_deep_is_one_sentence(pair):
    target, drafter = pair
    text = (target / "config.json").read_text().rstrip()
    (target / "config.json").write_text(text[:-1] + ', "deep": ' + "[" * 100_000 + "]" * 100_000 + "}")
    refused(target, drafter, "deeply")


def test_13_absurd_drafter_config_is_one_sentence(pair):
    target, drafter = pair
    _edit_text_config(drafter, lambda c: c["text_config"].__setitem__("num_attention_heads", 0))
    refused(target, drafter, "num_attention_heads")


def test_13_sandboxed_chat_template_is_refused_without_a_traceback(pair):
    target, drafter = pair
    hostile = "{{ ''.__class__.__mro__[1].__subclasses__() }}"
    cfg_path = target / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = hostile
    cfg_path.write_text(json.dumps(cfg))
    (target / "chat_template.jinja").write_text(hostile)
    refused(target, drafter, "chat template")
