"""`gemma-chat models list|download|rm` end to end against a temporary HF cache and the fake hub."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fakehub import FakeHub, FakeRepo, put_in_cache

from app.cli import main
from core.hub import catalog

PACK = Path(__file__).parents[1] / "data" / "pack" / "models"
FILES = {"config.json": b'{"model_type": "gemma4"}', "model.safetensors": b"w" * 5000}


@pytest.fixture
def hf_cache(tmp_path, monkeypatch):
    """An empty HF cache for this test, for both in-process calls and child processes."""
    from huggingface_hub import constants

    cache = tmp_path / "hf" / "hub"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    return cache


def _pairing_repos(name: str) -> dict[str, FakeRepo]:
    p = catalog.get_pairing(name)
    return {
        p.target_repo: FakeRepo(
            {
                "config.json": (PACK / "e-style-target" / "config.json").read_bytes(),
                "model.safetensors": os.urandom(300_000),
                "tokenizer.json": (PACK / "e-style-target" / "tokenizer.json").read_bytes(),
                "README.md": b"card",
            }
        ),
        p.drafter_repo: FakeRepo(
            {
                "config.json": (PACK / "e-style-assistant" / "config.json").read_bytes(),
                "model.safetensors": os.urandom(50_000),
            }
        ),
    }


def test_list_json_in_a_fresh_process_shows_local_status(hf_cache):
    p = catalog.get_pairing("e4b-4bit")
    put_in_cache(hf_cache, p.target_repo, FILES)
    put_in_cache(hf_cache, p.drafter_repo, FILES)
    out = subprocess.run(
        [sys.executable, "-m", "app", "models", "list", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env=os.environ,
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["cache_dir"] == str(hf_cache)
    rows = {r["name"]: r for r in data["pairings"]}
    assert set(rows) == set(catalog.load_catalog().names())
    assert rows["e4b-4bit"]["status"] == "ready" and rows["e4b-4bit"]["target_path"]
    assert rows["e4b"]["status"] == "partial"  # shares the drafter, target missing
    assert rows["31b"]["status"] == "missing"
    for r in rows.values():
        assert r["vision"] is True and r["memory_bytes"] > r["download_bytes"] > 0
        assert r["audio"] is (r["family"] in ("e2b", "e4b", "12b"))
        assert r["fit"] in ("ok", "tight", "wont_fit", "unknown")


def test_list_table(hf_cache, capsys, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)  # as to a pipe: one whole line per pairing
    assert main(["models", "list"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[:5] == ["NAME", "STATUS", "DOWNLOAD", "MEMORY", "FIT"]
    assert "mlx-community/gemma-4-31b-it-bf16" in out and "K/V cache at 8192 tokens" in out
    # the demo is listed first, and the words are the models screen's
    assert out.splitlines()[1].split()[:2] == ["demo", "ready"] and "gemma-chat --demo" in out
    rows = {line.split()[0]: line for line in out.splitlines()[1:] if line.strip()}
    assert "not downloaded" in rows["31b"] and "missing" not in rows["31b"]
    assert "wont fit" not in out and "not independently confirmed" in out


def test_models_screen_and_cli_share_their_words():
    from app.tui.screens.models import _FIT_TEXT, status_text
    from core.hub.catalog import STATUS_WORDS
    from core.hub.fit import FIT_WORDS

    assert _FIT_TEXT is FIT_WORDS and FIT_WORDS["wont_fit"] == "won't fit"
    assert status_text("missing").plain == STATUS_WORDS["missing"] == "not downloaded"


def test_download_offline_refuses_without_touching_the_network(hf_cache, capsys, monkeypatch):
    with FakeHub(repos=_pairing_repos("e2b-4bit")) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        assert main(["models", "download", "e2b-4bit", "--offline"]) == 1
        assert hub.requests == []
    err = capsys.readouterr().err
    assert "offline mode" in err and "mlx-community/gemma-4-e2b-it-4bit" in err


def test_download_then_offline_then_rm(hf_cache, capsys, monkeypatch):
    p = catalog.get_pairing("e2b-4bit")
    with FakeHub(repos=_pairing_repos("e2b-4bit")) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        assert main(["models", "download", "e2b-4bit"]) == 0
        cap = capsys.readouterr()
        assert "e2b-4bit downloaded." in cap.err and "to download" in cap.err
        assert "[########################] 100.0%" in cap.err  # the progress bar reached the end
        paths = dict(line.split("\t") for line in cap.out.splitlines())
        assert set(paths) == set(p.repos) and all(Path(v).is_dir() for v in paths.values())
        n = len(hub.requests)
        assert main(["models", "download", "e2b-4bit", "--offline"]) == 0
        assert len(hub.requests) == n
    assert "already downloaded" in capsys.readouterr().err
    resolved = catalog.resolve_pairing("e2b-4bit")
    assert (resolved.target_path / "tokenizer.json").is_file() and not (resolved.target_path / "README.md").exists()

    assert main(["models", "rm", "e2b-4bit"]) == 1  # not a terminal, no --yes
    assert "pass --yes" in capsys.readouterr().err
    assert main(["models", "rm", "e2b-4bit", "--yes"]) == 0
    assert "removed e2b-4bit" in capsys.readouterr().err
    assert not any(hf_cache.glob("models--*"))


def test_rm_keeps_a_drafter_another_pairing_still_uses(hf_cache, capsys):
    a, b = catalog.get_pairing("e2b-4bit"), catalog.get_pairing("e2b-8bit")
    for repo in (a.target_repo, b.target_repo, a.drafter_repo):
        put_in_cache(hf_cache, repo, FILES)
    assert main(["models", "rm", "e2b-4bit", "--yes"]) == 0
    assert f"keeping {a.drafter_repo}: also used by e2b-8bit" in capsys.readouterr().err
    assert catalog.resolve_pairing("e2b-8bit").drafter_path.is_dir()
    with pytest.raises(catalog.PairingNotLocal):
        catalog.resolve_pairing("e2b-4bit")


def test_unknown_pairing_name(hf_cache, capsys):
    assert main(["models", "download", "e4"]) == 2
    assert "did you mean e4b" in capsys.readouterr().err


def test_list_shows_custom_local_checkpoints(hf_cache, capsys):
    put_in_cache(
        hf_cache, "me/my-drafter", {"config.json": b'{"model_type": "gemma4_assistant"}', "model.safetensors": b"w"}
    )
    assert main(["models", "list"]) == 0
    assert "me/my-drafter  drafter  complete" in capsys.readouterr().out
    assert main(["models", "list", "--json"]) == 0
    other = json.loads(capsys.readouterr().out)["other_local"]
    assert other[0]["repo_id"] == "me/my-drafter" and other[0]["model_type"] == "gemma4_assistant"


def test_download_a_single_repository_by_id(hf_cache, capsys, monkeypatch):
    repo = FakeRepo(
        {"config.json": (PACK / "moe-style-assistant" / "config.json").read_bytes(), "model.safetensors": b"d" * 4000}
    )
    with FakeHub(repos={"me/custom-drafter": repo}) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        assert main(["models", "download", "me/custom-drafter"]) == 0
        assert main(["models", "download", "me/absent"]) == 1
    cap = capsys.readouterr()
    assert "me/custom-drafter downloaded." in cap.err
    assert "me/absent was not found on http://127.0.0.1" in cap.err
    path = Path(cap.out.split("\t")[1].strip())
    assert (path / "model.safetensors").read_bytes() == b"d" * 4000


def test_list_fits_the_terminals_width(hf_cache, capsys, monkeypatch):
    """Narrower than the table ($COLUMNS or the terminal), each target's repository goes on its own line
    under its row and the notes wrap between words; to a pipe (no $COLUMNS) a row is one line, whole."""
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["models", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert lines[0].split() == ["NAME", "STATUS", "DOWNLOAD", "MEMORY", "FIT", "VISION", "AUDIO", "BLOCK"]
    assert lines[1].strip() == "TARGET"
    at = {line.split()[0]: i for i, line in enumerate(lines) if line and not line.startswith(" ")}
    assert lines[at["31b"]].split()[-1] == "6" and lines[at["31b"] + 1].strip() == "mlx-community/gemma-4-31b-it-bf16"
    notes = lines[lines.index("") + 1 :]
    assert any(line.startswith("? repository name") for line in notes)
    assert all(not line.endswith("-") for line in notes)  # not cut inside a word
    monkeypatch.delenv("COLUMNS")
    assert main(["models", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    row = next(line for line in lines if line.startswith("31b "))
    assert row.split()[-1] == "mlx-community/gemma-4-31b-it-bf16" and max(len(line) for line in lines) > 100
