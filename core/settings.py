"""Per-turn generation settings, shared by the CLI, the TUI and the engine."""

from __future__ import annotations

from dataclasses import dataclass

from core.limits import BLOCK_SIZE_RANGE, IMAGE_BUDGETS, IMAGE_BUDGETS_TEXT, is_block_size


@dataclass
class GenerationSettings:
    max_tokens: int = 512
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    seed: int | None = None
    block_size: int | str = "auto"  # K = drafts + 1, or "auto"
    drafter_enabled: bool = True
    ignore_eos: bool = False
    thinking: bool = False
    system_prompt: str | None = None
    image_budget: int | None = None  # soft tokens per image (core.limits.IMAGE_BUDGETS); None: the checkpoint's

    def validate(self) -> None:
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")
        if self.top_k < 0:
            raise ValueError("top_k must be >= 0")
        if not is_block_size(self.block_size):
            raise ValueError(f"block_size must be {BLOCK_SIZE_RANGE} or 'auto'")
        if self.image_budget is not None and self.image_budget not in IMAGE_BUDGETS:
            raise ValueError(f"image budget must be one of {IMAGE_BUDGETS_TEXT} (got {self.image_budget!r})")
