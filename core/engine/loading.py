"""One checkpoint-loading path: a PairingSpec -> target, drafter, vision tower, tokenizer and stop ids.

The engine (`core.engine.local.Engine._load`) and `gemma-chat bench` both load through
`load_pairing`, so a pairing benchmarks exactly as it chats: the same checkpoint resolution (local
directories or repo ids already in the HF cache), the same dtype rule (the drafter follows the
target's dtype unless one is forced), the same pair check and drafter conventions, the same stop ids.
Errors are `core.model.loader.CheckpointError` (a ValueError) or OSError/KeyError from a damaged
file; callers turn them into their own messages. mlx is imported only when called.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.engine.contract import PairingSpec

if TYPE_CHECKING:
    from core.model.drafter import Drafter
    from core.model.target import Target
    from core.model.unified import UnifiedVisionEncoder
    from core.model.vision import VisionEncoder

# progress(stage, fraction, message): stage is "target" | "drafter" | "vision" | "tokenizer"
Progress = Callable[[str, float, str], None]


@dataclass
class LoadedPairing:
    target_dir: Path
    drafter_dir: Path | None
    target: Target
    drafter: Drafter | None
    vision: VisionEncoder | UnifiedVisionEncoder | None
    vision_error: str | None  # why the tower is missing when one was asked for (text chat still works)
    tokenizer: Any  # mlx-lm's TokenizerWrapper (untyped)
    stop_ids: set[int]


def load_pairing(spec: PairingSpec, progress: Progress | None = None, *, vision: bool = True) -> LoadedPairing:
    """Load everything `spec` names (`vision=False`: no vision tower, as the bench needs none)."""
    import mlx.core as mx

    from core.decode import prompt as prompt_mod
    from core.model.drafter import check_pair, load_drafter
    from core.model.loader import load_tokenizer, resolve_checkpoint
    from core.model.target import load_target

    say = progress or (lambda stage, fraction, message: None)
    target_dir = resolve_checkpoint(spec.target)
    drafter_dir = resolve_checkpoint(spec.drafter) if spec.drafter else None
    say("target", 0.0, f"loading {target_dir.name}")
    target = load_target(target_dir, spec.dtype)
    say("target", 1.0, "")
    drafter = None
    if drafter_dir is not None:
        say("drafter", 0.0, f"loading {drafter_dir.name}")
        drafter = load_drafter(drafter_dir, spec.dtype or dtype_name(target.dtype))
        check_pair(target, drafter)
        drafter.configure(query_position=spec.drafter_position, sliding_keys=spec.drafter_window)
        say("drafter", 1.0, "")
    tower, vision_error = None, None
    if vision:
        say("vision", 0.0, "")
        try:
            from core.model.encoders import load_vision

            tower = load_vision(target_dir, getattr(mx, spec.dtype) if spec.dtype else None)
        except Exception as e:  # text chat still works without the tower
            vision_error = str(e)
        say("vision", 1.0, f"no vision: {vision_error}" if vision_error else "")
    say("tokenizer", 0.0, "")
    tokenizer = load_tokenizer(target_dir)
    stops = prompt_mod.stop_ids(target_dir, tokenizer)
    say("tokenizer", 1.0, "")
    return LoadedPairing(target_dir, drafter_dir, target, drafter, tower, vision_error, tokenizer, set(stops))


def dtype_name(dtype: object) -> str:
    """'float32' for mx.float32."""
    return str(dtype).rsplit(".", 1)[-1]
