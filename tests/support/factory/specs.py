"""Model specs for the checkpoint factory and the config.json files built from them.

A spec is a plain dict with four parts:
  text     -- the Gemma 4 text-model fields that differ between families (hidden size, layer types, ...)
  vision   -- the vision tower fields, plus `soft_tokens` (the default image budget)
  drafter  -- the `gemma4_assistant` drafter's own fields (its kv heads and head dims always
              follow the target, because the drafter reads the target's K/V)
  thought_channel -- whether the chat template adds an empty thought channel to the generation
              prompt when thinking is off (26B/31B templates do, E2B/E4B do not)
  audio    -- (optional) the E2B/E4B conformer audio tower's `audio_config` fields (HF names); the
              checkpoint then has `model.audio_tower.*`, `model.embed_audio.*` and a feature-extractor
              block in processor_config.json
  unified  -- (optional) True for the encoder-free 12B architecture (`gemma4_unified`): `vision`
              then holds the vision embedder's fields (`mm_embed_dim`, `mm_posemb_size`, ...), the
              checkpoint has an audio embedder, a single-file processor config, and a
              `gemma4_unified_assistant` drafter

config.json is written in the hub format: every text_config key, `global_head_dim` and
`num_global_key_value_heads` inside text_config, a top-level `vocab_size`, and every special id
read from the tokenizer (the packaged tokenizer uses Gemma 4's token strings with other ids).
"""

from __future__ import annotations

import copy
import json
from functools import lru_cache
from pathlib import Path

TOKENIZER_DIR = Path(__file__).resolve().parent / "data" / "tokenizer"

S, F = "sliding_attention", "full_attention"

ROPE_PARAMETERS = {
    "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0, "rope_type": "proportional"},
    "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
}

# The order of the keys in a real Gemma 4 text_config. Every key is always written: mlx-lm's
# defaults differ from HF's, so a missing key builds a different model there.
TEXT_CONFIG_KEYS = (
    "model_type",
    "vocab_size",
    "hidden_activation",
    "rms_norm_eps",
    "max_position_embeddings",
    "attention_bias",
    "attention_dropout",
    "rope_parameters",
    "sliding_window",
    "final_logit_softcapping",
    "tie_word_embeddings",
    "use_bidirectional_attention",
    "pad_token_id",
    "eos_token_id",
    "bos_token_id",
    "initializer_range",
    "use_cache",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "layer_types",
    "num_attention_heads",
    "num_key_value_heads",
    "num_global_key_value_heads",
    "head_dim",
    "global_head_dim",
    "attention_k_eq_v",
    "num_kv_shared_layers",
    "hidden_size_per_layer_input",
    "vocab_size_per_layer_input",
    "use_double_wide_mlp",
    "enable_moe_block",
    "num_experts",
    "top_k_experts",
    "moe_intermediate_size",
)

VISION_CONFIG_KEYS = (
    "model_type",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "hidden_activation",
    "rms_norm_eps",
    "max_position_embeddings",
    "attention_bias",
    "attention_dropout",
    "rope_parameters",
    "pooling_kernel_size",
    "patch_size",
    "position_embedding_size",
    "use_clipped_linears",
    "standardize",
    "initializer_range",
)

_TEXT_COMMON = {
    "model_type": "gemma4_text",
    "hidden_activation": "gelu_pytorch_tanh",
    "rms_norm_eps": 1e-06,
    "max_position_embeddings": 131072,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "rope_parameters": ROPE_PARAMETERS,
    "sliding_window": 16,
    "final_logit_softcapping": 30.0,
    "tie_word_embeddings": True,
    "use_bidirectional_attention": None,
    "initializer_range": 0.02,
    "use_cache": True,
    "num_global_key_value_heads": None,
    "attention_k_eq_v": False,
    "num_kv_shared_layers": 0,
    "hidden_size_per_layer_input": 0,
    "vocab_size_per_layer_input": None,  # None: the vocab size
    "use_double_wide_mlp": False,
    "enable_moe_block": False,
    "num_experts": None,
    "top_k_experts": None,
    "moe_intermediate_size": None,
}

_VISION_COMMON = {
    "model_type": "gemma4_vision",
    "hidden_activation": "gelu_pytorch_tanh",
    "rms_norm_eps": 1e-06,
    "max_position_embeddings": 131072,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "rope_parameters": {"rope_theta": 100.0, "rope_type": "default"},
    "pooling_kernel_size": 3,
    "patch_size": 16,
    "initializer_range": 0.02,
}

_TINY_VISION = {
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "position_embedding_size": 1024,
    "soft_tokens": 280,
}

_UNIFIED_AUDIO = {
    "model_type": "gemma4_unified_audio",
    "audio_embed_dim": 640,
    "audio_samples_per_token": 640,
    "hidden_size": 640,
    "output_proj_dims": 640,
    "rms_norm_eps": 1e-06,
    "initializer_range": 0.02,
}

# The released E2B/E4B audio_config (reference/tools-and-audio.md B1.2); tiny and real specs override sizes.
_AUDIO_COMMON = {
    "model_type": "gemma4_audio",
    "hidden_size": 1024,
    "num_hidden_layers": 12,
    "num_attention_heads": 8,
    "hidden_act": "silu",
    "subsampling_conv_channels": [128, 32],
    "conv_kernel_size": 5,
    "residual_weight": 0.5,
    "attention_chunk_size": 12,
    "attention_context_left": 13,
    "attention_context_right": 0,
    "attention_logit_cap": 50.0,
    "attention_invalid_logits_value": -1000000000.0,
    "use_clipped_linears": True,
    "rms_norm_eps": 1e-06,
    "gradient_clipping": 10000000000.0,
    "output_proj_dims": 1536,
    "initializer_range": 0.02,
}
# A tiny tower: 2 layers, width 32, 4 channels after the second convolution, output 64 wide (a 4-bit
# group fits, and it is not the text width)
_TINY_AUDIO = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "subsampling_conv_channels": [128, 4],
    "output_proj_dims": 64,
}
# the Gemma 4 processor's released feature-extractor block (E2B/E4B)
FEATURE_EXTRACTOR = {
    "feature_size": 128,
    "sampling_rate": 16000,
    "padding_value": 0.0,
    "padding_side": "right",
    "return_attention_mask": True,
    "min_frequency": 0.0,
    "max_frequency": 8000.0,
    "preemphasis": 0.0,
    "preemphasis_htk_flavor": True,
    "fft_overdrive": False,
    "dither": 0.0,
    "input_scale_factor": 1.0,
    "frame_length": 320,
    "hop_length": 160,
    "mel_floor": 0.001,
    "fft_length": 512,
    "per_bin_mean": None,
    "per_bin_stddev": None,
    "feature_extractor_type": "Gemma4AudioFeatureExtractor",
}

_DRAFTER_DENSE_HEAD = {"use_ordered_embeddings": False, "num_centroids": 2048, "centroid_intermediate_top_k": 32}

# Tiny families. Dims are multiples of 64 where a 4-bit group of 64 must fit, heads * head_dim
# differs from the hidden size (as in every real Gemma 4), and each family has its own hidden
# size so that a drafter paired with the wrong target is caught by the size check.
VARIANTS: dict[str, dict] = {
    # E2B/E4B-like: sliding + full, KV-shared tail with double-wide MLP, per-layer inputs (PLE),
    # clipped vision linears, centroid-head drafter.
    "e-style": {
        "text": {
            "hidden_size": 128,
            "intermediate_size": 128,
            "num_hidden_layers": 6,
            "layer_types": [S, S, F, S, S, F],
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 32,
            "global_head_dim": 64,
            "num_kv_shared_layers": 3,
            "hidden_size_per_layer_input": 64,
            "use_double_wide_mlp": True,
        },
        "vision": {**_TINY_VISION, "use_clipped_linears": True, "standardize": False},
        "drafter": {
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_attention_heads": 4,
            "use_ordered_embeddings": True,
            "num_centroids": 32,
            "centroid_intermediate_top_k": 8,
        },
        "thought_channel": False,
    },
    # 26B-A4B-like: MoE beside the dense MLP, k_eq_v full layers with their own kv head count,
    # bidirectional image attention, standardised vision output, tied dense-head drafter.
    "moe-style": {
        "text": {
            "hidden_size": 192,
            "intermediate_size": 128,
            "num_hidden_layers": 5,
            "layer_types": [S, S, F, S, F],
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "num_global_key_value_heads": 1,
            "head_dim": 32,
            "global_head_dim": 64,
            "attention_k_eq_v": True,
            "use_bidirectional_attention": "vision",
            "enable_moe_block": True,
            "num_experts": 6,
            "top_k_experts": 3,
            "moe_intermediate_size": 64,
        },
        "vision": {**_TINY_VISION, "use_clipped_linears": False, "standardize": True},
        "drafter": {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, **_DRAFTER_DENSE_HEAD},
        "thought_channel": True,
    },
    # 31B-like: dense, no PLE, no KV sharing, k_eq_v, a full layer before the last one.
    "dense-style": {
        "text": {
            "hidden_size": 256,
            "intermediate_size": 384,
            "num_hidden_layers": 5,
            "layer_types": [S, F, S, S, F],
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "num_global_key_value_heads": 1,
            "head_dim": 32,
            "global_head_dim": 64,
            "attention_k_eq_v": True,
            "use_bidirectional_attention": "vision",
        },
        "vision": {**_TINY_VISION, "use_clipped_linears": False, "standardize": True},
        "drafter": {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, **_DRAFTER_DENSE_HEAD},
        "thought_channel": True,
    },
    # 12B-like (`gemma4_unified`): dense, k_eq_v with one global kv head, no PLE / KV sharing / MoE,
    # an encoder-free vision embedder whose width differs from the text width, image tokens
    # bidirectional on every layer, tied dense-head `gemma4_unified_assistant` drafter.
    "unified-style": {
        "text": {
            "model_type": "gemma4_unified_text",
            "max_position_embeddings": 262144,
            "hidden_size": 384,
            "intermediate_size": 512,
            "num_hidden_layers": 5,
            "layer_types": [S, S, F, S, F],
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "num_global_key_value_heads": 1,
            "head_dim": 32,
            "global_head_dim": 64,
            "attention_k_eq_v": True,
            "use_bidirectional_attention": "vision",
        },
        "vision": {"mm_embed_dim": 64, "mm_posemb_size": 1120, "soft_tokens": 280},
        "drafter": {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, **_DRAFTER_DENSE_HEAD},
        "thought_channel": True,
        "unified": True,
    },
}

# E2B/E4B-like with the conformer audio tower (as the pack's e-style-audio target)
VARIANTS["e-style-audio"] = {**copy.deepcopy(VARIANTS["e-style"]), "audio": dict(_TINY_AUDIO)}

_E_VISION_REAL = {
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 16,
    "num_attention_heads": 12,
    "num_key_value_heads": 12,
    "head_dim": 64,
    "position_embedding_size": 10240,
    "soft_tokens": 280,
    "use_clipped_linears": True,
    "standardize": False,
}


def _every(n_layers: int, period: int) -> list[str]:
    return [F if i % period == period - 1 else S for i in range(n_layers)]


# Real shapes (reference/real-configs.md, high confidence) for the opt-in slow smoke test.
# The E2B and E4B assistants share their shape (hidden 256, centroid head); only the backbone differs.
_E_DRAFTER_REAL = {
    "hidden_size": 256,
    "intermediate_size": 2048,
    "num_attention_heads": 4,
    "use_ordered_embeddings": True,
    "num_centroids": 2048,
    "centroid_intermediate_top_k": 32,
}
REAL_SHAPES: dict[str, dict] = {
    "E2B": {
        "text": {
            "vocab_size": 262144,
            "hidden_size": 1536,
            "intermediate_size": 6144,
            "num_hidden_layers": 35,
            "layer_types": _every(35, 5),
            "sliding_window": 512,
            "num_attention_heads": 8,
            "num_key_value_heads": 1,
            "head_dim": 256,
            "global_head_dim": 512,
            "num_kv_shared_layers": 20,
            "hidden_size_per_layer_input": 256,
            "use_double_wide_mlp": True,
        },
        "vision": _E_VISION_REAL,
        "audio": {},  # the released tower as it is
        "drafter": _E_DRAFTER_REAL,
        "thought_channel": False,
    },
    "E4B": {
        "text": {
            "vocab_size": 262144,
            "hidden_size": 2560,
            "intermediate_size": 10240,
            "num_hidden_layers": 42,
            "layer_types": _every(42, 6),
            "sliding_window": 512,
            "num_attention_heads": 8,
            "num_key_value_heads": 2,
            "head_dim": 256,
            "global_head_dim": 512,
            "num_kv_shared_layers": 18,
            "hidden_size_per_layer_input": 256,
            "use_double_wide_mlp": False,
        },
        "vision": _E_VISION_REAL,
        "audio": {},
        "drafter": _E_DRAFTER_REAL,
        "thought_channel": False,
    },
}


REAL_SHAPES["12B"] = {
    "text": {
        "model_type": "gemma4_unified_text",
        "vocab_size": 262144,
        "max_position_embeddings": 262144,
        "hidden_size": 3840,
        "intermediate_size": 15360,
        "num_hidden_layers": 48,
        "layer_types": _every(48, 6),
        "sliding_window": 1024,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "num_global_key_value_heads": 1,
        "head_dim": 256,
        "global_head_dim": 512,
        "attention_k_eq_v": True,
        "use_bidirectional_attention": "vision",
    },
    "vision": {"mm_embed_dim": 3840, "mm_posemb_size": 1120, "soft_tokens": 280},
    # the 12B assistant: hidden 1024, FFN 8192, 16 heads, tied dense head (real-configs.md)
    "drafter": {"hidden_size": 1024, "intermediate_size": 8192, "num_attention_heads": 16, **_DRAFTER_DENSE_HEAD},
    "thought_channel": True,
    "unified": True,
}


def resolve_spec(
    variant: str = "e-style", full_config: dict | str | None = None, config_overrides: dict | None = None
) -> dict:
    """The spec to build. `full_config` (a REAL_SHAPES name or a whole spec) replaces the variant;
    `config_overrides` then updates it: keys `text_config`, `vision_config`, `drafter` update those
    parts, `thought_channel` sets the flag, and any other key goes into the text config."""
    if full_config is None:
        if variant not in VARIANTS:
            raise ValueError(f"unknown variant {variant!r}; choose one of {sorted(VARIANTS)}")
        spec = copy.deepcopy(VARIANTS[variant])
    elif isinstance(full_config, str):
        if full_config not in REAL_SHAPES:
            raise ValueError(f"unknown real shape {full_config!r}; choose one of {sorted(REAL_SHAPES)}")
        spec = copy.deepcopy(REAL_SHAPES[full_config])
    else:
        spec = copy.deepcopy(full_config)
    for key, value in (config_overrides or {}).items():
        if key == "text_config":
            spec["text"].update(value)
        elif key == "vision_config":
            spec["vision"].update(value)
        elif key == "drafter":
            spec["drafter"].update(value)
        elif key == "audio_config":
            spec["audio"] = {**spec.get("audio", {}), **value}
        elif key == "thought_channel":
            spec["thought_channel"] = bool(value)
        else:
            spec["text"][key] = value
    text = spec["text"]
    n = text["num_hidden_layers"]
    if len(text.get("layer_types") or []) != n:
        # A changed depth without explicit layer types: every third layer full, the last one full.
        text["layer_types"] = [F if (n - 1 - i) % 3 == 0 else S for i in range(n)]
    return spec


# -- tokenizer -----------------------------------------------------------------------------------


@lru_cache(maxsize=1)
def tokenizer_info() -> dict:
    """Special ids and the vocab size of the packaged tokenizer, read from its files."""
    data = json.loads((TOKENIZER_DIR / "tokenizer.json").read_text(encoding="utf-8"))
    ids = {t["content"]: t["id"] for t in data["added_tokens"]}
    vocab = data["model"]["vocab"]
    size = max(max(vocab.values()), max(ids.values())) + 1
    return {"ids": ids, "vocab_size": size}


def token_id(content: str) -> int:
    return tokenizer_info()["ids"][content]


def special_ids() -> dict:
    """The config.json token-id fields, looked up by token string."""
    return {
        "pad_token_id": token_id("<pad>"),
        "bos_token_id": token_id("<bos>"),
        "eos_token_id": [token_id("<eos>"), token_id("<turn|>"), token_id("<|tool_response>")],
        "boi_token_id": token_id("<|image>"),
        "eoi_token_id": token_id("<image|>"),
        "image_token_id": token_id("<|image|>"),
        "video_token_id": token_id("<|video|>"),
        "boa_token_id": token_id("<|audio>"),
        "eoa_token_id": token_id("<audio|>"),
        "audio_token_id": token_id("<|audio|>"),
    }


# -- configs ------------------------------------------------------------------------------------


def text_config(spec: dict) -> dict:
    ids = special_ids()
    merged = {**_TEXT_COMMON, **spec["text"]}
    merged.setdefault("vocab_size", tokenizer_info()["vocab_size"])
    if merged["vocab_size_per_layer_input"] is None:
        merged["vocab_size_per_layer_input"] = merged["vocab_size"]
    merged["pad_token_id"] = ids["pad_token_id"]
    merged["eos_token_id"] = ids["eos_token_id"][0]
    merged["bos_token_id"] = ids["bos_token_id"]
    merged["rope_parameters"] = copy.deepcopy(merged["rope_parameters"])
    missing = [k for k in TEXT_CONFIG_KEYS if k not in merged]
    if missing:
        raise ValueError(f"text config lacks {missing}")
    unknown = sorted(set(merged) - set(TEXT_CONFIG_KEYS))
    if unknown:
        raise ValueError(f"unknown text config keys {unknown}")
    return {k: merged[k] for k in TEXT_CONFIG_KEYS}


def vision_config(spec: dict) -> dict:
    if spec.get("unified"):
        v = spec["vision"]
        return {
            "model_type": "gemma4_unified_vision",
            "patch_size": 16,
            "pooling_kernel_size": 3,
            "model_patch_size": 48,
            "mm_embed_dim": v["mm_embed_dim"],
            "mm_posemb_size": v["mm_posemb_size"],
            "num_soft_tokens": v["soft_tokens"],
            "output_proj_dims": v["mm_embed_dim"],
            "rms_norm_eps": 1e-06,
            "initializer_range": 0.02,
        }
    merged = {**_VISION_COMMON, **spec["vision"]}
    merged["rope_parameters"] = copy.deepcopy(merged["rope_parameters"])
    return {k: merged[k] for k in VISION_CONFIG_KEYS}


def audio_config(spec: dict) -> dict | None:
    """The E2B/E4B `audio_config` (every released key), or None for a target without audio."""
    if "audio" not in spec:
        return None
    return {**_AUDIO_COMMON, **spec["audio"]}


def target_config(spec: dict, dtype_name: str) -> dict:
    ids = special_ids()
    text = text_config(spec)
    unified = bool(spec.get("unified"))
    config = {
        "architectures": ["Gemma4UnifiedForConditionalGeneration" if unified else "Gemma4ForConditionalGeneration"],
        "model_type": "gemma4_unified" if unified else "gemma4",
        "vocab_size": text["vocab_size"],
        "text_config": text,
        "vision_config": vision_config(spec),
        "audio_config": dict(_UNIFIED_AUDIO) if unified else audio_config(spec),
        "boi_token_id": ids["boi_token_id"],
        "eoi_token_id": ids["eoi_token_id"],
        "image_token_id": ids["image_token_id"],
        "video_token_id": ids["video_token_id"],
        "boa_token_id": ids["boa_token_id"],
        "eoa_token_index": ids["eoa_token_id"],
        "eoa_token_id": ids["eoa_token_id"],
        "audio_token_id": ids["audio_token_id"],
        "eos_token_id": ids["eos_token_id"],
        "pad_token_id": ids["pad_token_id"],
        "bos_token_id": ids["bos_token_id"],
        "vision_soft_tokens_per_image": spec["vision"]["soft_tokens"],
        "initializer_range": 0.02,
        "tie_word_embeddings": True,
        "dtype": dtype_name,
    }
    if unified:  # the real 12B config names the end-of-audio id only as `eoa_token_index`
        del config["eoa_token_id"]
    return config


def drafter_config(spec: dict, dtype_name: str) -> dict:
    """A `gemma4_assistant` config paired with the spec's target: 4 query-only layers [S, S, S, F]
    that read the target's K/V, so kv heads, head dims, k_eq_v and the window follow the target."""
    ids = special_ids()
    target = text_config(spec)
    d = spec["drafter"]
    text = dict(target)
    text.update(
        {
            "final_logit_softcapping": None,
            "use_bidirectional_attention": None,
            "hidden_size": d["hidden_size"],
            "intermediate_size": d["intermediate_size"],
            "num_hidden_layers": 4,
            "layer_types": [S, S, S, F],
            "num_attention_heads": d["num_attention_heads"],
            "num_kv_shared_layers": 4,
            "hidden_size_per_layer_input": 0,
            "vocab_size_per_layer_input": 0,
            "use_double_wide_mlp": False,
            "enable_moe_block": False,
            "num_experts": None,
            "top_k_experts": None,
            "moe_intermediate_size": None,
        }
    )
    unified = bool(spec.get("unified"))
    return {
        "architectures": ["Gemma4UnifiedAssistantForCausalLM" if unified else "Gemma4AssistantForCausalLM"],
        "model_type": "gemma4_unified_assistant" if unified else "gemma4_assistant",
        "backbone_hidden_size": target["hidden_size"],
        "use_ordered_embeddings": d["use_ordered_embeddings"],
        "num_centroids": d["num_centroids"],
        "centroid_intermediate_top_k": d["centroid_intermediate_top_k"],
        "tie_word_embeddings": True,
        "text_config": text,
        "boi_token_id": ids["boi_token_id"],
        "eoi_token_id": ids["eoi_token_id"],
        "image_token_id": ids["image_token_id"],
        "boa_token_id": ids["boa_token_id"],
        "eoa_token_id": ids["eoa_token_id"],
        "audio_token_id": ids["audio_token_id"],
        "dtype": dtype_name,
    }


def generation_config(drafter: bool = False) -> dict:
    ids = special_ids()
    out = {
        "bos_token_id": ids["bos_token_id"],
        "pad_token_id": ids["pad_token_id"],
        "eos_token_id": ids["eos_token_id"],
        "do_sample": True,
        "temperature": 1.0,
        "top_k": 64,
        "top_p": 0.95,
    }
    if drafter:
        out.update({"num_assistant_tokens": 3, "num_assistant_tokens_schedule": "constant"})
    return out


def preprocessor_config(spec: dict) -> dict:
    v = {**_VISION_COMMON, **spec["vision"]}  # patch 16 and pooling 3 for every family
    return {
        "image_processor_type": "Gemma4ImageProcessor",
        "processor_class": "Gemma4Processor",
        "patch_size": v["patch_size"],
        "pooling_kernel_size": v["pooling_kernel_size"],
        "max_soft_tokens": v["soft_tokens"],
        "do_resize": True,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": False,
        "image_mean": [0.0, 0.0, 0.0],
        "image_std": [1.0, 1.0, 1.0],
        "do_convert_rgb": True,
        "resample": 3,
    }


def processor_config(spec: dict) -> dict:
    if spec.get("unified"):
        # the unified repos ship one processor_config.json with the image processor nested in it
        image = {
            **preprocessor_config(spec),
            "image_processor_type": "Gemma4UnifiedImageProcessor",
        }
        image.pop("processor_class")
        return {
            "processor_class": "Gemma4UnifiedProcessor",
            "image_processor": image,
            "video_processor": {
                "video_processor_type": "Gemma4UnifiedVideoProcessor",
                "patch_size": 16,
                "pooling_kernel_size": 3,
                "max_soft_tokens": 70,
            },
            "feature_extractor": {
                "feature_extractor_type": "Gemma4UnifiedAudioFeatureExtractor",
                "feature_size": 640,
                "sampling_rate": 16000,
                "audio_samples_per_token": 640,
                "padding_value": 0.0,
            },
            "image_seq_length": spec["vision"]["soft_tokens"],
            "audio_seq_length": 750,
            "audio_ms_per_token": 40,
        }
    out: dict = {"processor_class": "Gemma4Processor"}
    if "audio" in spec:  # the real E2B/E4B repositories carry the feature extractor's settings here
        out["feature_extractor"] = dict(FEATURE_EXTRACTOR)
    return {**out, "image_seq_length": spec["vision"]["soft_tokens"], "audio_seq_length": 750, "audio_ms_per_token": 40}
