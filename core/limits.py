"""The settings' limits and budgets, each written once. Config validation (core.user.config), the per-turn
settings (core.settings), the engine, the CLI, the TUI and the fake engine all read them from here."""

from __future__ import annotations

from typing import Any

# Block size K: tokens the target verifies per round (K - 1 drafts + 1), or "auto" (tuned per round).
MIN_BLOCK_SIZE = 1
MAX_BLOCK_SIZE = 16
BLOCK_SIZE_RANGE = f"{MIN_BLOCK_SIZE}..{MAX_BLOCK_SIZE}"  # as messages and help texts write it

# Soft tokens per image the vision encoder may use (the image processor's supported budgets).
IMAGE_BUDGETS: tuple[int, ...] = (70, 140, 280, 560, 1120)
DEFAULT_IMAGE_BUDGET = 280
IMAGE_BUDGETS_TEXT = ", ".join(map(str, IMAGE_BUDGETS))  # "70, 140, 280, 560, 1120"


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
