"""Will a pairing fit in this machine's memory? Estimates from config numbers, no model loaded.

needed = weights (target + drafter, as stored) + K/V cache at a context length + overhead

K/V cache, per layer that computes its own K/V (the first `num_hidden_layers - num_kv_shared_layers`):
  sliding layer:  min(context, window) x kv_heads x head_dim x 2 (K and V) x 2 bytes (bf16)
  full layer:     context x kv_heads' x global_head_dim x 2 x 2 bytes
where kv_heads' is `num_global_key_value_heads` for full layers with `attention_k_eq_v` (26B/31B)
and `num_key_value_heads` otherwise. K/V-shared layers (E2B/E4B) store nothing. The drafter has no
cache. Overhead covers activations, logits rows and the allocator: 0.5 GB + 5 % of the weights.

Budget: Linux -> physical RAM (MLX's CPU backend). macOS -> the GPU working-set limit:
`iogpu.wired_limit_mb` when someone set it, else Metal's default of about 3/4 of RAM.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass

StrPath = str | os.PathLike[str]

KV_DTYPE_BYTES = 2
DEFAULT_CONTEXT = 8192


# -- architecture helpers (work on a text_config dict) ---------------------------------------------


def layer_types(text_cfg: dict) -> list[str]:
    types = text_cfg.get("layer_types")
    if types:
        return list(types)
    n = int(text_cfg["num_hidden_layers"])
    full = set(text_cfg.get("full_attention_layers") or [])
    if not full:  # mlx-lm's fallback: a repeating pattern ending in a full layer
        period = int(text_cfg.get("sliding_window_pattern") or 5)
        full = {i for i in range(n) if i % period == period - 1}
    return ["full_attention" if i in full else "sliding_attention" for i in range(n)]


def kv_layers(text_cfg: dict) -> int:
    """How many leading layers compute (and cache) their own K/V."""
    n = int(text_cfg["num_hidden_layers"])
    return n - int(text_cfg.get("num_kv_shared_layers") or 0)


def kv_shape(text_cfg: dict, layer_type: str) -> tuple[int, int]:
    """(kv_heads, head_dim) of a layer of this type, as the target's attention builds it."""
    kv_heads = int(text_cfg["num_key_value_heads"])
    head_dim = int(text_cfg["head_dim"])
    if layer_type == "full_attention":
        head_dim = int(text_cfg.get("global_head_dim") or head_dim)
        global_kv = text_cfg.get("num_global_key_value_heads")
        if text_cfg.get("attention_k_eq_v") and global_kv:
            kv_heads = int(global_kv)
    return kv_heads, head_dim


def producer_layers(text_cfg: dict) -> dict[str, int]:
    """Layer type -> index of the last layer of that type that computes its own K/V.

    These are the layers whose cache the drafter reads (E2B 13/14, E4B 22/23, 26B 28/29, 31B 58/59).
    """
    types = layer_types(text_cfg)[: kv_layers(text_cfg)]
    return {t: max(i for i, u in enumerate(types) if u == t) for t in set(types)}


def kv_cache_bytes(text_cfg: dict, context: int = DEFAULT_CONTEXT, dtype_bytes: int = KV_DTYPE_BYTES) -> int:
    window = int(text_cfg.get("sliding_window") or context)
    total = 0
    for t in layer_types(text_cfg)[: kv_layers(text_cfg)]:
        kv_heads, head_dim = kv_shape(text_cfg, t)
        tokens = min(context, window) if t == "sliding_attention" else context
        total += tokens * kv_heads * head_dim * 2 * dtype_bytes
    return total


# -- estimates and the machine ----------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryEstimate:
    weights_bytes: int
    kv_bytes: int
    overhead_bytes: int
    context: int

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.overhead_bytes


def estimate(weights_bytes: int, text_cfg: dict, context: int = DEFAULT_CONTEXT) -> MemoryEstimate:
    overhead = 500_000_000 + weights_bytes // 20
    return MemoryEstimate(int(weights_bytes), kv_cache_bytes(text_cfg, context), overhead, context)


@dataclass(frozen=True)
class MachineMemory:
    total_bytes: int | None  # physical RAM
    budget_bytes: int | None  # what a model may use
    note: str  # where the budget comes from
    wired_limit_mb: int | None = None  # macOS iogpu.wired_limit_mb, when readable


def _sysctl(name: str) -> str | None:
    try:
        out = subprocess.run(["sysctl", "-n", name], capture_output=True, text=True, timeout=2)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else None


def machine_memory() -> MachineMemory:
    if sys.platform == "darwin":
        raw = _sysctl("hw.memsize")
        total = int(raw) if raw and raw.isdigit() else None
        wired = _sysctl("iogpu.wired_limit_mb")
        wired_mb = int(wired) if wired and wired.isdigit() else None
        if wired_mb:
            return MachineMemory(
                total, wired_mb * 1024 * 1024, f"GPU wired limit iogpu.wired_limit_mb={wired_mb}", wired_mb
            )
        budget = int(total * 0.75) if total else None
        return MachineMemory(
            total,
            budget,
            "about 3/4 of RAM (Metal's default GPU working set; raise it with sysctl iogpu.wired_limit_mb)",
            wired_mb,
        )
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        total = None
    return MachineMemory(total, total, "physical RAM (MLX CPU backend)")


@dataclass(frozen=True)
class FitReport:
    level: str  # "ok" | "tight" | "wont_fit" | "unknown"
    needed_bytes: int
    budget_bytes: int | None
    message: str

    @property
    def warn(self) -> bool:
        return self.level in ("tight", "wont_fit")


# One wording for a fit level wherever a person reads it (CLI tables, the models screen, messages).
FIT_WORDS = {"ok": "ok", "tight": "tight", "wont_fit": "won't fit", "unknown": "unknown"}


def check_fit(needed_bytes: int, machine: MachineMemory | None = None) -> FitReport:
    """ok: needs <= 80 % of the budget; tight: <= 100 %; wont_fit: more."""
    machine = machine or machine_memory()
    budget = machine.budget_bytes
    need = f"{needed_bytes / 1e9:.1f} GB"
    if not budget:
        return FitReport("unknown", needed_bytes, None, f"needs about {need}; this machine's memory is unknown")
    have = f"{budget / 1e9:.1f} GB"
    if needed_bytes <= 0.8 * budget:
        return FitReport("ok", needed_bytes, budget, f"needs about {need} of {have} ({machine.note})")
    if needed_bytes <= budget:
        return FitReport(
            "tight",
            needed_bytes,
            budget,
            f"tight: needs about {need} of {have} ({machine.note}); close other apps or use a smaller pairing",
        )
    return FitReport(
        "wont_fit",
        needed_bytes,
        budget,
        f"won't fit: needs about {need} but only {have} is usable ({machine.note}); "
        "pick a smaller or quantized pairing",
    )


def estimate_checkpoints(
    target_dir: StrPath, drafter_dir: StrPath | None = None, context: int = DEFAULT_CONTEXT
) -> MemoryEstimate:
    """Memory estimate for local checkpoint directories (custom pairs): weights as stored on disk."""
    import json
    from pathlib import Path

    def weight_bytes(d: StrPath) -> int:
        return sum(p.stat().st_size for p in Path(d).glob("*.safetensors"))

    cfg = json.loads((Path(target_dir) / "config.json").read_text())
    weights = weight_bytes(target_dir) + (weight_bytes(drafter_dir) if drafter_dir else 0)
    return estimate(weights, cfg.get("text_config") or cfg, context)


def check_checkpoints(
    target_dir: StrPath,
    drafter_dir: StrPath | None = None,
    context: int = DEFAULT_CONTEXT,
    machine: MachineMemory | None = None,
) -> FitReport:
    """The fit warning to show before loading a custom pair."""
    return check_fit(estimate_checkpoints(target_dir, drafter_dir, context).total_bytes, machine)
