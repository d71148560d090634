"""core.hub.demo: the trained demo pairing ships in the package, is checked against its sha256
manifest, loads with no build step, and behaves like a trained model: English replies that end
their turn, and a drafter the target agrees with."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest
from support import factory

from app.cli import main
from core.hub import demo

ROOT = Path(__file__).resolve().parents[2]


def _json_lines(out: str) -> list[dict]:
    return [json.loads(line) for line in out.strip().splitlines() if line.startswith("{")]


def _generate(capsys, prompt: str, *extra: str) -> tuple[list[dict], dict]:
    rc = main(["generate", "--demo", "--prompt", prompt, "--temp", "0", "--json", *extra])
    lines = _json_lines(capsys.readouterr().out)
    assert rc == 0, lines[-1:]
    return [x for x in lines if "id" in x], lines[-1]["stats"]


def test_shipped_pairing_loads_from_the_package_without_building(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("GEMMA_CHAT_CACHE_DIR", str(cache))
    monkeypatch.setattr(factory, "build_pairing", lambda *a, **k: pytest.fail("the demo must not be built"))
    target, drafter = demo.ensure_demo_pairing()
    assert target == demo.DEMO_DIR / "target" and drafter == demo.DEMO_DIR / "assistant"
    assert demo.DEMO_DIR.is_relative_to(ROOT / "core")  # inside the package
    assert not cache.exists()  # nothing written to the cache
    assert json.loads((target / "config.json").read_text())["model_type"] == "gemma4"
    d_cfg = json.loads((drafter / "config.json").read_text())
    assert d_cfg["model_type"] == "gemma4_assistant" and d_cfg["use_ordered_embeddings"] is True
    for d in (target, drafter, demo.DEMO_DIR):
        assert demo.is_demo_checkpoint(d)
    m = demo.manifest()
    assert m["trained"] is True and "target/model.safetensors" in m["sha256"]
    size = sum((demo.DEMO_DIR / f).stat().st_size for f in m["sha256"])
    assert size < 12e6  # "a few MB"
    label = demo.demo_label()
    assert label.startswith("DEMO — tiny model trained on") and " M params" in label


def test_a_corrupted_shipped_file_is_refused_with_a_clear_message(tmp_path):
    copy = tmp_path / "demo"
    shutil.copytree(demo.DEMO_DIR, copy)
    assert demo.verify(copy) == (copy / "target", copy / "assistant")

    weights = copy / "target" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte in the middle of the weights
    weights.write_bytes(bytes(data))
    with pytest.raises(demo.DemoIntegrityError, match=r"damaged: .*target/model\.safetensors.*sha256"):
        demo.verify(copy)

    shutil.copyfile(demo.DEMO_DIR / "target" / "model.safetensors", weights)
    (copy / "assistant" / "config.json").unlink()
    with pytest.raises(demo.DemoIntegrityError, match=r"incomplete: .*assistant/config\.json is missing"):
        demo.verify(copy)


def test_the_cli_says_so_when_the_shipped_demo_is_damaged(tmp_path, monkeypatch, capsys):
    copy = tmp_path / "demo"
    shutil.copytree(demo.DEMO_DIR, copy)
    (copy / "assistant" / "model.safetensors").write_bytes(b"not weights")
    monkeypatch.setattr(demo, "DEMO_DIR", copy)
    with pytest.raises(demo.DemoIntegrityError):
        demo.verify(copy)
    rc = main(["generate", "--demo", "--prompt", "hi", "--json"])
    out = capsys.readouterr().out
    assert rc != 0 and "damaged" in out


def _corpus_words() -> set[str]:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import demo_corpus
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    text = " ".join(q + " " + " ".join(a) for a, q in demo_corpus.PROJECT_TURNS)
    return {w.lower() for w in re.findall(r"[A-Za-z]+", text)}


def test_greedy_reply_to_a_greeting_is_english_and_ends_its_turn(capsys):
    tokens, stats = _generate(capsys, "Hello!", "--max-tokens", "96")
    text = "".join(t["text"] for t in tokens)
    assert stats["stop_reason"] == "eos"  # it ended its turn (with <turn|>) before 96 tokens
    words = re.findall(r"[A-Za-z]+", text)
    known = _corpus_words()
    assert len(words) >= 5, text
    real = [w for w in words if w.lower() in known]
    assert len(real) / len(words) >= 0.9, text  # real words, not sub-word salad


def test_drafts_are_accepted_and_greedy_output_is_unchanged(capsys):
    prompt = "What is speculative decoding?"
    # a fixed block size: auto's choices follow measured timings, this must be deterministic
    tokens, stats = _generate(capsys, prompt, "--max-tokens", "64", "--block-size", "3")
    plain, plain_stats = _generate(capsys, prompt, "--max-tokens", "64", "--no-draft")
    assert [t["id"] for t in tokens] == [t["id"] for t in plain]  # float32: token-identical
    from_drafts = sum(t["from_draft"] for t in tokens)
    assert from_drafts == stats["accepted"]
    # the random-weight demo's drafter got 0 % here, the first trained one 22 % (its cluster table was
    # the factory's random one); the shipped one drafts every round's two tokens: 42 of 64 (66 %)
    assert from_drafts / len(tokens) >= 0.5, stats
    assert stats["tokens_per_round"] > 2.5


def test_the_drafter_routes_its_drafts_among_the_right_candidates(monkeypatch, capsys):
    """The centroid head drafts among the tokens of its top clusters (`token_ordering`): with the
    cluster table it was trained with, that is the token its full vocabulary would pick. A table that
    does not match the trained centroids (the first shipped demo kept the factory's random one) routes
    most drafts among the wrong candidates: acceptance collapses while the weights look trained."""
    import mlx.core as mx

    from core.model.drafter import Drafter

    routed_greedy = Drafter.greedy_token
    same: list[bool] = []

    def spy(self, y):
        routed = routed_greedy(self, y)
        full = mx.argmax(self.embed_tokens.as_linear(y.reshape(-1)))
        same.append(int(routed.item()) == int(full.item()))
        return routed

    monkeypatch.setattr(Drafter, "greedy_token", spy)
    _generate(capsys, "What is gemma-chat?", "--max-tokens", "48", "--block-size", "4")
    assert len(same) >= 20
    assert sum(same) / len(same) >= 0.9, f"{sum(same)}/{len(same)} drafts routed to the full-vocabulary choice"
