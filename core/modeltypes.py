"""The Gemma 4 `model_type` names and which architecture each belongs to. Pure data, no mlx.

Two architectures share the Gemma 4 text layers but not their checkpoints:
- "gemma4": E2B, E4B, 26B-A4B, 31B (`gemma4` / text-only `gemma4_text`; drafter `gemma4_assistant`);
- "gemma4_unified": 12B, encoder-free (`gemma4_unified` / `gemma4_unified_text`; drafter
  `gemma4_unified_assistant`, the same drafter code with its own checkpoint).
A drafter was distilled against one architecture's hidden states, so it drafts only for a target
of that architecture (core.hub.pairing refuses the cross pairs with a sentence that says so).
"""

from __future__ import annotations

GEMMA4 = "gemma4"
UNIFIED = "gemma4_unified"

TARGET_TYPES: dict[str, str] = {
    "gemma4": GEMMA4,
    "gemma4_text": GEMMA4,
    "gemma4_unified": UNIFIED,
    "gemma4_unified_text": UNIFIED,
}
DRAFTER_TYPES: dict[str, str] = {
    "gemma4_assistant": GEMMA4,
    "gemma4_unified_assistant": UNIFIED,
}
ALL_TYPES = (*TARGET_TYPES, *DRAFTER_TYPES)

# How each architecture is called in messages
LABELS = {GEMMA4: "Gemma 4 (E2B/E4B/26B-A4B/31B)", UNIFIED: "Gemma 4 12B unified"}


def is_target(model_type: str | None) -> bool:
    return model_type in TARGET_TYPES


def is_drafter(model_type: str | None) -> bool:
    return model_type in DRAFTER_TYPES


def architecture(model_type: str | None) -> str | None:
    """ "gemma4", "gemma4_unified" or None for any model type of a target or its drafter."""
    if model_type is None:
        return None
    return TARGET_TYPES.get(model_type) or DRAFTER_TYPES.get(model_type)


def drafter_type_for(target_type: str | None) -> str | None:
    """The drafter model_type that belongs to a target model_type."""
    arch = TARGET_TYPES.get(target_type) if target_type is not None else None
    return next((d for d, a in DRAFTER_TYPES.items() if a == arch), None)


def cross_pair_problem(target_type: str | None, drafter_type: str | None) -> str | None:
    """A sentence when a known drafter belongs to the other architecture than a known target."""
    t = TARGET_TYPES.get(target_type) if target_type is not None else None
    d = DRAFTER_TYPES.get(drafter_type) if drafter_type is not None else None
    if t is None or d is None or t == d:
        return None
    return (
        f"the drafter is a {drafter_type} checkpoint, made for {LABELS[d]} targets, but the target is "
        f"{target_type} ({LABELS[t]}): use the target's own assistant, {drafter_type_for(target_type)}"
    )
