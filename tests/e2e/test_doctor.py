"""`gemma-chat doctor`: a real run in a fresh process, and the terminal-image guess."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from importlib import metadata

import pytest

from app.commands.doctor import terminal_images


def test_doctor_reports_backend_versions_paths_and_terminal(tmp_path):
    env = {
        **os.environ,
        "HF_HOME": str(tmp_path / "hf"),
        "GEMMA_CHAT_CONFIG": str(tmp_path / "cfg" / "config.toml"),
        "GEMMA_CHAT_DATA_DIR": str(tmp_path / "data"),
        "GEMMA_CHAT_CACHE_DIR": str(tmp_path / "cache"),
        "TERM": "xterm-kitty",
        "KITTY_WINDOW_ID": "1",
    }
    env.pop("HF_HUB_CACHE", None)
    env.pop("COLUMNS", None)  # to a pipe: one line per entry (an app test in this process may have set it)
    out = subprocess.run([sys.executable, "-m", "app", "doctor"], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    for section in ("MLX", "packages", "Hugging Face", "gemma-chat paths", "memory", "pairings", "terminal"):
        assert f"\n{section}\n" in f"\n{text}"
    lines = {
        line.split()[0]: line.split(None, 1)[1]
        for line in text.splitlines()
        if line.startswith("  ") and len(line.split()) > 1
    }
    assert lines["mlx"] == metadata.version("mlx")
    assert lines["demo"].startswith("always available offline (gemma-chat --demo)")
    assert lines["kernels"] == "none: compilation is off (MLX_DISABLE_COMPILE)"  # the suite's uncompiled MLX
    assert lines["audio"] == "E2B, E4B, 12B (not 26B-A4B, 31B); files decoded by libsndfile " + _libsndfile()
    assert lines["soundfile"] == metadata.version("soundfile") and lines["soxr"] == metadata.version("soxr")
    assert lines["huggingface_hub"] == metadata.version("huggingface_hub")
    assert lines["textual"] == metadata.version("textual")
    if sys.platform.startswith("linux"):
        assert re.search(r"\n  backend +CPU\n", text) and "Device(cpu" in text
        # MLX's float32 products: numpy's OpenBLAS through gemma-chat's forwarder (core.blas)
        own = r"gemma-chat's kernel from \d+ wide \((AVX2|SSE2)\)"
        products = rf"OpenBLAS \S+ from numpy \(.*\d+ threads?\) and {own}, exact per row"
        assert re.search(rf"\n  float32 products +{products}\n", text)
    assert f"cache      {tmp_path / 'hf' / 'hub'}" in text
    assert str(tmp_path / "cfg" / "config.toml") in text and str(tmp_path / "data") in text
    assert "kitty graphics protocol" in text
    assert lines["ready"].startswith("none")
    assert not (tmp_path / "hf").exists(), "doctor must not create the cache"


def _libsndfile() -> str:
    import soundfile

    return soundfile.__libsndfile_version__


@pytest.mark.parametrize(
    "env, words",
    [
        ({"TERM": "xterm-256color", "TERM_PROGRAM": "iTerm.app"}, "iTerm2"),
        ({"TERM": "xterm-256color", "TERM_PROGRAM": "WezTerm"}, "kitty graphics protocol likely"),
        ({"TERM": "foot"}, "sixel"),
        ({"TERM": "xterm-256color", "TERM_PROGRAM": "Apple_Terminal"}, "half-blocks"),
        ({}, "not a terminal"),
    ],
)
def test_terminal_image_guess(env, words):
    assert words in terminal_images(env)


def test_doctor_fits_a_narrow_terminal(tmp_path):
    """At 80 columns a long value wraps under its own column (between words), not from the left margin."""
    env = {**os.environ, "COLUMNS": "80", "GEMMA_CHAT_CONFIG": str(tmp_path / "config.toml")}
    out = subprocess.run([sys.executable, "-m", "app", "doctor"], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert max(len(line) for line in lines if "/" not in line) <= 80  # a long path is left whole
    at = next(i for i, line in enumerate(lines) if line.strip().startswith("demo "))
    column = lines[at].index("always")
    assert lines[at + 1].startswith(" " * column) and lines[at + 1][column] != " "


def test_doctor_says_whether_the_demo_has_its_compiled_kernels_here(tmp_path):
    """A one-shot `generate` without them runs uncompiled: doctor says which pairings have them."""
    from pathlib import Path

    from core.engine.kernels import signature
    from core.engine.pairings import demo_spec
    from core.user import kernel_cache

    folder = tmp_path / "kernels"
    env = {**os.environ, "GEMMA_CHAT_KERNEL_DIR": str(folder), "HF_HOME": str(tmp_path / "hf")}
    env.pop("MLX_DISABLE_COMPILE", None)
    env.pop("HF_HUB_CACHE", None)
    env.pop("COLUMNS", None)  # to a pipe: one line per entry (an app test in this process may have set it)

    def said() -> str:
        out = subprocess.run(
            [sys.executable, "-m", "app", "doctor"], capture_output=True, text=True, env=env, timeout=60
        )
        assert out.returncode == 0, out.stderr
        return next(line.split(None, 1)[1] for line in out.stdout.splitlines() if line.startswith("  kernels "))

    assert said() == "not yet for demo (the app and serve build them; or generate --build-kernels)"
    spec = demo_spec()
    assert spec.drafter is not None
    cache = kernel_cache.KernelCache(folder)
    kernel_cache.write_marker(cache, signature(spec, Path(spec.target), Path(spec.drafter)))
    assert said() == "built for demo"
