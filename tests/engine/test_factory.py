"""support.factory: tiny random-weight Gemma 4 checkpoints in the real on-disk formats.

Checked against mlx-lm's own loader (every variant x layout x dtype loads and runs), against the
reference pack (same config keys, same tensor names, same dimension roles), and for determinism.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from support import factory

VARIANTS = ("e-style", "moe-style", "dense-style", "unified-style")
BUILDS = [
    (v, layout, dtype)
    for v in VARIANTS
    for layout, dtype in (("hf", "float32"), ("hf", "bfloat16"), ("mlx", "float32"), ("mlx", "bfloat16"), ("mlx", "q4"))
]
PROMPT = [2, 21, 300, 301, 302, 303, 304, 305, 306, 307] * 3  # 30 tokens: past the window of 16


def _config(d: Path) -> dict:
    return json.loads((d / "config.json").read_text())


def _forward(model, ids) -> mx.array:
    logits = model(mx.array([ids]))
    mx.eval(logits)
    return logits


def _experts_to_float32(model) -> None:
    # MLX's CPU backend runs gather_mm (the unquantized MoE experts) in float32 only.
    for layer in model.layers:
        if getattr(layer, "enable_moe", False):
            glu = layer.experts.switch_glu
            for proj in (glu.gate_proj, glu.up_proj, glu.down_proj):
                proj.weight = proj.weight.astype(mx.float32)


@pytest.mark.parametrize("variant,layout,dtype", BUILDS)
def test_mlx_lm_loads_and_runs_every_build(factory_checkpoints, variant, layout, dtype):
    from mlx_lm.utils import load_model

    d = factory_checkpoints.target(variant, layout, dtype)
    model, config = load_model(d)
    text = config["text_config"]
    if dtype == "bfloat16" and text["enable_moe_block"]:
        _experts_to_float32(model)
    logits = _forward(model, PROMPT)
    assert logits.shape == (1, len(PROMPT), text["vocab_size"])
    assert bool(mx.isfinite(logits.astype(mx.float32)).all())
    # random weights, but not degenerate: the logits spread and differ between positions
    assert float(logits[0, -1].astype(mx.float32).std()) > 0.1
    assert not bool(mx.array_equal(logits[0, -1], logits[0, -2]))
    layer0 = model.layers[0]
    if dtype == "q4":
        assert isinstance(layer0.self_attn.q_proj, nn.QuantizedLinear)
        assert layer0.self_attn.q_proj.bits == 4
        assert isinstance(model.language_model.model.embed_tokens, nn.QuantizedEmbedding)
        if text["enable_moe_block"]:
            assert layer0.router.proj.bits == 8
            assert layer0.experts.switch_glu.gate_proj.bits == 4
        if text["hidden_size_per_layer_input"]:
            assert isinstance(model.language_model.model.embed_tokens_per_layer, nn.QuantizedEmbedding)
    else:
        assert isinstance(layer0.self_attn.q_proj, nn.Linear)
        want = mx.float32 if dtype == "float32" else mx.bfloat16
        assert layer0.self_attn.q_proj.weight.dtype == want


@pytest.mark.parametrize("variant", VARIANTS)
def test_layouts_and_dtypes_hold_the_same_model(factory_checkpoints, variant):
    """hf and mlx layouts of one seed give identical float32 logits; the bf16 and 4-bit files hold
    the same numbers, rounded / quantized."""
    from mlx_lm.utils import load_model

    ref = _forward(load_model(factory_checkpoints.target(variant, "hf", "float32"))[0], PROMPT)
    mlx_f32 = _forward(load_model(factory_checkpoints.target(variant, "mlx", "float32"))[0], PROMPT)
    assert bool(mx.array_equal(ref, mlx_f32))

    f32 = mx.load(str(factory_checkpoints.target(variant, "mlx", "float32") / "model.safetensors"))
    bf16 = mx.load(str(factory_checkpoints.target(variant, "mlx", "bfloat16") / "model.safetensors"))
    q4 = mx.load(str(factory_checkpoints.target(variant, "mlx", "q4") / "model.safetensors"))
    quant = _config(factory_checkpoints.target(variant, "mlx", "q4"))["quantization"]
    assert set(bf16) == set(f32)
    n_quantized = 0
    for name, value in f32.items():
        assert bool(mx.array_equal(bf16[name], value.astype(mx.bfloat16))), name
        stem = name.removesuffix(".weight")
        if f"{stem}.scales" not in q4:
            assert bool(mx.array_equal(q4[name], bf16[name])), name
            continue
        n_quantized += 1
        bits = quant.get(stem, {}).get("bits", quant["bits"])
        back = mx.dequantize(q4[name], q4[f"{stem}.scales"], q4[f"{stem}.biases"], group_size=64, bits=bits)
        err = float(mx.abs(back.astype(mx.float32) - value).max() / mx.abs(value).max())
        # at most one 4-bit step of a group spanning the whole range (mlx rounds one group edge
        # exactly, so the error can pass half a step): 2 * max / 15
        assert err < (2 / 15 if bits == 4 else 0.02), name
    assert n_quantized >= 7 * len(_config(factory_checkpoints.target(variant))["text_config"]["layer_types"]) // 2


def test_mlx_lm_generates_with_tokenizer(factory_checkpoints):
    import mlx_lm

    d = factory_checkpoints.target("e-style", "mlx", "q4")
    model, tokenizer = mlx_lm.load(str(d))
    cfg = _config(d)
    assert set(cfg["eos_token_id"]) <= set(tokenizer.eos_token_ids)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hello"}], add_generation_prompt=True, enable_thinking=False
    )
    out = [r.token for r in mlx_lm.stream_generate(model, tokenizer, prompt, max_tokens=6)]
    assert 1 <= len(out) <= 6
    assert all(0 <= t < cfg["vocab_size"] for t in out)


@pytest.mark.parametrize("variant,layout", [("e-style", "hf"), ("moe-style", "mlx"), ("dense-style", "hf")])
def test_tokenizer_ids_and_chat_template(factory_checkpoints, variant, layout):
    from mlx_lm.utils import load_tokenizer

    d = factory_checkpoints.target(variant, layout)
    cfg = _config(d)
    assert (d / "chat_template.jinja").exists() == (layout == "hf")
    tok = load_tokenizer(d)._tokenizer
    conv = tok.convert_tokens_to_ids
    assert cfg["image_token_id"] == conv("<|image|>")
    assert cfg["boi_token_id"] == conv("<|image>") and cfg["eoi_token_id"] == conv("<image|>")
    assert cfg["eos_token_id"] == [conv("<eos>"), conv("<turn|>"), conv("<|tool_response>")]
    assert cfg["text_config"]["pad_token_id"] == conv("<pad>") and cfg["bos_token_id"] == conv("<bos>")
    assert len(tok) == cfg["vocab_size"]

    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": " What is this? "}]},
        {"role": "assistant", "content": "A cat."},
        {"role": "user", "content": "Sure?"},
    ]
    thinking = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, enable_thinking=True)
    assert thinking == (
        "<bos><|turn>system\n<|think|>Be brief.<turn|>\n"
        "<|turn>user\n<|image|>What is this?<turn|>\n"
        "<|turn>model\nA cat.<turn|>\n"
        "<|turn>user\nSure?<turn|>\n<|turn>model\n"
    )
    plain = tok.apply_chat_template(messages[1:2], add_generation_prompt=True, tokenize=False, enable_thinking=False)
    channel = "<|channel>thought\n<channel|>" if variant != "e-style" else ""
    assert plain == "<bos><|turn>user\n<|image|>What is this?<turn|>\n<|turn>model\n" + channel
    ids = tok.encode(plain, add_special_tokens=False)
    assert ids[0] == cfg["bos_token_id"] and ids.count(cfg["image_token_id"]) == 1


# -- the reference pack's scheme ---------------------------------------------------------------


def _dims(config: dict) -> dict[str, int]:
    """Named dimensions of a target or drafter config, to compare what each tensor axis means."""
    t = config["text_config"]
    hd, ghd = t["head_dim"], t["global_head_dim"]
    kv, gkv = t["num_key_value_heads"], t["num_global_key_value_heads"] or t["num_key_value_heads"]
    out = {
        "one": 1,
        "hidden": t["hidden_size"],
        "inter": t["intermediate_size"],
        "inter2": 2 * t["intermediate_size"],
        "q_s": t["num_attention_heads"] * hd,
        "q_f": t["num_attention_heads"] * ghd,
        "kv_s": kv * hd,
        "kv_f": (gkv if t["attention_k_eq_v"] else kv) * ghd,
        "hd": hd,
        "ghd": ghd,
        "vocab": t["vocab_size"],
    }
    if t["hidden_size_per_layer_input"]:
        out.update(
            ple=t["hidden_size_per_layer_input"],
            ple_all=t["num_hidden_layers"] * t["hidden_size_per_layer_input"],
            ple_vocab=t["vocab_size_per_layer_input"],
        )
    if t["enable_moe_block"]:
        out.update(experts=t["num_experts"], moe=t["moe_intermediate_size"], moe2=2 * t["moe_intermediate_size"])
    if "vision_config" in config and "mm_embed_dim" in config["vision_config"]:  # the 12B's embedders
        v = config["vision_config"]
        out.update(
            mm=v["mm_embed_dim"],
            raw=3 * v["model_patch_size"] ** 2,
            posemb=v["mm_posemb_size"],
            two=2,
            audio=config["audio_config"]["output_proj_dims"],
        )
    elif "vision_config" in config:
        v = config["vision_config"]
        out.update(
            v_hidden=v["hidden_size"],
            v_inter=v["intermediate_size"],
            v_hd=v["head_dim"],
            v_q=v["num_attention_heads"] * v["head_dim"],
            v_kv=v["num_key_value_heads"] * v["head_dim"],
            v_patch=3 * v["patch_size"] ** 2,
            v_pos=v["position_embedding_size"],
            two=2,
        )
    if "backbone_hidden_size" in config:
        out.update(backbone=config["backbone_hidden_size"], backbone2=2 * config["backbone_hidden_size"])
        if config["use_ordered_embeddings"]:
            out.update(centroids=config["num_centroids"])
    return out


def _roles(shape, dims: dict) -> list[set]:
    return [{k for k, v in dims.items() if v == n} for n in shape]


def _compare_scheme(pack: Path, ours: Path, ignore_keys=("dtype",)):
    pc, oc = _config(pack), _config(ours)
    assert set(pc) - {"quantization", "quantization_config"} == set(oc) - {"quantization", "quantization_config"}
    for sub in ("text_config", "vision_config"):
        if sub in pc:
            assert set(pc[sub]) == set(oc[sub]), sub
            for key, value in pc[sub].items():  # same types (null stays null, bool stays bool)
                assert type(value) is type(oc[sub][key]) or {type(value), type(oc[sub][key])} <= {int, float}, key
    pw, ow = mx.load(str(pack / "model.safetensors")), mx.load(str(ours / "model.safetensors"))
    assert set(pw) == set(ow)
    pdims, odims = _dims(pc), _dims(oc)
    for name in pw:
        assert pw[name].ndim == ow[name].ndim, name
        assert pw[name].dtype == ow[name].dtype or (pw[name].dtype == mx.float32 and ow[name].dtype == mx.float32), name
        for axis, (p_roles, o_roles) in enumerate(zip(_roles(pw[name].shape, pdims), _roles(ow[name].shape, odims))):
            assert p_roles & o_roles, (
                f"{name} axis {axis}: pack {pw[name].shape} {p_roles} vs ours {ow[name].shape} {o_roles}"
            )


@pytest.mark.parametrize("variant", VARIANTS)
def test_scheme_matches_reference_pack(factory_checkpoints, pack_dir, variant):
    target, drafter = factory_checkpoints.pairing(variant)
    _compare_scheme(pack_dir / f"{variant}-target", target)
    _compare_scheme(pack_dir / f"{variant}-assistant", drafter)
    pc, oc = _config(pack_dir / f"{variant}-target"), _config(target)
    for key in (
        "layer_types",
        "attention_k_eq_v",
        "use_bidirectional_attention",
        "use_double_wide_mlp",
        "enable_moe_block",
        "final_logit_softcapping",
    ):
        assert pc["text_config"][key] == oc["text_config"][key], key
    assert pc["model_type"] == oc["model_type"] and pc["architectures"] == oc["architectures"]
    vision_keys = (
        ("model_patch_size", "mm_posemb_size") if variant == "unified-style" else ("use_clipped_linears", "standardize")
    )
    for key in vision_keys:
        assert pc["vision_config"][key] == oc["vision_config"][key], key
    assert sorted(p.name for p in (pack_dir / f"{variant}-target").glob("*processor*.json")) == sorted(
        p.name for p in target.glob("*processor*.json")
    )
    pd, od = _config(pack_dir / f"{variant}-assistant"), _config(drafter)
    assert pd["use_ordered_embeddings"] == od["use_ordered_embeddings"] and pd["model_type"] == od["model_type"]
    assert od["text_config"]["final_logit_softcapping"] is None


@pytest.mark.parametrize("variant", VARIANTS)
def test_mlx_layout_maps_one_to_one(factory_checkpoints, variant):
    hf = mx.load(str(factory_checkpoints.target(variant, "hf") / "model.safetensors"))
    ml = mx.load(str(factory_checkpoints.target(variant, "mlx") / "model.safetensors"))
    mapped = {}
    for name, value in hf.items():
        names = factory.hf_to_mlx_names(name)
        parts = mx.split(value, len(names), axis=-2) if len(names) > 1 else [value]
        mapped.update(zip(names, parts))
    assert set(mapped) == set(ml)
    media = (
        ("vision_embedder.", "embed_vision.", "embed_audio.")
        if variant == "unified-style"
        else ("vision_tower.", "embed_vision.")
    )
    assert all(name.startswith(("language_model.model.", *media)) for name in ml)
    for name in ml:
        assert bool(mx.array_equal(mapped[name], ml[name])), name


@pytest.mark.parametrize("variant", VARIANTS)
def test_drafter_fits_its_target(factory_checkpoints, variant):
    target, drafter = factory_checkpoints.pairing(variant)
    tc, dc = _config(target), _config(drafter)
    tt, dt = tc["text_config"], dc["text_config"]
    assert dc["backbone_hidden_size"] == tt["hidden_size"]
    for key in (
        "vocab_size",
        "head_dim",
        "global_head_dim",
        "num_key_value_heads",
        "num_global_key_value_heads",
        "attention_k_eq_v",
        "sliding_window",
        "rope_parameters",
    ):
        assert dt[key] == tt[key], key
    assert dt["layer_types"] == ["sliding_attention"] * 3 + ["full_attention"]
    w = mx.load(str(drafter / "model.safetensors"))
    assert w["pre_projection.weight"].shape == (dt["hidden_size"], 2 * tt["hidden_size"])
    assert w["post_projection.weight"].shape == (tt["hidden_size"], dt["hidden_size"])
    assert not any(k.startswith("lm_head") for k in w)
    if dc["use_ordered_embeddings"]:
        order = np.array(w["masked_embedding.token_ordering"])
        assert order.dtype == np.int64
        assert sorted(order.tolist()) == list(range(dt["vocab_size"]))
        assert dt["vocab_size"] % dc["num_centroids"] == 0
        assert w["masked_embedding.centroids.weight"].shape == (dc["num_centroids"], dt["hidden_size"])
    else:
        assert not any(k.startswith("masked_embedding") for k in w)


# -- determinism and edges ---------------------------------------------------------------------


def _files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def test_same_seed_same_bytes(tmp_path, factory_checkpoints):
    a_t, a_d = factory.build_pairing(tmp_path / "a", "moe-style", "mlx", "q4", seed=3)
    b_t, b_d = factory.build_pairing(tmp_path / "b", "moe-style", "mlx", "q4", seed=3)
    assert _files(a_t) == _files(b_t) and _files(a_d) == _files(b_d)
    c = factory.build_checkpoint(tmp_path / "c", "moe-style", "mlx", "q4", seed=4)
    assert (c / "model.safetensors").read_bytes() != (a_t / "model.safetensors").read_bytes()
    again = factory.build_checkpoint(tmp_path / "d", "e-style", "hf", "float32", seed=0)
    assert _files(again) == _files(factory_checkpoints.target("e-style", "hf", "float32"))


def test_safetensors_are_standard(factory_checkpoints):
    from safetensors.numpy import load_file

    d = factory_checkpoints.target("e-style", "hf", "float32")
    arrays = load_file(str(d / "model.safetensors"))
    ours = mx.load(str(d / "model.safetensors"))
    assert set(arrays) == set(ours)
    name = "model.language_model.layers.0.self_attn.q_proj.weight"
    assert np.array_equal(arrays[name], np.array(ours[name]))
    clip = arrays["model.vision_tower.encoder.layers.0.mlp.up_proj.input_min"]
    assert clip.shape == () and -4.0 <= float(clip) <= -2.0


def test_sharded_checkpoint_loads_like_a_single_file(tmp_path, factory_checkpoints):
    from mlx_lm.utils import load_model

    d = factory.build_checkpoint(tmp_path / "sharded", "e-style", "mlx", "q4", max_shard_bytes=400_000)
    shards = sorted(p.name for p in d.glob("model-*.safetensors"))
    assert len(shards) >= 3 and not (d / "model.safetensors").exists()
    index = json.loads((d / "model.safetensors.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == shards
    held = {}
    for name in shards:
        held.update(mx.load(str(d / name)))
    assert set(index["weight_map"]) == set(held)
    assert index["metadata"]["total_size"] == sum(v.nbytes for v in held.values())
    single = mx.load(str(factory_checkpoints.target("e-style", "mlx", "q4") / "model.safetensors"))
    assert set(single) == set(held) and all(bool(mx.array_equal(single[k], held[k])) for k in held)
    logits = _forward(load_model(d)[0], PROMPT)
    assert bool(mx.isfinite(logits.astype(mx.float32)).all())


def test_larger_vocab_gets_filler_tokens(tmp_path):
    from mlx_lm.utils import load_tokenizer

    d = factory.build_checkpoint(tmp_path / "t", "dense-style", config_overrides={"vocab_size": 2304})
    cfg = _config(d)
    assert cfg["vocab_size"] == cfg["text_config"]["vocab_size"] == 2304
    tok = load_tokenizer(d)
    assert tok.decode([2100]) == "<unused2100>"
    detok = tok.detokenizer
    detok.reset()
    for t in (300, 2303, 301):
        detok.add_token(t)
    detok.finalize()
    assert "<unused2303>" in detok.text
    assert mx.load(str(d / "model.safetensors"))["model.language_model.embed_tokens.weight"].shape == (2304, 256)


def test_overrides_and_refusals(tmp_path):
    spec = factory.resolve_spec(
        "e-style", config_overrides={"num_hidden_layers": 4, "num_kv_shared_layers": 2, "drafter": {"hidden_size": 128}}
    )
    assert spec["text"]["layer_types"] == ["full_attention", "sliding_attention", "sliding_attention", "full_attention"]
    assert spec["drafter"]["hidden_size"] == 128
    assert factory.VARIANTS["e-style"]["text"]["num_hidden_layers"] == 6  # not mutated
    assert factory.resolve_spec(full_config="E2B")["text"]["hidden_size"] == 1536
    with pytest.raises(ValueError, match="mlx"):
        factory.build_checkpoint(tmp_path / "x", layout="hf", dtype="q4")
    with pytest.raises(ValueError, match="variant"):
        factory.build_checkpoint(tmp_path / "y", variant="nope")
    with pytest.raises(ValueError, match="below"):
        factory.build_checkpoint(tmp_path / "z", config_overrides={"vocab_size": 1000})


def test_real_shape_configs_match_reference_facts():
    """The E2B/E4B specs behind the slow smoke test (reference/real-configs.md)."""
    from support.factory.specs import text_config

    e2b = text_config(factory.resolve_spec(full_config="E2B"))
    assert [i for i, t in enumerate(e2b["layer_types"]) if t == "full_attention"] == list(range(4, 35, 5))
    assert (e2b["hidden_size"], e2b["num_hidden_layers"], e2b["num_kv_shared_layers"], e2b["vocab_size"]) == (
        1536,
        35,
        20,
        262144,
    )
    e4b = text_config(factory.resolve_spec(full_config="E4B"))
    assert [i for i, t in enumerate(e4b["layer_types"]) if t == "full_attention"] == list(range(5, 42, 6))
    assert (e4b["hidden_size"], e4b["num_key_value_heads"], e4b["num_kv_shared_layers"]) == (2560, 2, 18)
    params = factory.target_params(factory.target_config(factory.resolve_spec(full_config="E2B"), "bfloat16"))
    text_params = sum(int(np.prod(p.shape)) for p in params if p.name.startswith("model.language_model."))
    assert 4.4e9 < text_params < 4.8e9  # ~5.1 B with the vision and audio towers, counted apart


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("GEMMA_CHAT_SLOW") != "1", reason="opt-in: set GEMMA_CHAT_SLOW=1")
@pytest.mark.parametrize("dtype", ["q4", "bfloat16"])
def test_real_shape_e2b_smoke(tmp_path, dtype):
    """A real-shape E2B (262144 vocab, 35 layers, PLE) with its drafter: built, loaded strictly by
    mlx-lm, generating. Needs ~3 GB (q4) / ~10 GB (bf16) of disk and RAM and minutes on a CPU."""
    from support.factory.smoke import smoke_one

    report = smoke_one(tmp_path, "E2B", dtype, max_tokens=2, prompt_tokens=2)
    print(json.dumps(report))
    assert report["vocab_size"] == 262144
    assert report["generated_tokens"] == 2
    assert report["generation_tps"] > 0
    assert report.get("pair_problems", []) == []
    assert 70 < report["drafter_params_m"] < 85  # the real E2B assistant has ~77.7 M parameters
    assert report["mtp_tokens"] == report["plain_tokens"] == 4, report  # the engine ran, drafter on and off
    # a 0.5 s clip through the real-size tower: 13 soft tokens between boa and eoa, then the text
    assert report.get("audio_error") is None and report["audio_tokens"] == 2, report
    assert report["audio_prompt_tokens"] > 15


def test_real_shape_e2b_audio_tower_matches_the_released_tensors():
    """752 audio tensors, as google/gemma-4-E2B-it holds them (reference/tools-and-audio.md B3.1)."""
    config = factory.target_config(factory.resolve_spec(full_config="E2B"), "bfloat16")
    assert config["audio_config"]["hidden_size"] == 1024 and config["audio_config"]["output_proj_dims"] == 1536
    shapes = {p.name: p.shape for p in factory.target_params(config) if "audio" in p.name.split(".")[1]}
    assert len(shapes) == 752
    a = "model.audio_tower."
    assert shapes[a + "subsample_conv_projection.layer0.conv.weight"] == (128, 1, 3, 3)
    assert shapes[a + "subsample_conv_projection.layer1.conv.weight"] == (32, 128, 3, 3)
    assert shapes[a + "subsample_conv_projection.input_proj_linear.weight"] == (1024, 1024)
    assert shapes[a + "layers.11.feed_forward2.ffw_layer_1.linear.weight"] == (4096, 1024)
    assert shapes[a + "layers.0.self_attn.per_dim_scale"] == (128,)
    assert shapes[a + "layers.0.lconv1d.linear_start.linear.weight"] == (2048, 1024)
    assert shapes[a + "layers.0.lconv1d.depthwise_conv1d.weight"] == (1024, 1, 5)
    assert shapes[a + "output_proj.bias"] == (1536,)
    assert shapes["model.embed_audio.embedding_projection.weight"] == (1536, 1536)
    e4b = factory.target_config(factory.resolve_spec(full_config="E4B"), "bfloat16")
    e4b_shapes = {p.name: p.shape for p in factory.target_params(e4b)}
    assert e4b_shapes["model.embed_audio.embedding_projection.weight"] == (2560, 1536)
    mlx = {p.name: p.shape for p in factory.to_mlx_layout(factory.target_params(config))}
    assert mlx["audio_tower.subsample_conv_projection.layer1.conv.weight"] == (32, 3, 3, 128)
    assert mlx["audio_tower.layers.0.lconv1d.depthwise_conv1d.weight"] == (1024, 5, 1)


def test_real_shape_12b_matches_reference_counts():
    """The 12B (`gemma4_unified`) spec: HF's parameter counts from the real config
    (reference/real-configs.md), component by component. HF keeps `layer_scalar` as a buffer."""
    spec = factory.resolve_spec(full_config="12B")
    config = factory.target_config(spec, "bfloat16")
    assert config["model_type"] == "gemma4_unified" and config["vision_config"]["model_patch_size"] == 48
    text = config["text_config"]
    assert [i for i, t in enumerate(text["layer_types"]) if t == "full_attention"] == list(range(5, 48, 6))
    counts: dict[str, int] = {}
    for p in factory.target_params(config):
        if not p.name.endswith("layer_scalar"):
            part = p.name.split(".")[1]
            counts[part] = counts.get(part, 0) + int(np.prod(p.shape))
    assert counts == {
        "language_model": 11_907_350_272,
        "vision_embedder": 35_176_704,
        "embed_vision": 14_745_600,
        "embed_audio": 2_457_600,
    }
    drafter = factory.drafter_config(spec, "bfloat16")
    assert drafter["model_type"] == "gemma4_unified_assistant" and not drafter["use_ordered_embeddings"]
    n = sum(int(np.prod(p.shape)) for p in factory.drafter_params(drafter) if not p.name.endswith("layer_scalar"))
    assert n == 422_856_960  # the HF card's 423 M


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("GEMMA_CHAT_SLOW") != "1", reason="opt-in: set GEMMA_CHAT_SLOW=1")
def test_real_shape_12b_smoke(tmp_path):
    """A real-shape 12B in 4 bits (~7 GB of disk and RAM; the bf16 one would need ~24 GB) with its
    `gemma4_unified_assistant` drafter: built, loaded by mlx-lm and by the engine, generating."""
    from support.factory.smoke import smoke_one

    report = smoke_one(tmp_path, "12B", "q4", max_tokens=2, prompt_tokens=2)
    print(json.dumps(report))
    assert report["vocab_size"] == 262144 and report["generated_tokens"] == 2
    assert report.get("pair_problems", []) == []
    assert 420 < report["drafter_params_m"] < 430
    assert report["mtp_tokens"] == report["plain_tokens"] == 4, report
