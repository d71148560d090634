"""The encoders a target checkpoint brings besides its language model, chosen by its model type:
the Gemma 4 vision tower (E2B/E4B, 26B, 31B) or the 12B's encoder-free patch embedder; the E2B/E4B
audio tower or the 12B's audio embedder (core.model.audio; 26B and 31B take no audio)."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx

from core.model.audio import AudioEncoder, UnifiedAudioEncoder
from core.model.audio import load_audio as _load_audio
from core.model.loader import read_checkpoint_json
from core.model.unified import UnifiedVisionEncoder, load_unified_vision
from core.model.vision import VisionEncoder, load_vision_tower


def load_vision(model_dir: str | Path, dtype: mx.Dtype | None = None) -> VisionEncoder | UnifiedVisionEncoder | None:
    """The image encoder of a checkpoint directory, or None if it takes no images.

    `dtype` casts the float weights (e.g. mx.float32 for parity checks); None keeps the
    checkpoint's dtype. mx.load is lazy, so only the vision tensors of a shard are read.
    """
    model_dir = Path(model_dir)
    config = read_checkpoint_json(model_dir, "config.json")
    if not config.get("vision_config"):
        return None
    if config.get("model_type") == "gemma4_unified":  # the 12B: no tower, an encoder-free embedder
        return load_unified_vision(model_dir, dtype)
    return load_vision_tower(model_dir, dtype)


def load_audio(model_dir: str | Path, dtype: mx.Dtype | None = None) -> AudioEncoder | UnifiedAudioEncoder | None:
    """The audio encoder of a checkpoint directory (the tower or the 12B's embedder, by its
    audio_config), or None if it takes no audio."""
    return _load_audio(model_dir, dtype)
