"""The settings' limits and budgets, each written once. Config validation (core.user.config), the per-turn
settings (core.settings), the engine, the CLI, the TUI and the fake engine all read them from here."""

from __future__ import annotations

from typing import Any

# Block size K: tokens the target verifies per round (K - 1 drafts + 1), or "auto" (tuned per round).
MIN_BLOCK_SIZE = 1
MAX_BLOCK_SIZE = 16
BLOCK_SIZE_RANGE = f"{MIN_BLOCK_SIZE}..{MAX_BLOCK_SIZE}"  # as messages and help texts write it

# Temperatures above 0 but below this are greedy, as in vLLM: 1/T of a smaller one overflows in float32
# (1e-39: every logit becomes inf and every token <bos>), and long before that sampling is argmax anyway.
GREEDY_TEMPERATURE = 1e-5

# Soft tokens per image the vision encoder may use (the image processor's supported budgets).
IMAGE_BUDGETS: tuple[int, ...] = (70, 140, 280, 560, 1120)
DEFAULT_IMAGE_BUDGET = 280
IMAGE_BUDGETS_TEXT = ", ".join(map(str, IMAGE_BUDGETS))  # "70, 140, 280, 560, 1120"
# Images in one prompt: far more than a chat needs, and what bounds the memory a request can ask for
# before its context is checked (each image's patches are a buffer of its budget).
MAX_IMAGES_PER_PROMPT = 32

# Audio clips (core.model.audio_input). E2B/E4B hear at most 30 s per clip (750 soft tokens); the 12B's
# embedder has no limit of its own (one token per 40 ms), so one is set here. Longer clips are cut.
AUDIO_CLIP_SECONDS = 30.0
MAX_UNIFIED_AUDIO_SECONDS = 300.0  # 7,500 soft tokens
# Checked before a file is opened. Only the part a model hears is read, so this bounds a stray file's
# cost, not a clip's: an hour of 48 kHz stereo 24-bit WAV is about 1 GB.
MAX_AUDIO_FILE_BYTES = 2 << 30
# The file names the app takes as audio clips (what libsndfile decodes: WAV, FLAC, OGG/Vorbis and Opus,
# MP3, AIFF); the chat's picker and pastes, and the history telling a clip from an image, go by them.
AUDIO_SUFFIXES = (".wav", ".wave", ".flac", ".ogg", ".oga", ".opus", ".mp3", ".aif", ".aiff")
# Audio clips in one request to `serve`: each is decoded and encoded whole before the prompt is checked.
MAX_AUDIO_PER_PROMPT = 16


def context_error(prompt_tokens: int, context_length: int) -> str | None:
    """Why a prompt cannot be generated from (it leaves no room for one token), or None."""
    if prompt_tokens >= context_length:
        return (
            f"the prompt is {prompt_tokens} tokens, the model's context is {context_length}: shorten the conversation"
        )
    return None


def is_int(value: Any) -> bool:
    """An integer that is not a bool (TOML and JSON booleans are not numbers here)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_block_size(value: Any) -> bool:
    """An integer K in MIN_BLOCK_SIZE..MAX_BLOCK_SIZE, or "auto"."""
    return value == "auto" or (is_int(value) and MIN_BLOCK_SIZE <= value <= MAX_BLOCK_SIZE)
