"""config.toml that is not a settings file (issue 24, item 14; the temperature floor of item 10).

The app reads its config before it draws: a FIFO there used to hang it with Ctrl+Q dead, /dev/zero to read
until MemoryError. Those run `gemma-chat --demo` as a process with a timeout and a 1 GiB address-space
cap; each must exit 2 with one sentence before any screen. The rest runs in-process.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import stat
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from app.cli import main

REPO = Path(__file__).resolve().parents[2]


def _cap_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))


def app_with_config(config: Path, tmp_path: Path, timeout: float = 30) -> tuple[int, str]:
    env = {**os.environ, "GEMMA_CHAT_CONFIG": str(config), "GEMMA_CHAT_DATA_DIR": str(tmp_path / "data")}
    try:
        r = subprocess.run(
            [sys.executable, "-m", "app.cli", "--demo"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            preexec_fn=_cap_memory,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"gemma-chat hung on this config.toml (nothing in {timeout:g} s)")
    return r.returncode, r.stderr


def refused(config: Path, tmp_path: Path, words: str) -> None:
    rc, err = app_with_config(config, tmp_path)
    assert "Traceback" not in err, err[-3000:]
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 2 and len(lines) == 1 and words in lines[0], (rc, err[-2000:])


def test_14_fifo_config_is_one_sentence_not_a_hang(tmp_path):
    os.mkfifo(tmp_path / "config.toml")
    refused(tmp_path / "config.toml", tmp_path, "not a regular file")


def test_14_config_linked_to_dev_zero_is_one_sentence(tmp_path):
    (tmp_path / "config.toml").symlink_to("/dev/zero")
    refused(tmp_path / "config.toml", tmp_path, "not a regular file")


def test_14_config_nested_5000_deep_is_one_sentence(tmp_path):
    (tmp_path / "config.toml").write_text("x = " + "{a = " * 5000 + "1" + "}" * 5000 + "\n")
    refused(tmp_path / "config.toml", tmp_path, "too deeply")


def test_14_a_200_mb_system_prompt_is_refused_by_size(tmp_path):
    with open(tmp_path / "config.toml", "w") as f:  # 4 MB stands for 200: the limit is far below both
        f.write('system_prompt = "' + "x" * (4 << 20) + '"\n')
    refused(tmp_path / "config.toml", tmp_path, "larger than")


@pytest.mark.parametrize("seed", ["-1", str(2**64)])
def test_14_generate_refuses_a_config_seed_the_command_line_refuses(tmp_path, monkeypatch, capsys, seed):
    config = tmp_path / "config.toml"
    config.write_text(f"[sampling]\nseed = {seed}\n")
    monkeypatch.setenv("GEMMA_CHAT_CONFIG", str(config))
    out = io.StringIO()
    with redirect_stdout(out):
        rc = main(["generate", "--demo", "--prompt", "hi", "--max-tokens", "2", "--json"])
    assert rc == 1 and "[sampling].seed must be an integer from 0 to 2**64-1" in json.loads(out.getvalue())["error"]


def test_14_read_only_config_is_left_alone_and_says_why(tmp_path, capsys):
    from app.commands.tui import remember_pairing
    from core.user.config import load_config

    config = tmp_path / "config.toml"
    text = '# mine, hands off\ntheme = "textual-light"\n'
    config.write_text(text)
    config.chmod(0o444)
    remember_pairing(argparse.Namespace(demo=True, pairing=None), load_config(config))
    assert config.read_text() == text and stat.S_IMODE(config.stat().st_mode) == 0o444
    err = capsys.readouterr().err
    assert "not remembered" in err and "read-only" in err


# --- 10. the temperature floor: one rule for the config, the command line and the engine ---------------------
def test_10_a_tiny_config_temperature_is_greedy(tmp_path):
    from core.user.config import load_config

    config = tmp_path / "config.toml"
    config.write_text("[sampling]\ntemperature = 1e-39\n")
    assert load_config(config).generation_settings().temperature == 0.0


def test_10_generate_with_a_tiny_temperature_is_greedy_not_empty(capsys):
    def tokens(temp: str) -> list[int]:
        out = io.StringIO()
        with redirect_stdout(out):
            rc = main(["generate", "--demo", "--prompt", "Hello", "--max-tokens", "6", "--temp", temp, "--json"])
        assert rc == 0
        return [line["id"] for line in map(json.loads, out.getvalue().splitlines()) if "id" in line]

    greedy = tokens("0")
    assert greedy and tokens("1e-39") == greedy and tokens("1e-300") == greedy
