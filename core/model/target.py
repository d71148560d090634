"""The target model: our own forward loop over mlx-lm's Gemma 4 decoder layers.

mlx-lm's model call returns only the normed hidden of all positions, hides per-layer K/V, and
scales any input embeddings again. This loop walks the same `DecoderLayer`s so it reproduces
mlx-lm's logits, but it also
- computes logits only for the rows asked for (the verify block, or the last prompt position),
- returns the post-final-norm hidden states the drafter needs,
- keeps the K/V of the two producer layers reachable (`TargetCache.producer_kv`),
- accepts image soft tokens as input embeddings (not scaled; PLE uses the pad id there), and
- takes bidirectional spans for `use_bidirectional_attention: "vision"`: on sliding layers only for
  `gemma4` (HF), on every layer and past the window for the 12B `gemma4_unified` (HF, mlx-vlm).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import mlx.core as mx

from core import modeltypes
from core.model import memory
from core.model.cache import FullKVCache, SlidingKVCache, attention_mask
from core.model.layers import fast_layers
from core.model.loader import LoadedTarget, load_target_model

SLIDING = "sliding_attention"
FULL = "full_attention"


class TargetCache:
    """Per-layer caches of the target (one per layer that computes its own K/V)."""

    def __init__(self, layer_types: list[str], window: int, slack: int = 256):
        self.layer_types = layer_types
        self.layers = [SlidingKVCache(window, slack) if t == SLIDING else FullKVCache() for t in layer_types]

    @property
    def offset(self) -> int:
        return self.layers[0].offset if self.layers else 0

    def can_trim_to(self, length: int) -> bool:
        return all(c.can_trim_to(length) for c in self.layers)

    def trim_to(self, length: int) -> None:
        for c in self.layers:
            c.trim_to(length)

    def trim(self, n: int) -> None:
        self.trim_to(self.offset - n)

    def reset(self) -> None:
        for i, c in enumerate(self.layers):
            self.layers[i] = SlidingKVCache(c.window, c.slack) if isinstance(c, SlidingKVCache) else FullKVCache()

    def state(self) -> list[mx.array]:
        """Every key and value buffer: what a prefill chunk must evaluate, and nothing more."""
        return [a for c in self.layers for a in (c.keys, c.values) if a is not None]

    def first_of(self, layer_type: str) -> SlidingKVCache | FullKVCache | None:
        for t, c in zip(self.layer_types, self.layers):
            if t == layer_type:
                return c
        return None

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.layers)


@dataclass
class ProducerKV:
    """K/V of the target's producer layers for positions [first, length) of each type.

    keys/values [1, kv_heads, T, head_dim]; `first` is the absolute position of key 0.
    """

    keys: mx.array
    values: mx.array
    first: int


class Target:
    def __init__(self, loaded: LoadedTarget):
        self.path: Path = loaded.path
        self.config = loaded.config
        self.model = loaded.model
        # gemma4.Model wraps gemma4_text.Model as .language_model; gemma4_text.Model is bare
        self.lm: Any = getattr(self.model, "language_model", self.model)
        self.inner = self.lm.model  # Gemma4TextModel
        self.args = self.lm.args
        a = self.args
        self.hidden_size: int = a.hidden_size
        self.vocab_size: int = a.vocab_size
        self.window: int = a.sliding_window
        self.context_length: int = a.max_position_embeddings
        self.layer_types: list[str] = list(a.layer_types)
        self.n_layers = len(self.layer_types)
        self.first_shared = self.n_layers - a.num_kv_shared_layers
        self.embed_scale = self.inner.embed_scale
        self.pad_id = a.pad_token_id
        self.softcap = a.final_logit_softcapping
        # the last layer of each attention type that computes its own K/V feeds the drafter
        self.producers: dict[str, int] = {}
        for i in range(self.first_shared):
            self.producers[self.layer_types[i]] = i
        text_cfg = self.config.get("text_config", self.config)
        self.bidirectional_vision = text_cfg.get("use_bidirectional_attention") == "vision"
        self.architecture = modeltypes.architecture(self.config.get("model_type")) or modeltypes.GEMMA4
        # the unified model's image tokens see their whole image on full and sliding layers alike
        self.vision_all_layers = self.architecture == modeltypes.UNIFIED
        # the same layers with fused projections and compiled pieces for short inputs (core.model.layers)
        self.layers = fast_layers(self.inner.layers)

    @property
    def dtype(self) -> mx.Dtype:
        return self.inner.norm.weight.dtype

    def kv_shape(self, layer_type: str) -> tuple[int, int]:
        """(kv_heads, head_dim) of the producer layer of this type."""
        attn = self.inner.layers[self.producers[layer_type]].self_attn
        return attn.n_kv_heads, attn.head_dim

    def metal_block_cap(self) -> int | None:
        """The largest verify block Metal's fused attention kernel serves on every sliding layer
        (None off Metal or when no layer takes the kernel; full layers' 512-wide heads never do)."""
        caps = []
        for layer in self.inner.layers:
            a = layer.self_attn
            if layer.layer_type == SLIDING:
                cap = memory.metal_block_cap(a.n_heads, a.n_kv_heads, a.head_dim)
                if cap is not None:
                    caps.append(cap)
        return min(caps) if caps else None

    def prefill_chunk_size(self) -> int | None:
        """Tokens per prefill chunk for this model and the memory left (None: the default), on Metal."""
        if not memory.on_metal():
            return None
        info = mx.metal.device_info()
        free = int(info.get("max_recommended_working_set_size", 0)) - mx.get_active_memory()
        a = self.args
        return memory.prefill_chunk_size(
            a.hidden_size, a.intermediate_size, a.num_attention_heads, self.context_length, max(free, 0)
        )

    def make_cache(self, slack: int = 256) -> TargetCache:
        return TargetCache(self.layer_types[: self.first_shared], self.window, slack)

    def embed(self, ids: mx.array) -> mx.array:
        """Scaled token embeddings (in the weight dtype), as the first layer and the drafter see them."""
        return self.inner.embed_tokens(ids) * self.embed_scale

    def logits(self, hidden: mx.array, softcap: bool = True) -> mx.array:
        """Post-norm hidden [..., H] -> soft-capped logits [..., V]. softcap=False skips the cap, which
        is monotonic: for callers that only take an argmax (greedy) it cannot change the result."""
        if self.lm.tie_word_embeddings:
            out = self.inner.embed_tokens.as_linear(hidden)
        else:
            out = self.lm.lm_head(hidden)
        if softcap and self.softcap is not None:
            out = _softcap(out, self.softcap)
        return out

    def forward(
        self,
        tokens: mx.array | list[int],
        cache: TargetCache,
        *,
        embeddings: mx.array | None = None,
        embedding_mask: mx.array | None = None,
        bidirectional: list[tuple[int, int]] | None = None,
        logits: str | int | None = "last",
        softcap: bool = True,
    ) -> tuple[mx.array | None, mx.array]:
        """Run L new tokens at positions [cache.offset, cache.offset + L) and append their K/V.

        tokens [L] ids. embeddings [L, H] with embedding_mask [L] bool: where the mask is set the
        row replaces the token embedding as-is (image soft tokens: no sqrt(H) scale), and the
        per-layer input uses the pad id. bidirectional: absolute [start, end) spans whose
        positions see each other both ways: in sliding layers, within the window (full layers
        stay causal); for the unified model in every layer, whatever the window.
        logits: "last" (row L-1), "all", an int n (the last n rows) or None; softcap=False leaves
        them uncapped (same argmax).

        Returns (logits [n, V] float or None, hidden [L, H] after the final norm).
        """
        ids = mx.array(tokens, dtype=mx.int32) if not isinstance(tokens, mx.array) else tokens.astype(mx.int32)
        ids = ids.reshape(1, -1)
        L = ids.shape[1]
        inner = self.inner
        h, per_layer = self._inputs(ids, embeddings, embedding_mask)
        masks = self._masks(cache, L, bidirectional)

        intermediates = [(None, None)] * self.n_layers
        tables: dict = {}  # the RoPE tables of these positions, shared by the layers (core.model.layers)
        for i, layer in enumerate(self.layers):
            c = cache.layers[i] if i < self.first_shared else None
            kvs, offset = intermediates[inner.previous_kvs[i]]
            h, kvs, offset = layer(
                h,
                masks[layer.layer_type],
                c,
                per_layer_input=per_layer[i],
                shared_kv=kvs,
                offset=offset,
                tables=tables,
            )
            intermediates[i] = (kvs, offset)

        hidden = inner.norm(h)[0]  # [L, H]
        if logits is None:
            return None, hidden
        if logits == "last":
            rows = hidden[-1:]
        elif logits == "all":
            rows = hidden
        else:
            rows = hidden[-int(logits) :]
        return self.logits(rows, softcap), hidden

    def _inputs(
        self, ids: mx.array, embeddings: mx.array | None, embedding_mask: mx.array | None
    ) -> tuple[mx.array, list[mx.array | None]]:
        """ids [1, L] -> (h [1, L, H] with soft-token rows placed, each layer's per-layer input or None)."""
        L = ids.shape[1]
        inner = self.inner
        h = self.embed(ids)
        if embeddings is not None:
            assert embedding_mask is not None, "embeddings need their embedding_mask"
            m = embedding_mask.reshape(1, L, 1)
            h = mx.where(m, embeddings.reshape(1, L, -1).astype(h.dtype), h)
        per_layer: list[mx.array | None] = [None] * self.n_layers
        if inner.hidden_size_per_layer_input:
            ple_ids = ids
            if embeddings is not None and embedding_mask is not None:
                ple_ids = mx.where(embedding_mask.reshape(1, L), self.pad_id, ids)
            pli = inner._get_per_layer_inputs(ple_ids)
            pli = inner._project_per_layer_inputs(h, pli)
            per_layer = [pli[:, :, i, :] for i in range(self.n_layers)]
        return h, per_layer

    def _masks(
        self, cache: TargetCache, L: int, bidirectional: list[tuple[int, int]] | None
    ) -> dict[str, mx.array | str | None]:
        """The attention mask of each layer type for L new tokens after the cached ones."""
        P = cache.offset
        masks: dict[str, mx.array | str | None] = {}
        spans = bidirectional if (bidirectional and self.bidirectional_vision) else None
        if cache.first_of(FULL) is not None:
            # full layers see every earlier key: sdpa's bottom-right aligned "causal" needs no mask array
            masks[FULL] = "causal" if L > 1 else None
            if spans and self.vision_all_layers:
                masks[FULL] = attention_mask(P, L, 0, P + L, None, spans)
        sliding = cache.first_of(SLIDING)
        if sliding is not None:
            assert isinstance(sliding, SlidingKVCache)
            start = _sliding_start_after(sliding, L)
            masks[SLIDING] = attention_mask(
                P, L, start, P + L - start, self.window, spans, spans_past_window=self.vision_all_layers
            )
        return masks

    def producer_kv(self, cache: TargetCache, layer_type: str, first: int) -> ProducerKV:
        """Producer-layer K/V of positions [max(first, 0), cache.offset)."""
        c = cache.layers[self.producers[layer_type]]
        first = max(first, c.start if isinstance(c, SlidingKVCache) else 0, 0)
        k, v = c.fetch(first)
        return ProducerKV(k, v, first)


@partial(mx.compile, shapeless=True)
def _softcap(x: mx.array, cap: float) -> mx.array:
    return mx.tanh(x / cap) * cap


def _sliding_start_after(c: SlidingKVCache, L: int) -> int:
    """The absolute position of the first key `c.update_and_fetch` will return for L new tokens."""
    start = c.start
    if c.keys is not None and c.offset - c.start + L > c.keys.shape[2]:
        start = c.start + max(0, c.offset - c.start - c.keep)  # it will compact first
    return max(start, c.offset - c.window + 1)


def load_target(path: str | Path, dtype: str | None = None) -> Target:
    return Target(load_target_model(Path(path), dtype))
