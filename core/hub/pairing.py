"""Does this drafter fit this target? Checked from the two config.json files, before any weight loads.

A source is a local checkpoint directory or a Hub repo id. For a repo id the config comes from the
HF cache, or (online) just that one small file is fetched. Each problem is one sentence naming
the two values that disagree; an empty list means the pair is usable.

What must agree: the target is `gemma4` (or text-only `gemma4_text`) with a
`gemma4_assistant` drafter, or the 12B `gemma4_unified` with a `gemma4_unified_assistant` drafter
(a drafter learnt one architecture's hidden states: no cross pairs, core.modeltypes); the drafter's
`backbone_hidden_size` is the target's hidden size (it reads the target's hidden state and token
embeddings); vocabularies are equal; for each attention type the
drafter uses, its K/V head count and head dim equal those of the target's producer layer of that
type (the last layer of the type that computes its own K/V), because it attends over that cache.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from core import modeltypes
from core.hub.download import looks_like_repo_id
from core.hub.fit import kv_shape, layer_types, producer_layers

TARGET_TYPES = tuple(modeltypes.TARGET_TYPES)
DRAFTER_TYPES = tuple(modeltypes.DRAFTER_TYPES)
DRAFTER_TYPE = "gemma4_assistant"


class PairingError(ValueError):
    pass


def text_config(cfg: dict) -> dict:
    """The language-model part of a config (nested `text_config` in multimodal checkpoints)."""
    return cfg.get("text_config") or cfg


def check_pair(
    target_cfg: dict, drafter_cfg: dict, target_name: str = "the target", drafter_name: str = "the drafter"
) -> list[str]:
    """Problems with using `drafter_cfg` to draft for `target_cfg` (empty: compatible)."""
    problems: list[str] = []
    t_type = target_cfg.get("model_type")
    d_type = drafter_cfg.get("model_type")
    if t_type in DRAFTER_TYPES:
        problems.append(
            f"{target_name} is an assistant drafter (model_type {t_type}), not a target: pass it as the drafter"
        )
    elif t_type not in TARGET_TYPES:
        problems.append(
            f"{target_name} has model_type {t_type!r}; a Gemma 4 target has model_type 'gemma4' "
            "(or 'gemma4_unified' for the 12B)"
        )
    if d_type in TARGET_TYPES:
        problems.append(
            f"{drafter_name} is a Gemma 4 target model (model_type {d_type}), not an assistant drafter: "
            "use the matching '-assistant' checkpoint"
        )
    elif d_type not in DRAFTER_TYPES:
        problems.append(
            f"{drafter_name} has model_type {d_type!r}; an MTP drafter has model_type 'gemma4_assistant' "
            "(or 'gemma4_unified_assistant' for the 12B)"
        )
    cross = modeltypes.cross_pair_problem(t_type, d_type)
    if cross:
        problems.append(cross)
    if problems:
        return problems  # the remaining checks compare fields these configs do not have

    t_text, d_text = text_config(target_cfg), text_config(drafter_cfg)
    hidden = t_text.get("hidden_size")
    backbone = drafter_cfg.get("backbone_hidden_size") or d_text.get("backbone_hidden_size")
    if backbone != hidden:
        problems.append(
            f"{drafter_name} was made for a target with hidden size {backbone} (its backbone_hidden_size), "
            f"but {target_name} has hidden size {hidden}"
        )
    t_vocab, d_vocab = t_text.get("vocab_size"), d_text.get("vocab_size")
    if t_vocab != d_vocab:
        problems.append(f"vocabularies differ: {target_name} has {t_vocab} tokens, {drafter_name} has {d_vocab}")

    try:
        producers = producer_layers(t_text)
        d_types = sorted(set(layer_types(d_text)))
    except (KeyError, TypeError, ValueError) as e:
        problems.append(f"cannot read the attention layout ({type(e).__name__}: {e})")
        return problems
    for t in d_types:
        kind = "sliding-window" if t == "sliding_attention" else "full-attention"
        if t not in producers:
            problems.append(f"{drafter_name} has {kind} layers but {target_name} has no {kind} layer with its own K/V")
            continue
        t_heads, t_dim = kv_shape(t_text, t)
        d_heads, d_dim = kv_shape(d_text, t)
        layer = producers[t]
        if d_heads != t_heads:
            problems.append(
                f"{kind} K/V heads differ: {drafter_name} expects {d_heads}, "
                f"{target_name}'s layer {layer} has {t_heads}"
            )
        if d_dim != t_dim:
            problems.append(
                f"{kind} head dim differs: {drafter_name} expects {d_dim}, {target_name}'s layer {layer} has {t_dim}"
            )
    return problems


def load_config(
    source: str | os.PathLike,
    *,
    offline: bool = False,
    cache_dir: str | Path | None = None,
    endpoint: str | None = None,
    token: str | bool | None = None,
) -> dict:
    """config.json of a local directory or a repo id (cache first; online: fetch only that file)."""
    path = Path(source).expanduser()
    if path.is_dir():
        cfg = path / "config.json"
        if not cfg.is_file():
            raise PairingError(f"{path} has no config.json: not a checkpoint directory")
        return json.loads(cfg.read_text())
    repo_id = str(source)
    if path.exists() or not looks_like_repo_id(repo_id):
        raise PairingError(f"{repo_id} is neither a checkpoint directory nor a Hugging Face repo id (owner/name)")
    from huggingface_hub import hf_hub_download

    from core.hub.download import classify_error

    try:
        file = hf_hub_download(repo_id, "config.json", cache_dir=cache_dir, local_files_only=True)
    except Exception:
        if offline:
            raise PairingError(f"offline: {repo_id} is not in the Hugging Face cache") from None
        try:
            file = hf_hub_download(repo_id, "config.json", cache_dir=cache_dir, endpoint=endpoint, token=token)
        except Exception as e:  # noqa: BLE001 - reported as one clear sentence
            raise PairingError(classify_error(e, repo_id, endpoint).message) from e
    return json.loads(Path(file).read_text())


@dataclass(frozen=True)
class PairCheck:
    target: str
    drafter: str
    problems: tuple[str, ...]
    target_config: dict = field(repr=False, default_factory=dict)
    drafter_config: dict = field(repr=False, default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems

    def message(self) -> str:
        if self.ok:
            return f"{self.drafter} fits {self.target}"
        return f"{self.drafter} cannot draft for {self.target}:\n" + "\n".join(f"  - {p}" for p in self.problems)


def validate_pair(
    target: str | os.PathLike,
    drafter: str | os.PathLike,
    *,
    offline: bool = False,
    cache_dir: str | Path | None = None,
    endpoint: str | None = None,
    token: str | bool | None = None,
) -> PairCheck:
    """Check a custom pair given by repo ids or local paths. Unreadable sources raise PairingError."""
    t_cfg = load_config(target, offline=offline, cache_dir=cache_dir, endpoint=endpoint, token=token)
    d_cfg = load_config(drafter, offline=offline, cache_dir=cache_dir, endpoint=endpoint, token=token)
    problems = check_pair(t_cfg, d_cfg, f"target {target}", f"drafter {drafter}")
    return PairCheck(str(target), str(drafter), tuple(problems), t_cfg, d_cfg)
