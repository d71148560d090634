"""Gemma 4 12B, the encoder-free `gemma4_unified` model and its `gemma4_unified_assistant` drafter:
what differs from the other families. The shared reference checks (text logits, greedy, drafter
blocks, speculative identity) run on the pack's unified-style family in test_target, test_drafter
and test_spec; the image path is in the second half of this file."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlx.core as mx
import pytest

from core import modeltypes, pairing
from core.drafter import check_pair, load_drafter
from core.loader import CheckpointError
from core.target import load_target

PACK = Path(__file__).parent / "data" / "pack"
MODELS = PACK / "models"
UT, UA = MODELS / "unified-style-target", MODELS / "unified-style-assistant"


def _cfg(path: Path) -> dict:
    return json.loads((path / "config.json").read_text())


def _copy_with_config(src: Path, dst: Path, edit) -> Path:
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.name != "config.json":
            shutil.copy(f, dst / f.name)
    cfg = _cfg(src)
    edit(cfg)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


# -- pairing ------------------------------------------------------------------------------------


def test_unified_pair_is_valid_and_every_cross_pair_is_refused_with_a_reason():
    assert pairing.check_pair(_cfg(UT), _cfg(UA)) == []
    for fam in ("e-style", "moe-style", "dense-style"):
        t, a = _cfg(MODELS / f"{fam}-target"), _cfg(MODELS / f"{fam}-assistant")
        for target, drafter in ((_cfg(UT), a), (t, _cfg(UA))):
            problems = pairing.check_pair(target, drafter)
            assert len(problems) == 1, problems
            assert "made for" in problems[0] and "use the target's own assistant" in problems[0]
    # moe-style and unified-style have equal K/V shapes: only the architecture tells them apart
    moe = _cfg(MODELS / "moe-style-target")
    (problem,) = pairing.check_pair(moe, _cfg(UA))
    assert problem.startswith("the drafter is a gemma4_unified_assistant checkpoint, made for Gemma 4 12B")
    assert problem.endswith("use the target's own assistant, gemma4_assistant")
    # swapped roles are named for the unified types too
    assert pairing.check_pair(_cfg(UA), _cfg(UT))[0].startswith("the target is an assistant drafter")
    assert "not an assistant drafter" in pairing.check_pair(_cfg(UT), _cfg(UT))[0]


def test_cross_pair_with_identical_shapes_is_refused_when_loaded(tmp_path):
    """A gemma4 drafter whose shapes fit the unified target exactly is still refused by the engine."""
    tg = load_target(UT)
    check_pair(tg, load_drafter(UA))
    fake = _copy_with_config(UA, tmp_path / "a", lambda c: c.update(model_type="gemma4_assistant"))
    with pytest.raises(CheckpointError, match="made for Gemma 4 \\(E2B/E4B/26B-A4B/31B\\) targets"):
        check_pair(tg, load_drafter(fake))


def test_modeltypes_table():
    assert modeltypes.architecture("gemma4_unified_text") == modeltypes.UNIFIED
    assert modeltypes.drafter_type_for("gemma4_unified") == "gemma4_unified_assistant"
    assert modeltypes.drafter_type_for("gemma4_text") == "gemma4_assistant"
    assert modeltypes.cross_pair_problem("gemma4", "gemma4_assistant") is None
    assert modeltypes.cross_pair_problem("llama", "gemma4_unified_assistant") is None  # reported elsewhere


# -- loader -------------------------------------------------------------------------------------


def test_target_facts():
    tg = load_target(UT)
    assert tg.architecture == modeltypes.UNIFIED and tg.vision_all_layers and tg.bidirectional_vision
    assert tg.first_shared == tg.n_layers == 5  # no KV sharing
    assert not tg.inner.hidden_size_per_layer_input  # no per-layer embeddings
    layers = tg.inner.layers
    assert not any(getattr(layer, "enable_moe", False) for layer in layers)
    full = layers[tg.producers["full_attention"]].self_attn
    sliding = layers[tg.producers["sliding_attention"]].self_attn
    assert (full.n_kv_heads, full.head_dim, full.use_k_eq_v, hasattr(full, "v_proj")) == (1, 48, True, False)
    assert (sliding.n_kv_heads, sliding.head_dim, hasattr(sliding, "v_proj")) == (2, 24, True)
    # layer_scalar is loaded (random in [0.5, 1] in the pack), not left at 1
    assert all(0.5 <= float(layer.layer_scalar.item()) < 1.0 for layer in layers)


def test_a_contrary_layout_is_refused_and_absent_keys_get_the_unified_values(tmp_path):
    def ple(c):
        c["text_config"]["hidden_size_per_layer_input"] = 8

    bad = _copy_with_config(UT, tmp_path / "ple", ple)
    with pytest.raises(CheckpointError, match="hidden_size_per_layer_input=8"):
        load_target(bad)

    def strip(c):  # keys a real config may leave out; mlx-lm's defaults for them are E2B's
        for k in ("hidden_size_per_layer_input", "num_kv_shared_layers", "enable_moe_block", "use_double_wide_mlp"):
            del c["text_config"][k]
        del c["vocab_size"]

    bare = load_target(_copy_with_config(UT, tmp_path / "bare", strip))
    ref = load_target(UT)
    ids = [2, 21, 40, 41, 42, 43, 44]
    a, _ = bare.forward(ids, bare.make_cache(), logits="all")
    b, _ = ref.forward(ids, ref.make_cache(), logits="all")
    assert bare.vocab_size == 2048 and float(mx.abs(a - b).max()) == 0.0


def test_mlx_community_layout_loads_the_same_model(tmp_path):
    """mlx-vlm's conversions keep the hub names without the leading `model.`
    (`language_model.model.*`, `vision_embedder.*`, `embed_vision.*`)."""
    out = tmp_path / "mlx"
    out.mkdir()
    for f in UT.iterdir():
        if f.name != "model.safetensors":
            shutil.copy(f, out / f.name)
    renamed = {}
    for k, v in mx.load(str(UT / "model.safetensors")).items():
        k = k.removeprefix("model.")
        renamed[k.replace("language_model.", "language_model.model.", 1) if k.startswith("language_model.") else k] = v
    assert "vision_embedder.pos_embedding" in renamed
    mx.save_safetensors(str(out / "model.safetensors"), renamed)
    ids = list(range(2, 30))
    a_tg, b_tg = load_target(out), load_target(UT)
    a, _ = a_tg.forward(ids, a_tg.make_cache(), logits="all")
    b, _ = b_tg.forward(ids, b_tg.make_cache(), logits="all")
    assert float(mx.abs(a - b).max()) == 0.0


def test_text_only_unified_config_loads(tmp_path):
    """A flat `gemma4_unified_text` config (no text_config) builds the same text model."""

    def flatten(c):
        text = c.pop("text_config")
        for k in list(c):
            del c[k]
        c.update(text)

    flat = _copy_with_config(UT, tmp_path / "flat", flatten)
    text = {
        "model." + k.removeprefix("model.language_model."): v
        for k, v in mx.load(str(UT / "model.safetensors")).items()
        if k.startswith("model.language_model.")
    }
    mx.save_safetensors(str(flat / "model.safetensors"), text)
    tg = load_target(flat)
    ref = load_target(UT)
    ids = list(range(2, 20))
    a, _ = tg.forward(ids, tg.make_cache(), logits="all")
    b, _ = ref.forward(ids, ref.make_cache(), logits="all")
    assert tg.architecture == modeltypes.UNIFIED and float(mx.abs(a - b).max()) == 0.0


def test_bad_drafter_type_message_names_both_assistants():
    with pytest.raises(CheckpointError, match="gemma4_assistant, gemma4_unified_assistant"):
        load_drafter(UT)
    dr = load_drafter(UA)
    assert not dr.ordered and dr.softcap is None  # tied dense head, no soft-cap
    assert dr.cfg.backbone_hidden_size == 88
