"""Checkpoint directory -> target model, tokenizer and stop ids.

The target is built by mlx-lm's Gemma 4 classes and loader (`mlx_lm.utils.load_model`), which
already understands both weight layouts (HF `model.language_model.*` and mlx-community
`language_model.model.*`), drops the vision and shared-layer K/V weights, and applies a
`.scales`-driven quantization. Vision weights are the vision helper's business.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
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


# -- reading a checkpoint's files ----------------------------------------------------------------------
# Every reader of a checkpoint folder (this module, the drafter, the vision and unified encoders, the
# image processor's settings, the prompt's special ids and template) opens its files through
# `checkpoint_file`: a FIFO would block the reader forever (and a server's every later request with it),
# /dev/zero never ends, and a weight index naming "../x.safetensors" would read outside the folder.

CONFIG_MAX_BYTES = 64 << 20  # a JSON or template file of a checkpoint (tokenizer.json is mlx-lm's to read)
# the files something opens by name: ours, mlx-lm's (config, generation config, weights) and the tokenizer's
CHECKPOINT_SUFFIXES = (".json", ".jinja", ".safetensors", ".model", ".txt", ".tiktoken")


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a folder"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a file"


def checkpoint_file(model_dir: str | Path, name: str) -> Path | None:
    """`name` in the checkpoint folder if it is there, None if not. A name that leaves the folder
    (absolute, `..`) or an entry that is not a regular file once links are followed (a FIFO, a device,
    a folder, a broken link) is a CheckpointError that says so."""
    rel = PurePosixPath(name)
    if not name or rel.is_absolute() or ".." in rel.parts or "\\" in name:
        raise CheckpointError(f"{model_dir}: the file name {name!r} points outside the checkpoint folder")
    path = Path(model_dir) / rel
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        if path.is_symlink():
            raise CheckpointError(f"{path} is a broken link: the checkpoint is incomplete") from None
        return None
    except OSError as e:
        raise CheckpointError(f"cannot read {path}: {e.strerror or e}") from None
    if not stat.S_ISREG(mode):
        raise CheckpointError(f"{path} is {_kind(mode)}, not a regular file: the checkpoint is damaged")
    return path


def read_checkpoint_bytes(path: Path, limit: int = CONFIG_MAX_BYTES) -> bytes:
    """A checkpoint file's bytes, at most `limit`. Opened without blocking and checked again on the open
    descriptor: a file swapped for a FIFO after `checkpoint_file` looked at it cannot hang the read."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise CheckpointError(f"cannot read {path}: {e.strerror or e}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):  # before fdopen, which refuses a folder with its own error
        os.close(fd)
        raise CheckpointError(f"{path} is {_kind(mode)}, not a regular file: the checkpoint is damaged")
    with os.fdopen(fd, "rb") as f:
        try:
            data = f.read(limit + 1)
        except OSError as e:
            raise CheckpointError(f"cannot read {path}: {e.strerror or e}") from None
    if len(data) > limit:
        raise CheckpointError(f"{path} is larger than {limit >> 20} MiB: not a configuration file")
    return data


def read_checkpoint_text(model_dir: str | Path, name: str) -> str | None:
    """A text file of the checkpoint (e.g. chat_template.jinja), None when absent."""
    path = checkpoint_file(model_dir, name)
    if path is None:
        return None
    try:
        return read_checkpoint_bytes(path).decode("utf-8")
    except UnicodeDecodeError as e:
        raise CheckpointError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start})") from None


def read_checkpoint_json(model_dir: str | Path, name: str) -> dict:
    """A JSON object file of the checkpoint; {} when absent. Unreadable, not JSON, nested too deeply
    or not an object: a CheckpointError that says which."""
    path = checkpoint_file(model_dir, name)
    if path is None:
        return {}
    text = read_checkpoint_text(model_dir, name) or ""
    try:
        data = json.loads(text)
    except RecursionError:
        raise CheckpointError(f"{path} nests arrays or objects too deeply to be a configuration") from None
    except ValueError as e:
        raise CheckpointError(f"{path} is not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} must hold a JSON object, got {type(data).__name__}")
    return data


def read_json(path: Path) -> dict:
    """A JSON object file; {} when the file is missing (read_checkpoint_json on its folder)."""
    return read_checkpoint_json(path.parent, path.name)


def check_checkpoint_files(model_dir: Path) -> None:
    """Every file of the folder that something opens by name is a regular file. Checked at load, before
    mlx-lm and the tokenizer read any of them: transformers treats a FIFO tokenizer_config.json as absent
    (a silently different prompt), and mlx-lm would block on a FIFO generation_config.json or weights."""
    try:
        names = sorted(e.name for e in os.scandir(model_dir) if e.name.endswith(CHECKPOINT_SUFFIXES))
    except OSError as e:
        raise CheckpointError(f"cannot list {model_dir}: {e.strerror or e}") from None
    for name in names:
        checkpoint_file(model_dir, name)


def weight_files(model_dir: Path, pattern: str = "model*.safetensors") -> list[Path]:
    """The checkpoint's weight files (each a regular file in the folder)."""
    files = [checkpoint_file(model_dir, p.name) for p in sorted(model_dir.glob(pattern))]
    return [f for f in files if f is not None]


def weight_index(model_dir: Path) -> dict[str, Path] | None:
    """model.safetensors.index.json's map from tensor name to its file, every file checked to be a
    regular file inside the folder; None without an index."""
    index = read_checkpoint_json(model_dir, "model.safetensors.index.json")
    if not index:
        return None
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
        raise CheckpointError(f"{model_dir}/model.safetensors.index.json has no weight_map of file names")
    files: dict[str, Path] = {}
    for name in set(weight_map.values()):
        path = checkpoint_file(model_dir, name)
        if path is None:
            raise CheckpointError(f"{model_dir}: the weight index names {name}, which is not in the folder")
        files[name] = path
    return {tensor: files[name] for tensor, name in weight_map.items()}


def read_config(path: Path) -> dict:
    """A checkpoint's config.json: missing and empty are different faults, and each says which."""
    file = checkpoint_file(path, "config.json")
    if file is None:
        raise CheckpointError(f"{path} has no config.json")
    config = read_checkpoint_json(path, "config.json")
    if not config:
        raise CheckpointError(f"{file} is empty ({{}}): it must describe the model (model_type, text_config, ...)")
    return config


# -- a config's numbers, before anything is built from them ------------------------------------------
# Each a positive integer up to a bound far past any real Gemma 4 (31B: hidden 5376, 60 layers, vocab
# 262144, context 262144): a zero divides, a billion layers are a billion Python objects before the
# first weight is read.
TEXT_CONFIG_BOUNDS = {
    "hidden_size": (1, 1 << 16),
    "num_hidden_layers": (1, 1024),
    "num_attention_heads": (1, 1024),
    "num_key_value_heads": (1, 1024),
    "num_global_key_value_heads": (1, 1024),
    "head_dim": (1, 8192),
    "global_head_dim": (1, 8192),
    "intermediate_size": (1, 1 << 20),
    "moe_intermediate_size": (0, 1 << 20),
    "vocab_size": (1, 1 << 22),
    "vocab_size_per_layer_input": (0, 1 << 22),  # 0: none (drafters)
    "sliding_window": (1, 1 << 24),
    "max_position_embeddings": (1, 1 << 24),
    "hidden_size_per_layer_input": (0, 1 << 16),
    "num_kv_shared_layers": (0, 1024),
    "num_experts": (0, 1 << 12),
    "top_k_experts": (0, 1 << 12),
}
LAYER_TYPES = ("sliding_attention", "full_attention")


def text_config_of(file: Path | str, config: dict, *, drafter: bool = False) -> dict:
    """The config's text model section (`text_config`, or the config itself when flat), checked: one
    sentence naming the first field that no model can be built from. (A drafter's layers all read the
    target's K/V; a target needs one layer of its own.)"""
    text = config.get("text_config", config) if "text_config" in config else config
    if not isinstance(text, dict):
        raise CheckpointError(f"{file}: text_config must be an object, got {json.dumps(text)[:40]}")
    for key, (low, high) in TEXT_CONFIG_BOUNDS.items():
        value = text.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            shown = json.dumps(value)[:40] if not isinstance(value, int) else str(value)[:40]
            raise CheckpointError(f"{file}: text_config.{key} must be an integer from {low} to {high}, got {shown}")
    heads, kv_heads = text.get("num_attention_heads"), text.get("num_key_value_heads")
    if heads and kv_heads and heads % kv_heads:
        raise CheckpointError(f"{file}: num_attention_heads ({heads}) must be a multiple of num_key_value_heads")
    layers, types = text.get("num_hidden_layers"), text.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or not all(t in LAYER_TYPES for t in types):
            raise CheckpointError(f"{file}: text_config.layer_types must list {' or '.join(LAYER_TYPES)} per layer")
        if layers is not None and len(types) != layers:
            raise CheckpointError(f"{file}: text_config.layer_types has {len(types)} entries for {layers} layers")
    shared = text.get("num_kv_shared_layers")
    if shared and layers is not None and shared >= layers + drafter:
        most = "at most" if drafter else "below"
        raise CheckpointError(f"{file}: num_kv_shared_layers ({shared}) must be {most} num_hidden_layers ({layers})")
    return text


def weights_error(path: Path, error: Exception) -> CheckpointError:
    """A safetensors file that cannot be read (truncated, corrupt, a header that lies about its data)."""
    return CheckpointError(
        f"{path}: its weights cannot be read, a .safetensors file is truncated or corrupt ({error}); "
        "download the checkpoint again (or delete it)"
    )


def check_finite(path: Path, params: Any) -> None:
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


def load_tokenizer(path: Path) -> Any:
    """mlx-lm's TokenizerWrapper around the checkpoint's Hugging Face tokenizer (chat template included).

    `path` must be a local directory (mlx-lm would otherwise try to download it)."""
    from mlx_lm.utils import load_tokenizer as mlx_load_tokenizer

    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"no such checkpoint directory: {path}")
    check_checkpoint_files(path)
    if checkpoint_file(path, "tokenizer.json") is None:
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

    check_checkpoint_files(path)
    config = read_config(path)
    model_type = config.get("model_type")
    if modeltypes.is_drafter(model_type):
        raise CheckpointError(f"{path} is a {model_type} drafter, not a target model")
    if not modeltypes.is_target(model_type):
        raise CheckpointError(
            f"{path}: model_type {model_type!r} is not Gemma 4 ({', '.join(modeltypes.TARGET_TYPES)})"
        )
    text_config_of(path / "config.json", config)
    overrides = None
    if modeltypes.architecture(model_type) == modeltypes.UNIFIED:
        overrides = unified_model_config(path, config)
    if not weight_files(path):
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


def _cpu_safe_experts(model: Any) -> None:
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
