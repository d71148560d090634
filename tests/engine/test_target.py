"""Our target forward against mlx-lm's model call and the pack's HF references (float32)."""

import json

import mlx.core as mx
import numpy as np
import pytest
from safetensors.numpy import load_file

from core.decode.prompt import stop_ids
from core.model.loader import CheckpointError, load_tokenizer, resolve_checkpoint
from core.model.target import FULL, SLIDING, load_target

PACK = "tests/data/pack/models"
REFS = "tests/data/pack/references/text"
FAMILIES = ["e-style", "moe-style", "dense-style", "unified-style"]


@pytest.fixture(scope="module", params=FAMILIES)
def family(request):
    fam = request.param
    return (
        fam,
        load_target(f"{PACK}/{fam}-target"),
        json.load(open(f"{REFS}/{fam}.json")),
        load_file(f"{REFS}/{fam}.safetensors"),
    )


def test_forward_equals_mlx_lm_model(family):
    _, tg, _, refs = family
    ids = refs["long.prompt_ids"].tolist()[:60]
    ours, hidden = tg.forward(ids, tg.make_cache(), logits="all")
    theirs = tg.model(mx.array([ids]))[0]
    assert hidden.shape == (60, tg.hidden_size)
    # not bit-equal on the CPU backend: our GeGLU is written with exp, not tanh (core.model.layers)
    assert float(mx.abs(ours - theirs).max()) <= (1e-6 if mx.default_device() == mx.gpu else 2e-5)
    assert mx.argmax(ours, axis=-1).tolist() == mx.argmax(theirs, axis=-1).tolist()


@pytest.mark.parametrize("prompt", ["short", "long", "multiturn"])
def test_last_logits_and_greedy_match_reference(family, prompt):
    _, tg, ref, refs = family
    ids = refs[f"{prompt}.prompt_ids"].tolist()
    cache = tg.make_cache(slack=7)
    for s in range(0, len(ids), 32):  # chunked prefill, chunks cross the window
        logits, _ = tg.forward(ids[s : s + 32], cache)
    assert np.abs(np.array(logits[0]) - refs[f"{prompt}.last_logits"]).max() <= 1e-4
    tok, out = int(mx.argmax(logits[0]).item()), []
    for _ in range(40):
        out.append(tok)
        logits, _ = tg.forward([tok], cache)
        tok = int(mx.argmax(logits[0]).item())
    assert out == ref["prompts"][prompt]["greedy_no_eos_stop"]["ids"]


def test_model_facts(family):
    fam, tg, ref, _ = family
    assert tg.vocab_size == 2048 and tg.window == 12
    assert set(tg.producers) == {SLIDING, FULL}
    expected = {"e-style": (1, 2), "moe-style": (3, 4), "dense-style": (3, 4), "unified-style": (3, 4)}[fam]
    assert (tg.producers[SLIDING], tg.producers[FULL]) == expected
    tok = load_tokenizer(tg.path)
    assert stop_ids(tg.path, tok) == set(ref["eos_token_ids"]) == {1, 22, 12}


def test_embedding_inputs_are_not_rescaled_and_match_token_path():
    tg = load_target(f"{PACK}/e-style-target")
    ids = [2, 21, 40, 41, 42, 43, 22]
    plain, _ = tg.forward(ids, tg.make_cache(), logits="all")
    # feeding the scaled embeddings of the same tokens as "soft tokens" changes only PLE (pad id)
    emb = tg.embed(mx.array(ids))
    mask = mx.array([False, False, True, True, False, False, False])
    via, _ = tg.forward(ids, tg.make_cache(), embeddings=emb, embedding_mask=mask, logits="all")
    assert float(mx.abs(via[:2] - plain[:2]).max()) == 0.0
    assert float(mx.abs(via[2:] - plain[2:]).max()) > 1e-3  # PLE saw pad id at the masked rows
    # a non-PLE model: identical when the embeddings equal the scaled token embeddings
    tm = load_target(f"{PACK}/moe-style-target")
    plain, _ = tm.forward(ids, tm.make_cache(), logits="all")
    via, _ = tm.forward(ids, tm.make_cache(), embeddings=tm.embed(mx.array(ids)), embedding_mask=mask, logits="all")
    assert float(mx.abs(via - plain).max()) <= 1e-6


def test_bidirectional_spans_only_touch_sliding_layers_of_vision_models():
    tm = load_target(f"{PACK}/moe-style-target")
    ids = list(range(30, 50))
    causal, _ = tm.forward(ids, tm.make_cache(), logits="all")
    bidir, _ = tm.forward(ids, tm.make_cache(), bidirectional=[(5, 9)], logits="all")
    assert float(mx.abs(causal[:5] - bidir[:5]).max()) == 0.0
    assert float(mx.abs(causal[5:9] - bidir[5:9]).max()) > 1e-3
    te = load_target(f"{PACK}/e-style-target")  # use_bidirectional_attention null: ignored
    a, _ = te.forward(ids, te.make_cache(), logits="all")
    b, _ = te.forward(ids, te.make_cache(), bidirectional=[(5, 9)], logits="all")
    assert float(mx.abs(a - b).max()) == 0.0


def test_bfloat16_cast():
    tg = load_target(f"{PACK}/dense-style-target", dtype="bfloat16")
    assert tg.dtype == mx.bfloat16
    logits, hidden = tg.forward([2, 21, 40], tg.make_cache())
    assert hidden.dtype == mx.bfloat16 and logits.shape == (1, 2048)


def test_checkpoint_errors(tmp_path):
    with pytest.raises(CheckpointError, match="not a target"):
        load_target(f"{PACK}/e-style-assistant")
    with pytest.raises(CheckpointError, match="no config.json"):
        load_target(tmp_path)
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        resolve_checkpoint(str(tmp_path / "missing"))


def test_mlx_community_weight_layout(tmp_path):
    """`language_model.model.*` names (mlx-community conversions) load to the same model."""
    import shutil

    src = f"{PACK}/moe-style-target"
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(f"{src}/{name}", tmp_path / name)
    weights = mx.load(f"{src}/model.safetensors")
    renamed = {}
    for k, v in weights.items():
        k = k.removeprefix("model.")
        renamed[k.replace("language_model.", "language_model.model.", 1) if k.startswith("language_model.") else k] = v
    assert any(k.startswith("language_model.model.layers.") for k in renamed)
    mx.save_safetensors(str(tmp_path / "model.safetensors"), renamed)
    ids = [2, 21, 40, 41, 42]
    a, _ = load_target(tmp_path).forward(ids, load_target(tmp_path).make_cache())
    tg = load_target(src)
    b, _ = tg.forward(ids, tg.make_cache())
    assert float(mx.abs(a - b).max()) == 0.0


@pytest.mark.parametrize("variant", FAMILIES)
def test_factory_layouts_and_dtypes_load_alike(factory_checkpoints, variant):
    """HF and mlx-community layouts of one factory checkpoint are the same model; bf16/q4 load and run."""
    ids = list(range(2, 40))
    hf = load_target(factory_checkpoints.target(variant, layout="hf"))
    mlx = load_target(factory_checkpoints.target(variant, layout="mlx"))
    a, _ = hf.forward(ids, hf.make_cache(), logits="all")
    b, _ = mlx.forward(ids, mlx.make_cache(), logits="all")
    assert float(mx.abs(a - b).max()) == 0.0
    for layout, dtype in (("hf", "bfloat16"), ("mlx", "q4")):
        # moe-style bf16 on the CPU backend runs only because the loader upcasts the expert weights
        # (mlx's CPU GatherMM is float32-only; mlx-lm's own load fails on the first token there).
        tg = load_target(factory_checkpoints.target(variant, layout=layout, dtype=dtype))
        logits, hidden = tg.forward(ids, tg.make_cache())
        assert logits.shape == (1, tg.vocab_size) and bool(mx.isfinite(logits).all())
        if dtype == "bfloat16":  # only the expert weights were upcast
            from mlx.utils import tree_flatten

            f32 = {k for k, v in tree_flatten(tg.model.parameters()) if v.dtype == mx.float32}
            assert all(".switch_glu." in k for k in f32) and (bool(f32) == (variant == "moe-style")), sorted(f32)[:3]
        # and our loop still equals mlx-lm's own model call on them
        theirs = tg.model(mx.array([ids]))[0, -1]
        assert float(mx.abs(logits[0].astype(mx.float32) - theirs.astype(mx.float32)).max()) <= 1e-2


def test_repo_ids_resolve_only_from_the_local_cache(tmp_path):
    snap = tmp_path / "models--someone--tiny" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text("{}")
    (tmp_path / "models--someone--tiny" / "refs").mkdir()
    (tmp_path / "models--someone--tiny" / "refs" / "main").write_text("abc123")
    assert resolve_checkpoint("someone/tiny", cache_dir=tmp_path) == snap
    with pytest.raises(CheckpointError, match="not downloaded"):
        resolve_checkpoint("someone/absent", cache_dir=tmp_path)
