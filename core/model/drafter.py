"""The Gemma 4 assistant (MTP) drafter, `model_type: gemma4_assistant` (E2B-31B) or
`gemma4_unified_assistant` (12B: the same architecture and code, its own checkpoint, dense head).

It has no cache of its own: each step reads the target's producer-layer K/V, the target's token
embedding table (x sqrt(backbone hidden)) and the target's post-norm hidden state. Four decoder
layers shaped like the target's, with query-only attention (mlx-lm's `DecoderLayer` built with
every layer KV-shared is exactly that), then `norm`, `post_projection` back to the target width
(fed to the next step) and a head:
- dense: tied to the drafter's `embed_tokens` (26B/31B);
- centroid (`use_ordered_embeddings`, E2B/E4B): score `num_centroids` clusters, keep the top
  `centroid_intermediate_top_k`, and score only their tokens (`token_ordering` viewed
  [num_centroids, V / num_centroids]). Greedy needs just an argmax over those candidates.

Two conventions differ between public implementations (pack README, D1/D2), so both are settings:
- `query_position`: "P-1" (the last cached position; mlx-vlm, vLLM; default) or "P" (HF).
- `sliding_keys`: "W" (keys with |q - k| < W, as mlx-vlm; default) or "W+1" (the last W + 1
  cached keys whatever the position, as HF).
Drafting stays lazy: no host sync, positions are Python ints (a `gate`, which reads each draft's
probability back, is the one exception; the round loop passes none).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import gemma4_text

from core import modeltypes, sampling
from core.model.layers import fast_layers
from core.model.loader import (
    CheckpointError,
    check_checkpoint_files,
    check_finite,
    load_safetensors,
    read_config,
    text_config_of,
    weight_files,
    weights_error,
)
from core.model.target import FULL, SLIDING, Target, TargetCache

QUERY_POSITIONS = ("P-1", "P")
SLIDING_KEYS = ("W", "W+1")


@dataclass
class DrafterConfig:
    backbone_hidden_size: int
    use_ordered_embeddings: bool
    num_centroids: int
    centroid_top_k: int
    text: gemma4_text.ModelArgs
    raw: dict

    @classmethod
    def from_dict(cls, config: dict) -> DrafterConfig:
        if not modeltypes.is_drafter(config.get("model_type")):
            raise CheckpointError(
                f"not a Gemma 4 assistant drafter (model_type {config.get('model_type')!r}, "
                f"expected one of {', '.join(modeltypes.DRAFTER_TYPES)})"
            )
        text = dict(
            text_config_of("the drafter's config.json", {"text_config": config.get("text_config") or {}}, drafter=True)
        )
        backbone = config.get("backbone_hidden_size")
        if backbone is not None and (isinstance(backbone, bool) or not isinstance(backbone, int) or backbone < 1):
            raise CheckpointError(
                f"drafter config.json: backbone_hidden_size must be a positive integer, got {backbone!r}"
            )
        if "hidden_size" not in text or "backbone_hidden_size" not in config:
            raise CheckpointError("drafter config.json lacks text_config.hidden_size or backbone_hidden_size")
        # every layer reads the target's K/V: build them all as KV-shared (query-only attention)
        text["num_kv_shared_layers"] = text.get("num_hidden_layers", 4)
        text.setdefault("hidden_size_per_layer_input", 0)
        text.setdefault("use_double_wide_mlp", False)
        text.setdefault("enable_moe_block", False)
        return cls(
            backbone_hidden_size=int(config["backbone_hidden_size"]),
            use_ordered_embeddings=bool(config.get("use_ordered_embeddings", False)),
            num_centroids=int(config.get("num_centroids", 2048)),
            centroid_top_k=int(config.get("centroid_intermediate_top_k", 32)),
            text=gemma4_text.ModelArgs.from_dict(text),
            raw=config,
        )


class Drafter(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        a = cfg.text
        self.cfg = cfg
        self.hidden_size = a.hidden_size
        self.vocab_size = a.vocab_size
        self.window = a.sliding_window
        self.softcap = a.final_logit_softcapping
        self.pre_projection = nn.Linear(2 * cfg.backbone_hidden_size, a.hidden_size, bias=False)
        self.post_projection = nn.Linear(a.hidden_size, cfg.backbone_hidden_size, bias=False)
        self.layers = [gemma4_text.DecoderLayer(a, i) for i in range(a.num_hidden_layers)]
        self.norm = nn.RMSNorm(a.hidden_size, eps=a.rms_norm_eps)
        self.embed_tokens = nn.Embedding(a.vocab_size, a.hidden_size)
        self.ordered = cfg.use_ordered_embeddings
        if self.ordered:
            if a.vocab_size % cfg.num_centroids:
                raise CheckpointError(f"vocab {a.vocab_size} is not a multiple of num_centroids {cfg.num_centroids}")
            self.centroids = nn.Linear(a.hidden_size, cfg.num_centroids, bias=False)
            self.token_ordering = mx.zeros((a.vocab_size,), dtype=mx.int32)
        self.query_position = "P-1"
        self.sliding_keys = "W"

    def configure(self, query_position: str | None = None, sliding_keys: str | None = None) -> None:
        """Choose the conventions (see the module docstring); None keeps the current one."""
        if query_position is not None:
            if query_position not in QUERY_POSITIONS:
                raise ValueError(f"query_position must be one of {QUERY_POSITIONS}, got {query_position!r}")
            self.query_position = query_position
        if sliding_keys is not None:
            if sliding_keys not in SLIDING_KEYS:
                raise ValueError(f"sliding_keys must be one of {SLIDING_KEYS}, got {sliding_keys!r}")
            self.sliding_keys = sliding_keys

    @property
    def layer_types(self) -> list[str]:
        return [layer.layer_type for layer in self.layers]

    # --- one step ------------------------------------------------------------------------

    def use_fast_layers(self) -> None:
        """Run the layers through `core.model.layers.FastLayer` (fused gate/up, compiled pieces); after loading,
        and again after any change to the layers' weights (the fast layers hold their own views of them)."""
        object.__setattr__(self, "_fast", fast_layers(self.layers))

    def step(
        self, token_embedding: mx.array, hidden: mx.array, kv: dict, position: int | mx.array
    ) -> tuple[mx.array, mx.array]:
        """token_embedding, hidden [1, 1, Hb] -> (y [1, 1, Hd] normed output, next hidden [1, 1, Hb])."""
        # the norm weights carry the compute dtype (linear weights may be packed 4-bit ints)
        x = mx.concatenate([token_embedding, hidden], axis=-1).astype(self.norm.weight.dtype)
        x = self.pre_projection(x)
        fast = getattr(self, "_fast", None)
        if fast is None:
            for layer in self.layers:
                x, _, _ = layer(x, None, None, shared_kv=kv[layer.layer_type], offset=position)
        else:
            tables: dict = {}  # the step's RoPE tables, shared by its layers (core.model.layers)
            for f in fast:
                x, _, _ = f(x, None, None, shared_kv=kv[f.layer_type], offset=position, tables=tables)
        y = self.norm(x)
        return y, self.post_projection(y)

    def _candidates(self, y: mx.array) -> tuple[mx.array, mx.array]:
        """Centroid head: y [Hd] -> (candidate ids [k * V/C], their logits [k * V/C])."""
        k = self.cfg.centroid_top_k
        scores = self.centroids(y)  # [C]
        top = mx.argpartition(-scores, kth=k - 1, axis=-1)[:k]
        per = self.vocab_size // self.cfg.num_centroids
        ids = self.token_ordering.reshape(self.cfg.num_centroids, per)[top].reshape(-1)
        logits = self.embed_tokens(ids) @ y
        return ids, self._cap(logits)

    def _cap(self, logits: mx.array) -> mx.array:
        if self.softcap:
            return mx.tanh(logits / self.softcap) * self.softcap
        return logits

    def greedy_token(self, y: mx.array) -> mx.array:
        """y [..., Hd] (one row) -> argmax token [1] (uint32), never building the full vocab on the sparse head."""
        y = y.reshape(-1)
        if self.ordered:
            ids, logits = self._candidates(y)
            return ids[mx.argmax(logits)].reshape(1).astype(mx.uint32)
        return mx.argmax(self.embed_tokens.as_linear(y)).reshape(1)  # the soft-cap keeps the argmax

    def _greedy_with_prob(self, y: mx.array) -> tuple[mx.array, mx.array]:
        """greedy_token and the drafter's probability of it (of the soft-capped logits, as `logits`)."""
        y = y.reshape(-1)
        if self.ordered:
            ids, logits = self._candidates(y)
            at = mx.argmax(logits)
            tok = ids[at].reshape(1).astype(mx.uint32)
        else:
            raw = self.embed_tokens.as_linear(y)
            at = mx.argmax(raw)  # as greedy_token: the soft-cap could round two near logits to a tie
            tok = at.reshape(1)
            logits = self._cap(raw)
        logits = logits.astype(mx.float32)
        return tok, mx.exp(logits[at] - mx.logsumexp(logits))

    def logits(self, y: mx.array, fill: str = "-inf") -> mx.array:
        """Full-vocabulary logits [V] for one row. On the centroid head the non-selected tokens get
        -inf (fill="-inf", for sampling) or min(selected) - 1 (fill="min-1", as the references)."""
        y = y.reshape(-1)
        if not self.ordered:
            return self._cap(self.embed_tokens.as_linear(y)).astype(mx.float32)
        ids, sel = self._candidates(y)
        sel = sel.astype(mx.float32)
        base = sel.min() - 1 if fill == "min-1" else mx.array(-mx.inf, mx.float32)
        full = mx.full((self.vocab_size,), base)
        full[ids] = sel
        return full

    # --- a draft block -----------------------------------------------------------------------

    def key_windows(self, length: int) -> tuple[int, dict[str, int]]:
        """(query position, first key position per layer type) for a target cache holding [0, length)."""
        pos = length - 1 if self.query_position == "P-1" else length
        if self.sliding_keys == "W":
            first_sliding = pos - self.window + 1
        else:
            first_sliding = length - self.window - 1
        return pos, {SLIDING: max(0, first_sliding), FULL: 0}

    def gather_kv(self, target: Target, cache: TargetCache, length: int) -> tuple[int, dict]:
        pos, firsts = self.key_windows(length)
        kv = {}
        for t in set(self.layer_types):
            p = target.producer_kv(cache, t, firsts[t])
            kv[t] = (p.keys, p.values)
        return pos, kv

    def draft(
        self,
        target: Target,
        cache: TargetCache,
        bonus: mx.array,
        hidden: mx.array,
        n: int,
        *,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        keys: list[mx.array] | None = None,
        gate: Callable[[int, float], bool] | None = None,
    ) -> tuple[mx.array, mx.array | sampling.SparseLogProbs | None]:
        """Propose up to n tokens after `bonus` (the token whose K/V is not in the cache yet).

        bonus [1] int; hidden [Hb], the target's post-norm hidden at the last cached position;
        the cache holds positions [0, P). Returns (drafts [n'] uint32, log-probs [n', V] or None when
        greedy; on the centroid head a `sampling.SparseLogProbs` over the [n', m] candidates, exactly
        the full distribution with -inf elsewhere). Lazy: nothing here waits for the device, unless
        `gate` is given: then after each step j (0-based) the drafter's own probability of draft j
        (greedy: of its argmax; sampled: of the sampled token under the sampling distribution) is
        read back, and `gate(j, p)` False drops draft j and ends the block (n' = j). Stopping on the
        drafter's side alone keeps greedy identical and rejection sampling exact: the verify never
        depends on how many drafts it was given.
        """
        P = cache.offset
        pos, kv = self.gather_kv(target, cache, P)
        pos_arr = mx.array(pos)  # one position for every step of the block
        tok = bonus.reshape(1)
        h = hidden.reshape(1, 1, -1)
        drafts, logprobs, cand_ids = [], [], []
        for j in range(n):
            e = target.embed(tok.reshape(1, 1))
            y, h = self.step(e, h, kv, pos_arr)
            if temperature <= 0:
                if gate is None:
                    tok = self.greedy_token(y)
                else:
                    tok, prob = self._greedy_with_prob(y)
            elif self.ordered:  # sample among the candidates: no full-vocabulary vector, no full sort
                assert keys is not None, "sampling needs keys"
                ids, sel = self._candidates(y.reshape(-1))
                lp = sampling.transform_logits_compiled(sel, temperature, top_k, top_p)
                at = sampling.sample(lp, keys[j])
                tok = ids[at].reshape(1)
                if gate is not None:
                    prob = mx.exp(lp[at])
            else:
                lp = sampling.transform_logits_compiled(self.logits(y), temperature, top_k, top_p)
                assert keys is not None, "sampling needs keys"
                tok = sampling.sample(lp, keys[j]).reshape(1)
                if gate is not None:
                    prob = mx.exp(lp[tok[0]])
            if gate is not None and not gate(j, cast(float, prob.item())):
                break
            if temperature > 0:
                if self.ordered:
                    cand_ids.append(ids)
                logprobs.append(lp)
            drafts.append(tok.astype(mx.uint32))
        out = mx.concatenate(drafts) if drafts else mx.zeros((0,), mx.uint32)
        if not logprobs:
            return out, None
        if cand_ids:
            return out, sampling.SparseLogProbs(mx.stack(cand_ids), mx.stack(logprobs))
        return out, mx.stack(logprobs)


def _sanitize(weights: dict) -> dict:
    out = {}
    for k, v in weights.items():
        if k.startswith("lm_head."):  # duplicates the tied embedding
            continue
        k = k.removeprefix("model.")
        k = k.replace("masked_embedding.centroids.", "centroids.")
        if k == "masked_embedding.token_ordering":
            k, v = "token_ordering", v.astype(mx.int32)
        out[k] = v
    return out


def load_drafter(path: str | Path, dtype: str | None = None) -> Drafter:
    path = Path(path)
    check_checkpoint_files(path)
    config = read_config(path)
    cfg = DrafterConfig.from_dict(config)
    files = weight_files(path)
    if not files:
        raise CheckpointError(f"{path} has no model*.safetensors weights")
    weights: dict[str, mx.array] = {}
    for f in files:
        try:
            weights.update(load_safetensors(f))
        except RuntimeError as e:  # a truncated or corrupt file
            raise weights_error(path, e) from None
    weights = _sanitize(weights)
    model = Drafter(cfg)
    quant = config.get("quantization") or config.get("quantization_config")
    if quant and "group_size" in quant:
        nn.quantize(
            model,
            group_size=quant["group_size"],
            bits=quant["bits"],
            mode=quant.get("mode", "affine"),
            class_predicate=lambda p, m: hasattr(m, "to_quantized") and f"{p}.scales" in weights,
        )
    try:
        model.load_weights(list(weights.items()), strict=True)
    except ValueError as e:
        raise CheckpointError(f"{path}: drafter weights do not match its config: {e}") from e
    if dtype is not None:
        model.set_dtype(getattr(mx, dtype))
    try:
        mx.eval(model.parameters())
    except RuntimeError as e:
        raise weights_error(path, e) from None
    check_finite(path, model.parameters())
    model.eval()
    model.use_fast_layers()
    return model


def check_pair(target: Target, drafter: Drafter) -> None:
    """Refuse a drafter that cannot read this target's embeddings, hidden states or K/V: the one pair
    check (core.hub.pairing.check_pair, the same sentences the CLI and the models screen show) over the two
    loaded checkpoints' configs."""
    from core.hub.pairing import check_pair as pair_problems

    problems = pair_problems(target.config, drafter.cfg.raw)
    if problems:
        raise CheckpointError("drafter does not fit this target: " + "; ".join(problems))
