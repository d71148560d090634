"""Checkpoint directory -> target model, tokenizer and stop ids.

The target is built by mlx-lm's Gemma 4 classes and loader (`mlx_lm.utils.load_model`), which
already understands both weight layouts (HF `model.language_model.*` and mlx-community
`language_model.model.*`), drops the vision and shared-layer K/V weights, and applies a
`.scales`-driven quantization. Vision weights are the vision helper's business.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import mlx.core as mx

from core import modeltypes


class CheckpointError(ValueError):
    """A checkpoint directory that cannot be used (missing files, wrong model type, bad pair)."""


def resolve_checkpoint(path_or_repo: str, cache_dir: str | Path | None = None) -> Path:
    """A local directory as-is; a Hugging Face repo id only if it is already in the local cache
    (`cache_dir`, default the shared HF cache). Never touches the network."""
    p = Path(path_or_repo).expanduser()
    if p.is_dir():
        return p.resolve()
    if p.exists():
        raise CheckpointError(f"{path_or_repo} is a file, not a checkpoint directory")
    from core.hub.download import looks_like_repo_id

    if not looks_like_repo_id(path_or_repo):
        raise CheckpointError(
            f"no such checkpoint directory: {path_or_repo} (and not a Hugging Face repo id, owner/name)"
        )
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(path_or_repo, local_files_only=True, cache_dir=cache_dir))
    except LocalEntryNotFoundError:
        raise CheckpointError(
            f"{path_or_repo} is not downloaded: it is not in the local Hugging Face cache "
            f"(run `gemma-chat models download {path_or_repo}` first)"
        ) from None
    except Exception as e:  # a malformed id, a broken cache
        raise CheckpointError(f"{path_or_repo}: {e}") from None


def read_json(path: Path) -> dict:
    """A JSON object file; {} when the file is missing. A file that is there but unreadable, not
    JSON or not an object is a CheckpointError that says so."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as e:
        raise CheckpointError(f"cannot read {path}: {e}") from None
    except ValueError as e:
        raise CheckpointError(f"{path} is not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} must hold a JSON object, got {type(data).__name__}")
    return data


def read_config(path: Path) -> dict:
    """A checkpoint's config.json: missing and empty are different faults, and each says which."""
    file = path / "config.json"
    if not file.is_file():
        raise CheckpointError(f"{path} has no config.json")
    config = read_json(file)
    if not config:
        raise CheckpointError(f"{file} is empty ({{}}): it must describe the model (model_type, text_config, ...)")
    return config


def weights_error(path: Path, error: Exception) -> CheckpointError:
    """A safetensors file that cannot be read (truncated, corrupt, a header that lies about its data)."""
    return CheckpointError(
        f"{path}: its weights cannot be read, a .safetensors file is truncated or corrupt ({error}); "
        "download the checkpoint again (or delete it)"
    )


def check_finite(path: Path, params) -> None:
    """Refuse weights holding NaN or inf: the model would emit one token (id 0) forever."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    leaves: list[tuple[str, mx.array]] = tree_flatten(params)  # type: ignore[assignment]  # (name, array) pairs
    floats = [(n, v) for n, v in leaves if mx.issubdtype(v.dtype, mx.floating)]
    if not floats:
        return
    # one reduction over everything (a memory pass, small next to reading the files), then find the culprit
    finite = mx.stack([mx.all(mx.isfinite(v)) for _, v in floats])
    if mx.all(finite).item():
        return
    flags: list = finite.tolist()  # type: ignore[assignment]  # one bool per array
    name = next(n for (n, _), ok in zip(floats, flags) if not ok)
    raise CheckpointError(f"{path}: weight {name} holds NaN or infinite values; the checkpoint is corrupt")


def load_safetensors(path: str | Path) -> dict[str, mx.array]:
    """Every tensor of one .safetensors file, by name (lazy: nothing is read until used)."""
    import mlx.core as mx

    return mx.load(str(path))  # type: ignore[return-value]  # a dict for .safetensors files


def load_tokenizer(path: Path):
    """mlx-lm's TokenizerWrapper around the checkpoint's Hugging Face tokenizer (chat template included).

    `path` must be a local directory (mlx-lm would otherwise try to download it)."""
    from mlx_lm.utils import load_tokenizer as mlx_load_tokenizer

    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"no such checkpoint directory: {path}")
    if not (path / "tokenizer.json").is_file():
        # without it transformers falls back to a tiny stand-in tokenizer that decodes to nothing useful
        raise CheckpointError(f"{path} has no tokenizer.json: copy it from the model's original repository")
    return mlx_load_tokenizer(path)


@dataclass
class LoadedTarget:
    path: Path
    config: dict
    model: Any  # mlx-lm gemma4.Model or gemma4_text.Model (nn.Module: its attributes are untyped)


def load_target_model(path: Path, dtype: str | None = None) -> LoadedTarget:
    import mlx.core as mx
    from mlx_lm.utils import load_model

    config = read_config(path)
    model_type = config.get("model_type")
    if modeltypes.is_drafter(model_type):
        raise CheckpointError(f"{path} is a {model_type} drafter, not a target model")
    if not modeltypes.is_target(model_type):
        raise CheckpointError(
            f"{path}: model_type {model_type!r} is not Gemma 4 ({', '.join(modeltypes.TARGET_TYPES)})"
        )
    overrides = None
    if modeltypes.architecture(model_type) == modeltypes.UNIFIED:
        overrides = unified_model_config(path, config)
    if not list(path.glob("model*.safetensors")):
        raise CheckpointError(f"{path} has no model*.safetensors weights")
    try:
        model, config = load_model(path, lazy=True, model_config=overrides)
    except RuntimeError as e:  # mx.load of a truncated or corrupt file
        raise weights_error(path, e) from None
    config["model_type"] = model_type  # the checkpoint's own, whatever mlx-lm was told
    if dtype is not None:
        model.set_dtype(getattr(mx, dtype))
    _cpu_safe_experts(model)
    try:
        mx.eval(model.parameters())
    except RuntimeError as e:  # lazy loading reads the data only now
        raise weights_error(path, e) from None
    check_finite(path, model.parameters())
    return LoadedTarget(path=path, config=config, model=model)


# The 12B text model is the Gemma 4 decoder without the E2B/E4B extras and without MoE. mlx-lm maps
# `gemma4_unified` to its `gemma4` model (text only), whose defaults for these keys are E2B's.
UNIFIED_TEXT_LAYOUT = {
    "hidden_size_per_layer_input": 0,  # no per-layer embeddings
    "num_kv_shared_layers": 0,  # every layer computes its own K/V
    "enable_moe_block": False,
    "use_double_wide_mlp": False,
}


def unified_model_config(path: Path, config: dict) -> dict:
    """Overrides that make mlx-lm's `gemma4` model the 12B's text model: an absent layout key gets the
    unified value (HF's default), a present contrary one is refused; a missing top-level vocab_size
    is taken from text_config (mlx-lm would otherwise impose 262144)."""
    flat = "text_config" not in config  # a text-only `gemma4_unified_text` checkpoint
    text = dict(config if flat else config["text_config"] or {})
    wrong = [f"{k}={text[k]!r}" for k, v in UNIFIED_TEXT_LAYOUT.items() if k in text and text[k] != v]
    if wrong:
        raise CheckpointError(
            f"{path}: a gemma4_unified text model has no per-layer inputs, KV sharing, MoE or double-wide "
            f"MLP, but this config sets {', '.join(wrong)}"
        )
    fill = {k: v for k, v in UNIFIED_TEXT_LAYOUT.items() if k not in text}
    if flat:  # mlx-lm knows this layout by the name of its Gemma 4 text model
        return {**fill, "model_type": "gemma4_text"}
    out = {"text_config": {**text, **fill}}
    if "vocab_size" not in config and "vocab_size" in text:
        out["vocab_size"] = text["vocab_size"]
    return out


def _cpu_safe_experts(model) -> None:
    """MLX's CPU backend runs the MoE expert matmul (GatherMM) only in float32: a bf16/f16 26B-A4B
    would fail on its first token. Upcast just the (unquantized) expert weights there; Metal keeps
    the checkpoint's dtype. Quantized experts use another kernel and work as they are."""
    import mlx.core as mx
    from mlx.utils import tree_flatten, tree_unflatten

    if mx.default_device() != mx.cpu:
        return
    params: list[tuple[str, mx.array]] = tree_flatten(model.parameters())  # type: ignore[assignment]  # a list without `destination`
    names = {k for k, _ in params}
    upcast = [
        (k, v.astype(mx.float32))
        for k, v in params
        if ".switch_glu." in k
        and k.endswith(".weight")
        and v.dtype in (mx.bfloat16, mx.float16)
        and k[: -len("weight")] + "scales" not in names
    ]
    if upcast:
        model.update(tree_unflatten(upcast))
