"""Memory and kernel-shape settings, as mlx-lm applies them, chosen for the loaded model.

- `wired_limit()`: on Metal, wire the model's memory (up to the device's recommended working set)
  while generating, so macOS does not page weights out between turns; restores the old limit.
- `prefill_chunk_size()`: tokens per prefill chunk. Bigger chunks run faster until the chunk's
  transient activations (attention scores and MLP intermediates) crowd memory.
- `metal_block_cap()`: on Metal the fused "vector" attention kernel serves a query block only while
  length <= 8 and length x (query heads / K/V heads) <= 32, and only for head dims 64/96/128/256;
  a verify block past that falls back to composed ops and costs far more than its extra token.
  Auto block size stays within it.
- `CLEAR_CACHE_EVERY`: decoding tokens between `mx.clear_cache()` calls (mlx-lm: 256), so the
  buffer cache does not grow across a long reply; prefill clears after every chunk.

Every function here is a no-op or a plain default on the CPU backend, which has no wired memory,
no fused attention kernel and no separate buffer pool worth trimming.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import mlx.core as mx
import mlx.nn as nn

CLEAR_CACHE_EVERY = 256
VECTOR_MAX_QUERY = 8  # MLX's sdpa_vector: query length <= 8 ...
VECTOR_MAX_ROWS = 32  # ... and query length x GQA factor <= 32
VECTOR_HEAD_DIMS = (64, 96, 128, 256)


def on_metal() -> bool:
    try:
        return mx.default_device() == mx.gpu and mx.metal.is_available()
    except AttributeError:
        return False


@contextlib.contextmanager
def wired_limit(nbytes: int) -> Iterator[None]:
    """Wire up to `nbytes` (capped at the device's recommended working set) for the block, on Metal."""
    if not on_metal():
        yield
        return
    info = mx.metal.device_info()
    limit = min(int(nbytes), int(info.get("max_recommended_working_set_size", nbytes)))
    old = mx.set_wired_limit(limit)
    try:
        yield
    finally:
        mx.synchronize()
        mx.set_wired_limit(old)


def model_bytes(*modules: nn.Module | None) -> int:
    from mlx.utils import tree_flatten

    total = 0
    for m in modules:
        if m is not None:
            leaves: list[tuple[str, mx.array]] = tree_flatten(m.parameters())  # type: ignore[assignment]
            total += sum(v.nbytes for _, v in leaves)
    return total


def prefill_chunk_size(
    hidden_size: int, intermediate_size: int, n_heads: int, context: int, free_bytes: int | None
) -> int:
    """Tokens per prefill chunk: 2048 when the chunk's transient memory fits comfortably (an eighth
    of what is free), halving down to 256 otherwise; 512 when the free memory is unknown.

    Per token a chunk holds about 4 bytes x (a few hidden-size rows, two MLP intermediates, one
    row of attention scores per head over the context so far)."""
    if not free_bytes:
        return 512
    per_token = 4 * (6 * hidden_size + 3 * intermediate_size + n_heads * min(context, 8192))
    size = 2048
    while size > 256 and size * per_token > free_bytes / 8:
        size //= 2
    return size


def metal_block_cap(n_heads: int, kv_heads: int, head_dim: int) -> int | None:
    """Largest verify block the fused attention kernel serves for this layer shape, on Metal
    (None elsewhere, or when the head dim never takes the kernel)."""
    if not on_metal() or head_dim not in VECTOR_HEAD_DIMS or kv_heads < 1:
        return None
    gqa = max(1, n_heads // kv_heads)
    return max(1, min(VECTOR_MAX_QUERY, VECTOR_MAX_ROWS // gqa))
