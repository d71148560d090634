"""Deterministic random-weight Gemma 4 checkpoints in the real on-disk formats.

    build_checkpoint(out_dir, variant="e-style", layout="hf", dtype="float32", seed=0) -> Path
    build_drafter(out_dir, variant="e-style", dtype="float32", seed=0) -> Path
    build_pairing(out_dir, variant="e-style", layout="hf", dtype="float32", seed=0) -> (target, drafter)
    quantize_drafter(drafter_dir, out_dir, bits=4) -> Path    (any drafter, e.g. the pack's trained ones)

Variants (`VARIANTS`) together cover every architectural branch: `e-style` (E2B/E4B-like: PLE,
KV sharing, double-wide MLP, clipped vision linears, centroid-head drafter), `moe-style`
(26B-A4B-like: MoE beside the dense MLP, k_eq_v, global kv heads, bidirectional image attention,
vision standardize, dense-head drafter), `dense-style` (31B-like) and `unified-style` (12B-like:
`gemma4_unified`, encoder-free vision embedder, audio embedder, image tokens bidirectional on every
layer, `gemma4_unified_assistant` drafter). `REAL_SHAPES` holds the exact E2B/E4B/12B sizes for an
opt-in smoke test (`full_config="E2B"`).

Layouts: "hf" (google originals: `model.language_model.*`, chat template in
`chat_template.jinja`) and "mlx" (mlx-community conversions: `language_model.model.*`, MoE experts
as `switch_glu`, template inside `tokenizer_config.json`). Dtypes: float32, bfloat16, q4 (mlx
layout only, as on the hub; the vision tower and the drafter stay bfloat16). Drafters ship in the
HF layout only.

Weights are random: a pairing generates babble and the drafter's acceptance is near zero. Every
checkpoint carries `gemma_chat_factory.json` saying so. Same arguments -> bit-identical files.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from .params import Param, drafter_params, hf_to_mlx_names, mlx_name, target_params, to_mlx_layout
from .specs import (
    REAL_SHAPES,
    TEXT_CONFIG_KEYS,
    TOKENIZER_DIR,
    VARIANTS,
    VISION_CONFIG_KEYS,
    drafter_config,
    generation_config,
    preprocessor_config,
    processor_config,
    resolve_spec,
    special_ids,
    target_config,
    tokenizer_info,
)
from .writer import GROUP_SIZE, disk_tensors, write_weights

# Bump whenever the bytes a build writes change: the demo cache rebuilds on a new version.
FACTORY_VERSION = 1

MARKER_FILE = "gemma_chat_factory.json"
LAYOUTS = ("hf", "mlx")
DTYPES = ("float32", "bfloat16", "q4")
_DTYPE_NAMES = {"float32": "float32", "bfloat16": "bfloat16", "q4": "bfloat16"}
_CHAT_TEMPLATE = TOKENIZER_DIR.parent / "chat_template.jinja"
_THOUGHT_CHANNEL = "{%- if not think -%}{{- '<|channel>thought\\n<channel|>' -}}{%- endif -%}"

__all__ = [
    "FACTORY_VERSION",
    "VARIANTS",
    "REAL_SHAPES",
    "LAYOUTS",
    "DTYPES",
    "MARKER_FILE",
    "build_checkpoint",
    "build_drafter",
    "build_pairing",
    "quantize_drafter",
    "chat_template",
    "resolve_spec",
    "target_config",
    "drafter_config",
    "target_params",
    "drafter_params",
    "hf_to_mlx_names",
    "mlx_name",
    "special_ids",
    "tokenizer_info",
    "Param",
    "TEXT_CONFIG_KEYS",
    "VISION_CONFIG_KEYS",
]


def chat_template(thought_channel: bool = False) -> str:
    """The Gemma 4-like template; with `thought_channel` the generation prompt gets an empty
    thought channel when thinking is off, as the 26B/31B templates do."""
    text = _CHAT_TEMPLATE.read_text(encoding="utf-8")
    return text.replace("{#- THOUGHT_CHANNEL -#}", _THOUGHT_CHANNEL if thought_channel else "")


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def _write_tokenizer(out: Path, vocab_size: int, template: str | None, template_file: bool) -> None:
    """Copy the packaged tokenizer. A vocab larger than the tokenizer's (the real-shape 262144)
    gets filler vocab entries `<unused{id}>`, so every id a model can emit decodes to harmless
    text (mlx-lm's streaming detokenizer raises on unknown ids)."""
    base = tokenizer_info()["vocab_size"]
    if vocab_size < base:
        raise ValueError(f"vocab_size {vocab_size} is below the tokenizer's {base} ids")
    if vocab_size == base:
        shutil.copyfile(TOKENIZER_DIR / "tokenizer.json", out / "tokenizer.json")
    else:
        data = json.loads((TOKENIZER_DIR / "tokenizer.json").read_text(encoding="utf-8"))
        vocab = data["model"]["vocab"]
        for i in range(base, vocab_size):
            vocab[f"<unused{i}>"] = i
        (out / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    tok_cfg = json.loads((TOKENIZER_DIR / "tokenizer_config.json").read_text(encoding="utf-8"))
    tok_cfg.pop("chat_template", None)
    if template is not None:
        if template_file:
            (out / "chat_template.jinja").write_text(template, encoding="utf-8")
        else:
            tok_cfg["chat_template"] = template
    _write_json(out / "tokenizer_config.json", tok_cfg)


def _prepare(out_dir: str | os.PathLike[str]) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return out


def _marker(kind: str, variant: str, layout: str, dtype: str, seed: int, real_shape: str | None) -> dict:
    return {
        "random_weights": True,
        "label": "factory: random weights",
        "kind": kind,
        "variant": variant,
        "real_shape": real_shape,
        "layout": layout,
        "dtype": dtype,
        "seed": seed,
        "factory_version": FACTORY_VERSION,
    }


def build_checkpoint(
    out_dir: str | os.PathLike[str],
    variant: str = "e-style",
    layout: str = "hf",
    dtype: str = "float32",
    seed: int = 0,
    config_overrides: dict | None = None,
    full_config: dict | str | None = None,
    max_shard_bytes: int | None = None,
) -> Path:
    """Write a `gemma4` target checkpoint (text + vision) into `out_dir` and return it.
    `max_shard_bytes` splits the weights into hub-style shards with a `model.safetensors.index.json`."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; use one of {LAYOUTS}")
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {DTYPES}")
    if dtype == "q4" and layout != "mlx":
        raise ValueError("4-bit checkpoints exist only in the mlx-community layout (layout='mlx')")
    spec = resolve_spec(variant, full_config, config_overrides)
    out = _prepare(out_dir)
    config = target_config(spec, _DTYPE_NAMES[dtype])
    params = target_params(config)
    if layout == "mlx":
        params = to_mlx_layout(params)
    tensors, per_path = disk_tensors(params, dtype, seed)
    if dtype == "q4":
        # mlx-lm's convert writes the non-default per-module settings (8-bit routers) by module path.
        quant = {"group_size": GROUP_SIZE, "bits": 4, "mode": "affine", **per_path}
        config["quantization"] = quant
        config["quantization_config"] = dict(quant)
    write_weights(out, tensors, {"format": "pt" if layout == "hf" else "mlx"}, max_shard_bytes)
    _write_json(out / "config.json", config)
    _write_json(out / "generation_config.json", generation_config())
    if not spec.get("unified"):  # the unified repos carry only the single-file processor config
        _write_json(out / "preprocessor_config.json", preprocessor_config(spec))
    _write_json(out / "processor_config.json", processor_config(spec))
    _write_tokenizer(
        out, config["vocab_size"], chat_template(spec.get("thought_channel", False)), template_file=layout == "hf"
    )
    real = full_config if isinstance(full_config, str) else None
    _write_json(out / MARKER_FILE, _marker("target", variant, layout, dtype, seed, real))
    return out


def build_drafter(
    out_dir: str | os.PathLike[str],
    variant: str = "e-style",
    dtype: str = "float32",
    seed: int = 0,
    config_overrides: dict | None = None,
    full_config: dict | str | None = None,
) -> Path:
    """Write the `gemma4_assistant` drafter for the target of the same spec (HF layout).
    `dtype` "q4" gives a bfloat16 drafter (no 4-bit drafters are published)."""
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {DTYPES}")
    spec = resolve_spec(variant, full_config, config_overrides)
    out = _prepare(out_dir)
    weight_dtype = "bfloat16" if dtype == "q4" else dtype
    config = drafter_config(spec, weight_dtype)
    tensors, _ = disk_tensors(drafter_params(config), weight_dtype, seed + 1)
    write_weights(out, tensors, {"format": "pt"})
    _write_json(out / "config.json", config)
    _write_json(out / "generation_config.json", generation_config(drafter=True))
    _write_tokenizer(
        out, config["text_config"]["vocab_size"], chat_template(spec.get("thought_channel", False)), template_file=False
    )
    real = full_config if isinstance(full_config, str) else None
    _write_json(out / MARKER_FILE, _marker("drafter", variant, "hf", weight_dtype, seed, real))
    return out


def build_pairing(
    out_dir: str | os.PathLike[str],
    variant: str = "e-style",
    layout: str = "hf",
    dtype: str = "float32",
    seed: int = 0,
    config_overrides: dict | None = None,
    full_config: dict | str | None = None,
    max_shard_bytes: int | None = None,
) -> tuple[Path, Path]:
    """A target and its drafter side by side: `<out_dir>/<name>-target`, `<out_dir>/<name>-assistant`."""
    name = full_config if isinstance(full_config, str) else variant
    root = Path(out_dir)
    target = build_checkpoint(
        root / f"{name}-target", variant, layout, dtype, seed, config_overrides, full_config, max_shard_bytes
    )
    drafter = build_drafter(root / f"{name}-assistant", variant, dtype, seed, config_overrides, full_config)
    return target, drafter


def quantize_drafter(
    src: Path, out_dir: Path, bits: int = 4, group_size: int = GROUP_SIZE, scales_dtype: str | None = None
) -> Path:
    """Copy a drafter checkpoint with its linear and embedding weights quantized, as mlx-community's 4-bit
    assistants are (`<module>.weight` packed uint32 beside `<module>.scales` / `.biases`, and a
    "quantization" entry in config.json): the dense head's tied embedding, the centroid head's packed
    embedding and its `centroids` projection included. Norms, `token_ordering` and any weight whose input
    width is not a multiple of `group_size` stay as they are. `scales_dtype` defaults to the weights' own."""
    import mlx.core as mx

    src, out = Path(src), _prepare(out_dir)
    weights: dict = {}
    for f in sorted(src.glob("model*.safetensors")):
        weights.update(mx.load(str(f)))  # type: ignore[arg-type]  # a dict for .safetensors files
    quantized: dict = {}
    for name, w in weights.items():
        stem = name.removesuffix(".weight")
        if name.endswith(".weight") and w.ndim == 2 and "norm" not in name and w.shape[-1] % group_size == 0:
            wq, scales, biases = mx.quantize(w, group_size=group_size, bits=bits)
            dtype = getattr(mx, scales_dtype) if scales_dtype else w.dtype
            quantized[name] = wq
            quantized[f"{stem}.scales"] = scales.astype(dtype)
            quantized[f"{stem}.biases"] = biases.astype(dtype)
        else:
            quantized[name] = w
    mx.save_safetensors(str(out / "model.safetensors"), quantized, metadata={"format": "mlx"})
    for f in src.iterdir():
        if f.is_file() and not f.name.startswith("model") and f.name != "config.json":
            shutil.copyfile(f, out / f.name)
    config = json.loads((src / "config.json").read_text(encoding="utf-8"))
    config["quantization"] = {"group_size": group_size, "bits": bits, "mode": "affine"}
    config["quantization_config"] = dict(config["quantization"])
    _write_json(out / "config.json", config)
    return out
