"""Audio encoders against transformers' references (tests/data/pack, "The audio family" and "The 12B
audio embedder"): the E2B/E4B-like conformer tower stage by stage, the 12B-like embedder, both
weight layouts, and the refusals of checkpoints without audio."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from core.model.audio import AudioEncoder, UnifiedAudioEncoder, build_audio_encoder, load_audio
from core.model.audio_input import AudioSpec, prepare_audio

PACK = Path(__file__).parents[1] / "data" / "pack"
AUDIO = PACK / "references" / "audio"
INPUTS = AUDIO / "inputs"
MODELS = PACK / "models"
AUDIO_TARGET = MODELS / "e-style-audio-target"
UNIFIED_TARGET = MODELS / "unified-style-target"
CLIPS = ["sine_1s", "chirp_3p7s", "noise_0p25s", "silence_2s", "long_31s", "short_0p05s", "tone8k_1p5s", "stereo44k_1s"]
FILES = {
    "sine_1s": "sine_1s.pcm16.wav",
    "chirp_3p7s": "chirp_3p7s.pcm16.wav",
    "noise_0p25s": "noise_0p25s.pcm16.wav",
    "silence_2s": "silence_2s.pcm16.wav",
    "long_31s": "long_31s.pcm16.flac",
    "short_0p05s": "short_0p05s.pcm16.wav",
    "tone8k_1p5s": "tone8k_1p5s.resampled16k.f32.wav",  # the feature extractor's own input
    "stereo44k_1s": "stereo44k_1s.resampled16k.f32.wav",
}
TOL = 1e-4  # the pack's tolerance for the tower's stages given its features (mlx-vlm: 3.7e-6)


@pytest.fixture(scope="module")
def tower() -> AudioEncoder:
    enc = load_audio(AUDIO_TARGET)
    assert isinstance(enc, AudioEncoder)
    return enc


@pytest.fixture(scope="module")
def refs():
    return load_file(AUDIO / "e-style-audio.safetensors"), load_file(AUDIO / "features.safetensors")


def _ref_features(feats, clip: str) -> np.ndarray:
    return feats[f"{clip}.input_features"][feats[f"{clip}.input_features_mask"].astype(bool)]


@pytest.mark.parametrize("clip", [c for c in CLIPS if c != "long_31s"])
def test_tower_stages_match_transformers(tower, refs, clip):
    """Given the reference features: the subsampling output, the tower output and the soft tokens."""
    ref, feats = refs
    f = _ref_features(feats, clip)
    for name, got in (
        ("sscp_output", tower.sscp(f)),
        ("audio_tower_output", tower.tower(f)),
        ("soft_tokens", tower.encode(f)),
    ):
        want = ref[f"{clip}.{name}"]
        assert got.shape == want.shape, name
        assert np.abs(np.array(got) - want).max() <= TOL, name


@pytest.mark.parametrize("clip", CLIPS)
def test_soft_tokens_from_our_own_features(tower, refs, clip):
    """The whole path from the file: decode, features, tower, embed_audio (the pack allows 2e-4)."""
    ref, _ = refs
    got = np.array(tower.encode_clip(prepare_audio(INPUTS / FILES[clip], AudioSpec.from_model_dir(AUDIO_TARGET))))
    if clip == "long_31s":  # 750 rows (30 s); the first and last 50 are stored
        assert got.shape == (750, 96)
        assert np.abs(got[:50] - ref["long_31s.soft_tokens_first50"]).max() <= 2e-4
        assert np.abs(got[-50:] - ref["long_31s.soft_tokens_last50"]).max() <= 2e-4
        return
    assert got.shape == ref[f"{clip}.soft_tokens"].shape
    assert np.abs(got - ref[f"{clip}.soft_tokens"]).max() <= 2e-4


def test_clip_bounds_and_soft_cap_matter(tower, refs):
    """The references catch an encoder that drops the clip bounds or the attention soft-cap."""
    ref, feats = refs
    f = _ref_features(feats, "chirp_3p7s")
    want = ref["chirp_3p7s.soft_tokens"]
    layer = tower.audio_tower.layers[0]
    saved = layer.self_attn.cap
    try:
        layer.self_attn.cap = 1e9  # tanh(x / 1e9) * 1e9 == x: no cap on this layer
        assert np.abs(np.array(tower.encode(f)) - want).max() > 1e-3
    finally:
        layer.self_attn.cap = saved
    q = layer.self_attn.q_proj
    bounds = (q.input_min, q.input_max, q.output_min, q.output_max)
    try:
        q.input_min, q.input_max = mx.array(-np.inf), mx.array(np.inf)
        q.output_min, q.output_max = mx.array(-np.inf), mx.array(np.inf)
        assert np.abs(np.array(tower.encode(f)) - want).max() > 1e-3
    finally:
        q.input_min, q.input_max, q.output_min, q.output_max = bounds
    assert np.abs(np.array(tower.encode(f)) - want).max() <= TOL


def _mlx_layout(src: Path, dst: Path) -> Path:
    """The checkpoint as mlx-community stores it: no `model.` prefix, convolutions in MLX's layout."""
    dst.mkdir()
    for f in src.iterdir():
        if not f.name.startswith("model"):
            shutil.copy(f, dst / f.name)
    tensors: dict[str, np.ndarray] = {}
    for f in sorted(src.glob("model*.safetensors")):
        tensors.update(load_file(f))
    out = {}
    for k, v in tensors.items():
        name = k.removeprefix("model.")
        if name.endswith("conv.weight") and v.ndim == 4:
            v = v.transpose(0, 2, 3, 1)
        elif name.endswith("depthwise_conv1d.weight"):
            v = v.transpose(0, 2, 1)
        out[name] = v.copy()  # contiguous, and 0-d scalars stay 0-d
    save_file(out, str(dst / "model.safetensors"))
    return dst


def test_mlx_community_layout_loads_alike(tmp_path, tower, refs):
    ref, feats = refs
    mlx_dir = _mlx_layout(AUDIO_TARGET, tmp_path / "mlx")
    enc = load_audio(mlx_dir)
    assert isinstance(enc, AudioEncoder)
    w = enc.audio_tower.subsample_conv_projection.layer1.conv.weight
    assert w.shape == (4, 3, 3, 128)
    f = _ref_features(feats, "sine_1s")
    np.testing.assert_array_equal(np.array(enc.encode(f)), np.array(tower.encode(f)))


def test_quantized_embedding_projection_loads(tmp_path):
    """mlx-community's quantized repos keep the tower in bf16 but quantize embed_audio's projection."""
    weights = {k: mx.array(v) for k, v in load_file(AUDIO_TARGET / "model-00002-of-00002.safetensors").items()}
    w = mx.random.normal((96, 64), key=mx.random.key(0))  # 64 inputs: a multiple of the group size
    q, scales, biases = mx.quantize(w, group_size=32, bits=4)
    config = json.loads((AUDIO_TARGET / "config.json").read_text())
    config["audio_config"] = {**config["audio_config"], "output_proj_dims": 64}
    config["quantization"] = {"group_size": 32, "bits": 4}
    weights = {k: v for k, v in weights.items() if "output_proj" not in k and "embed_audio" not in k}
    weights.update(
        {
            "model.audio_tower.output_proj.weight": mx.zeros((64, 24)),
            "model.audio_tower.output_proj.bias": mx.zeros((64,)),
            "model.embed_audio.embedding_projection.weight": q,
            "model.embed_audio.embedding_projection.scales": scales,
            "model.embed_audio.embedding_projection.biases": biases,
        }
    )
    enc = build_audio_encoder(config, weights)
    assert isinstance(enc, AudioEncoder)
    assert type(enc.embed_audio.embedding_projection).__name__ == "QuantizedLinear"
    assert enc.encode(np.zeros((8, 128), np.float32)).shape == (2, 96)


def test_checkpoints_without_audio_have_no_encoder():
    for name in ("e-style-target", "moe-style-target", "dense-style-target"):
        assert load_audio(MODELS / name) is None


# -- the 12B embedder ---------------------------------------------------------------------------------


@pytest.mark.parametrize("clip", ["sine_1s", "chirp_3p7s", "noise_0p25s", "silence_2s", "long_31s", "short_0p05s"])
def test_unified_embedder_soft_tokens(clip):
    enc = load_audio(UNIFIED_TARGET)
    assert isinstance(enc, UnifiedAudioEncoder)
    ref = load_file(AUDIO / "unified-style-audio.safetensors")
    got = np.array(enc.encode_clip(prepare_audio(INPUTS / FILES[clip], AudioSpec.from_model_dir(UNIFIED_TARGET))))
    if clip == "long_31s":  # no 30 s cut and no 750 cap: 775 rows
        assert got.shape == (775, 88)
        assert np.abs(got[:50] - ref["long_31s.soft_tokens_first50"]).max() <= 1e-4
        assert np.abs(got[-50:] - ref["long_31s.soft_tokens_last50"]).max() <= 1e-4
        return
    want = ref[f"{clip}.soft_tokens"]
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= 1e-4
