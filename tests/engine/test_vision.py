"""Vision tower + embed_vision against the HF references of the three pack families; loading layouts."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten
from safetensors.numpy import load_file

from core.model.encoders import load_vision
from core.model.image import ImageProcessorConfig, preprocess_image
from core.model.vision import VisionEncoder, pooling_order

PACK = Path(__file__).parents[1] / "data" / "pack"
MODELS = PACK / "models"
IMAGES = PACK / "references" / "images"
FAMILIES = ("e-style", "moe-style", "dense-style")
TOL = 1e-4  # the pack's vision tolerance (values reach 27-41)


@pytest.fixture(scope="module")
def test_inputs():
    ref = load_file(str(IMAGES / "test_image_inputs.safetensors"))
    return ref["pixel_values_u8"].astype(np.float32) / np.float32(255), ref["image_position_ids"]


@pytest.fixture(scope="module")
def small_image():
    """The test image at budget 70: fewer patches, so the layout/padding checks stay fast."""
    return preprocess_image(IMAGES / "test_image.png", max_soft_tokens=70)


@pytest.fixture(scope="module")
def encoders():
    return {fam: load_vision(MODELS / f"{fam}-target", dtype=mx.float32) for fam in FAMILIES}


def _max_diff(a, b) -> float:
    return float(np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)).max())


@pytest.mark.parametrize("family", FAMILIES)
def test_matches_hf_reference(family, encoders, test_inputs):
    ref = load_file(str(IMAGES / f"{family}.safetensors"))
    enc = encoders[family]
    pixel_values, position_ids = test_inputs  # [1, 1260, 768] with 90 padding rows, as HF got them
    tower = enc.tower(pixel_values, position_ids)
    soft = enc.encode(pixel_values, position_ids)
    assert tower.shape == (130, 32) and tower.dtype == mx.float32
    assert soft.shape == ref["soft_tokens"].shape
    assert enc.soft_token_count(position_ids) == 130
    assert _max_diff(tower, ref["vision_tower_output"]) < TOL
    assert _max_diff(soft, ref["soft_tokens"]) < TOL

    # the same from our own preprocessing of the PNG, with the checkpoint's budget
    im = preprocess_image(IMAGES / "test_image.png", ImageProcessorConfig.from_model_dir(MODELS / f"{family}-target"))
    assert _max_diff(enc.encode_image(im), ref["soft_tokens"]) < TOL


def test_config_flags_are_read(encoders):
    e, moe = encoders["e-style"], encoders["moe-style"]
    assert e.config.use_clipped_linears and not e.config.standardize
    assert moe.config.standardize and not moe.config.use_clipped_linears
    assert float(e.vision_tower.encoder.layers[0].self_attn.q_proj.input_max) < 10  # real bounds loaded
    assert not hasattr(moe.vision_tower.encoder.layers[0].self_attn.q_proj, "input_max")
    assert e.config.text_hidden_size == 96 and moe.config.text_hidden_size == 80


def test_padding_and_patch_order_do_not_matter(encoders, small_image):
    enc = encoders["e-style"]
    im = small_image
    n = im.num_patches
    base = np.array(enc.encode_image(im))
    assert base.shape[0] == im.num_soft_tokens == 63

    padded = im.pixel_values.copy()
    padded[n:] = np.random.default_rng(0).random(padded[n:].shape, dtype=np.float32)  # garbage in padding
    assert np.array_equal(np.array(enc.encode(padded, im.position_ids)), base)
    assert np.array_equal(np.array(enc.encode(mx.array(padded)[None], im.position_ids[None])), base)

    perm = np.random.default_rng(1).permutation(n)  # pooling is by position, attention has no order
    shuffled = enc.encode(im.pixel_values[:n][perm], im.position_ids[:n][perm])
    assert _max_diff(shuffled, base) < 1e-5


def test_attention_in_query_blocks_is_exact(encoders, small_image, monkeypatch):
    import core.model.vision

    enc = encoders["dense-style"]
    base = np.array(enc.encode_image(small_image))
    monkeypatch.setattr(core.model.vision, "_SCORE_BUDGET", 2 * 256 * small_image.num_patches)  # 3 blocks
    assert np.array_equal(np.array(enc.encode_image(small_image)), base)


def test_positions_beyond_the_table_are_rejected(encoders):
    enc = encoders["e-style"]  # the pack's table has 1024 positions (real checkpoints: 10240)
    pos = np.array([(x, y) for y in range(3) for x in range(1023, 1026)])
    with pytest.raises(ValueError, match="smaller image token budget"):
        enc.encode(np.zeros((9, 768), np.float32), pos)


def test_pooling_order_is_row_major_by_cell():
    # a 6 x 3 patch grid (2 cells wide, 1 high): cell 0 holds x 0..2, cell 1 holds x 3..5
    pos = np.array([(x, y) for y in range(3) for x in range(6)])
    order = pooling_order(pos, 3)
    assert order.shape == (2, 9)
    assert sorted(pos[order[0], 0]) == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert set(pos[order[1], 0]) == {3, 4, 5}
    with pytest.raises(ValueError, match="pooling"):
        pooling_order(pos[:-1], 3)


def test_no_vision_tower_gives_none(tmp_path):
    assert load_vision(MODELS / "e-style-assistant") is None  # a drafter: no vision_config
    # a text-only conversion (mlx-lm drops vision weights) that keeps vision_config in config.json
    shutil.copy(MODELS / "e-style-target" / "config.json", tmp_path / "config.json")
    mx.save_safetensors(str(tmp_path / "model.safetensors"), {"language_model.model.norm.weight": mx.ones((96,))})
    assert load_vision(tmp_path) is None


def test_sharded_hf_layout_reads_only_vision_shards(tmp_path, encoders, small_image):
    src = MODELS / "e-style-target"
    weights = mx.load(str(src / "model.safetensors"))
    vision = {k: v for k, v in weights.items() if k.startswith(("model.vision_tower.", "model.embed_vision."))}
    keys = sorted(vision)
    shards = {
        "model-00001-of-00003.safetensors": keys[: len(keys) // 2],
        "model-00002-of-00003.safetensors": keys[len(keys) // 2 :],
    }
    weight_map = {}
    for name, names in shards.items():
        mx.save_safetensors(str(tmp_path / name), {k: vision[k] for k in names})
        weight_map.update({k: name for k in names})
    (tmp_path / "model-00003-of-00003.safetensors").write_bytes(b"not read: text weights only")
    weight_map["model.language_model.norm.weight"] = "model-00003-of-00003.safetensors"
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    shutil.copy(src / "config.json", tmp_path / "config.json")

    enc = load_vision(tmp_path)
    assert np.array_equal(
        np.array(enc.encode_image(small_image)), np.array(encoders["e-style"].encode_image(small_image))
    )


def test_quantized_mlx_community_layout(tmp_path, small_image):
    src = MODELS / "e-style-target"
    config = json.loads((src / "config.json").read_text())
    reference = load_vision(src)

    # Quantize in memory as a converter would, with mixed settings; 48-wide inputs stay float.
    def predicate(path, module):
        if not isinstance(module, nn.Linear) or module.weight.shape[1] % 32:
            return False
        return {"group_size": 64, "bits": 8} if module.weight.shape[1] == 768 else {"group_size": 32, "bits": 4}

    quantized = load_vision(src)
    nn.quantize(quantized, class_predicate=predicate)
    flat = dict(tree_flatten(quantized.parameters()))
    assert "vision_tower.encoder.layers.0.self_attn.q_proj.linear.scales" in flat
    assert "vision_tower.encoder.layers.0.mlp.down_proj.linear.scales" not in flat
    flat["language_model.model.embed_tokens.weight"] = mx.zeros((4, 4))  # other parts are ignored
    mx.save_safetensors(str(tmp_path / "model.safetensors"), flat)
    config["quantization"] = {"group_size": 32, "bits": 4}
    (tmp_path / "config.json").write_text(json.dumps(config))

    loaded = load_vision(tmp_path)
    attn = loaded.vision_tower.encoder.layers[0].self_attn
    assert isinstance(attn.q_proj.linear, nn.QuantizedLinear) and attn.q_proj.linear.bits == 4
    assert isinstance(loaded.vision_tower.patch_embedder.input_proj, nn.QuantizedLinear)
    assert loaded.vision_tower.patch_embedder.input_proj.bits == 8
    assert isinstance(loaded.vision_tower.encoder.layers[0].mlp.down_proj.linear, nn.Linear)
    out = np.array(loaded.encode_image(small_image))
    assert np.array_equal(out, np.array(quantized.encode_image(small_image)))
    ref = np.array(reference.encode_image(small_image))
    assert np.corrcoef(out.ravel(), ref.ravel())[0, 1] > 0.8  # close to float (0.93 here), not equal


def test_bfloat16_load(small_image, encoders):
    enc = load_vision(MODELS / "moe-style-target", dtype=mx.bfloat16)
    assert enc.vision_tower.patch_embedder.position_embedding_table.dtype == mx.bfloat16
    soft = enc.encode_image(small_image)
    assert soft.dtype == mx.bfloat16
    ref = np.array(encoders["moe-style"].encode_image(small_image))
    assert _max_diff(soft.astype(mx.float32), ref) < 0.1 * np.abs(ref).max()


def test_from_weights_requires_vision_config():
    with pytest.raises(ValueError, match="vision_config is missing 'patch_size'"):
        cfg = json.loads((MODELS / "e-style-target" / "config.json").read_text())
        del cfg["vision_config"]["patch_size"]
        VisionEncoder.from_weights(cfg, mx.load(str(MODELS / "e-style-target" / "model.safetensors")))
