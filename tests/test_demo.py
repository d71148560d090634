"""core.demo: the offline demo pairing is built once, atomically, into the (overridable) cache."""

from __future__ import annotations

import json
import os

import pytest

from core import demo, factory


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("GEMMA_CHAT_CACHE_DIR", str(root))
    return root


def test_builds_once_then_reuses(cache):
    target, drafter = demo.ensure_demo_pairing()
    root = cache / "demo" / demo.demo_version()
    assert target.parent == drafter.parent == root
    for d in (root, target, drafter):
        marker = json.loads((d / demo.DEMO_MARKER).read_text())
        assert marker["label"] == demo.DEMO_LABEL and marker["random_weights"] is True
        assert demo.is_demo_checkpoint(d)
    assert json.loads((target / "config.json").read_text())["model_type"] == "gemma4"
    assert json.loads((drafter / "config.json").read_text())["model_type"] == "gemma4_assistant"
    assert (target / "chat_template.jinja").is_file()

    stamp = (target / "model.safetensors").stat().st_mtime_ns
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(factory, "build_pairing", lambda *a, **k: pytest.fail("rebuilt an existing demo"))
        assert demo.ensure_demo_pairing() == (target, drafter)
    assert (target / "model.safetensors").stat().st_mtime_ns == stamp
    assert sorted(p.name for p in (cache / "demo").iterdir()) == [root.name]


def test_demo_loads_in_mlx_lm(cache):
    import mlx.core as mx
    from mlx_lm.utils import load_model

    target, _ = demo.ensure_demo_pairing()
    model, config = load_model(target)
    logits = model(mx.array([[2, 21, 300, 301]]))
    assert logits.shape == (1, 4, config["vocab_size"])


def test_interrupted_build_leaves_nothing_broken(cache, monkeypatch):
    real_drafter = factory.build_drafter

    def killed(*args, **kwargs):
        raise KeyboardInterrupt  # the target is written, the drafter never is

    monkeypatch.setattr(factory, "build_drafter", killed)
    with pytest.raises(KeyboardInterrupt):
        demo.ensure_demo_pairing()
    assert list((cache / "demo").iterdir()) == []

    # a builder killed hard (no cleanup) leaves its temp dir; the next call sweeps it
    orphan = cache / "demo" / ".building-999999999-deadbeef"
    (orphan / "e-style-target").mkdir(parents=True)
    monkeypatch.setattr(factory, "build_drafter", real_drafter)
    target, drafter = demo.ensure_demo_pairing()
    assert not orphan.exists()
    assert (drafter / "model.safetensors").is_file()


def test_incomplete_or_stale_versions_are_rebuilt(cache, monkeypatch):
    target, drafter = demo.ensure_demo_pairing()
    (drafter / "model.safetensors").unlink()  # damaged by hand
    target2, drafter2 = demo.ensure_demo_pairing()
    assert (drafter2 / "model.safetensors").is_file()

    old = cache / "demo" / demo.demo_version()
    monkeypatch.setattr(factory, "FACTORY_VERSION", factory.FACTORY_VERSION + 1)
    new_target, _ = demo.ensure_demo_pairing()
    assert new_target.parent.name == demo.demo_version() != old.name
    assert not old.exists()  # the stale demo was removed


def test_cache_root_follows_env(tmp_path, monkeypatch):
    monkeypatch.setenv("GEMMA_CHAT_CACHE_DIR", str(tmp_path / "x"))
    assert demo.cache_root() == tmp_path / "x"
    monkeypatch.delenv("GEMMA_CHAT_CACHE_DIR")
    assert demo.cache_root().name in ("gemma-chat", "Cache") or "gemma-chat" in str(demo.cache_root())


def test_live_builder_is_left_alone(cache):
    mine = cache / "demo" / f".building-{os.getpid()}-cafe0000"
    mine.mkdir(parents=True)
    demo.ensure_demo_pairing()
    assert mine.exists()  # a running builder's directory is not swept
