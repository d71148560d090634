"""Per-turn generation settings, shared by the CLI, the TUI and the engine.

The checks of the sampling values live here, once: the config file (core.user.config), the command line
(`generate`), the TUI's parameter forms and the engine all call them, so a value one of them accepts
can never fail in another (a NaN temperature, a negative seed).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from core.limits import BLOCK_SIZE_RANGE, GREEDY_TEMPERATURE, IMAGE_BUDGETS, IMAGE_BUDGETS_TEXT, is_block_size, is_int

SEED_MAX = 2**64 - 1  # MLX's PRNG key is a uint64


class BadValue(ValueError):
    """A setting's value is out of range; `why` says what is allowed ("must be a number >= 0")."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


def _is_finite_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def check_temperature(v: Any) -> float:
    """A finite number >= 0; below GREEDY_TEMPERATURE it is 0 (greedy)."""
    if not _is_finite_number(v) or v < 0:
        raise BadValue("must be a finite number >= 0")
    return float(v) if v >= GREEDY_TEMPERATURE else 0.0


def check_top_p(v: Any) -> float:
    if not _is_finite_number(v) or not 0 < v <= 1:
        raise BadValue("must be a number > 0 and <= 1")
    return float(v)


def check_top_k(v: Any) -> int:
    if not is_int(v) or v < 0:
        raise BadValue("must be an integer >= 0 (0 turns top-k off)")
    return v


def check_max_tokens(v: Any) -> int:
    if not is_int(v) or v < 1:
        raise BadValue("must be an integer >= 1")
    return v


def check_seed(v: Any) -> int:
    if not is_int(v) or not 0 <= v <= SEED_MAX:
        raise BadValue("must be an integer from 0 to 2**64-1 (leave it out for a random seed)")
    return v


def check_block_size(v: Any) -> int | str:
    if is_block_size(v):
        return v
    raise BadValue(f'must be an integer {BLOCK_SIZE_RANGE} or "auto"')


def check_image_budget(v: Any) -> int:
    if not is_int(v) or v not in IMAGE_BUDGETS:
        raise BadValue(f"must be one of {IMAGE_BUDGETS_TEXT}")
    return v


# how messages name a field where its Python name reads badly
FIELD_LABELS = {"image_budget": "image budget"}

# the sampling fields, as the config's [sampling] table and the TUI's forms name them
SAMPLING_CHECKS: dict[str, Callable[[Any], Any]] = {
    "temperature": check_temperature,
    "top_p": check_top_p,
    "top_k": check_top_k,
    "max_tokens": check_max_tokens,
    "seed": check_seed,
}


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
    # the target's logprob of each emitted token (TokenEvent.logprob) with this many alternatives; None: off
    logprobs: int | None = None
    # with tools declared: None, the model decides (OpenAI "auto"); "*", the reply starts with a call to one
    # of them ("required"); a tool's name, a call to that one (core.decode.forced)
    tool_choice: str | None = None

    def __post_init__(self) -> None:
        # one rule wherever settings are made (command line, config, forms, server, the engine's copy)
        if _is_finite_number(self.temperature) and 0 < self.temperature < GREEDY_TEMPERATURE:
            self.temperature = 0.0

    def validate(self) -> None:
        """Raise BadValue (a ValueError) naming the first bad field: "temperature must be ..., got nan"."""
        checks = {**SAMPLING_CHECKS, "block_size": check_block_size, "image_budget": check_image_budget}
        for name, check in checks.items():
            value = getattr(self, name)
            if value is None and name in ("seed", "image_budget"):
                continue
            try:
                check(value)
            except BadValue as bad:
                raise BadValue(f"{FIELD_LABELS.get(name, name)} {bad.why}, got {value!r}") from None
