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
    if path_or_repo.count("/") != 1 or path_or_repo.startswith((".", "/", "~")):
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
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return {}


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
    return mlx_load_tokenizer(path)


@dataclass
class LoadedTarget:
    path: Path
    config: dict
    model: Any  # mlx-lm gemma4.Model or gemma4_text.Model (nn.Module: its attributes are untyped)


def load_target_model(path: Path, dtype: str | None = None) -> LoadedTarget:
    import mlx.core as mx
    from mlx_lm.utils import load_model

    config = read_json(path / "config.json")
    if not config:
        raise CheckpointError(f"{path} has no config.json")
    model_type = config.get("model_type")
    if model_type == "gemma4_assistant":
        raise CheckpointError(f"{path} is a gemma4_assistant drafter, not a target model")
    if model_type not in ("gemma4", "gemma4_text"):
        raise CheckpointError(f"{path}: model_type {model_type!r} is not Gemma 4 (gemma4 / gemma4_text)")
    if not list(path.glob("model*.safetensors")):
        raise CheckpointError(f"{path} has no model*.safetensors weights")
    model, config = load_model(path, lazy=True)
    if dtype is not None:
        model.set_dtype(getattr(mx, dtype))
    _cpu_safe_experts(model)
    mx.eval(model.parameters())
    return LoadedTarget(path=path, config=config, model=model)


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
