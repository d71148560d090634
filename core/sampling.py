"""Token selection for plain and speculative decoding.

Every function here builds a lazy MLX graph and never syncs with the host: the round loop
evaluates the results once per round. Shapes are written for batch 1 (the engine's case),
but any leading dimensions are carried through, which the tests use to run many trials at once.

Distributions travel as *log-probabilities* over the vocabulary ([..., V], float32), with
-inf for tokens that cannot be drawn. `transform_logits` turns raw logits into them, and the
same transform must be applied to the drafter's and the target's logits, or speculative
sampling no longer reproduces the target's distribution.

Randomness comes only from explicit keys (`mx.random.key(seed)`), so a seeded turn is
reproducible; `KeyStream` hands out one fresh key per use.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

import mlx.core as mx


@dataclass
class SparseLogProbs:
    """Log-probabilities that are -inf outside a few candidate tokens per row (the drafter's centroid
    head): ids [..., m] and their logprobs [..., m]. `dense` scatters them into [..., V] once, where a
    full-vocabulary vector is really needed (the verify's residual)."""

    ids: mx.array
    logprobs: mx.array

    def dense(self, vocab: int) -> mx.array:
        full = mx.full((*self.ids.shape[:-1], vocab), -mx.inf, dtype=self.logprobs.dtype)
        return mx.put_along_axis(full, self.ids.astype(mx.int32), self.logprobs, axis=-1)


def transform_logits(logits: mx.array, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> mx.array:
    """Raw logits [..., V] -> log-probabilities [..., V] of the sampling distribution.

    Order: divide by `temperature`, keep the top-k, keep the top-p nucleus of what is left,
    renormalise. Excluded tokens get -inf.

    - temperature <= 0 means greedy; the logits are then not scaled (argmax is unchanged,
      and greedy callers only take the argmax).
    - top_k <= 0 or top_k >= V is a no-op. Ties at the k-th value are all kept, so the mask
      does not depend on sort order (it may keep more than k tokens).
    - top_p >= 1 is a no-op. Otherwise the nucleus is the smallest set of most likely tokens
      whose probability reaches top_p; every token as likely as the least likely member is
      kept too (ties again).
    """
    x = logits.astype(mx.float32)
    if temperature > 0 and temperature != 1.0:
        x = x / temperature
    return _top_k_top_p(x, top_k, top_p, top_p < 1.0)


def _top_k_top_p(x: mx.array, top_k: int, top_p: float | mx.array, nucleus: bool) -> mx.array:
    """Scaled logits [..., V] -> log-probabilities with the top-k and the top-p nucleus kept (ties
    kept), renormalised: the shared tail of `transform_logits` and its compiled form."""
    vocab = x.shape[-1]
    # candidates for the nucleus, most likely first: only the top k when top-k is on, which
    # spares a full-vocabulary sort in the common top_k=64, top_p=0.95 setting
    candidates = None
    if 0 < top_k < vocab:
        candidates = mx.sort(mx.topk(x, top_k, axis=-1), axis=-1)[..., ::-1]
        x = mx.where(x >= candidates[..., -1:], x, -mx.inf)
    if nucleus:
        if candidates is None:
            candidates = mx.sort(x, axis=-1)[..., ::-1]
        probs = mx.exp(candidates - mx.logsumexp(x, axis=-1, keepdims=True))
        mass_before = mx.cumsum(probs, axis=-1) - probs
        # kept in sorted order: those whose preceding mass is still below top_p (at least one);
        # comparing logits with the boundary logit keeps every tie of the boundary token
        n_keep = mx.maximum((mass_before < top_p).sum(axis=-1, keepdims=True), 1)
        threshold = mx.take_along_axis(candidates, n_keep - 1, axis=-1)
        x = mx.where(x >= threshold, x, -mx.inf)
    return x - mx.logsumexp(x, axis=-1, keepdims=True)


@mx.compile
def _transform_core(logits: mx.array, temperature: mx.array, top_p: mx.array, top_k: int, nucleus: bool) -> mx.array:
    # transform_logits with the temperature and top-p as inputs, not constants: a new setting
    # reuses the compiled kernels (on the CPU backend each new kernel is a C++ compile)
    return _top_k_top_p(logits.astype(mx.float32) / temperature, top_k, top_p, nucleus)


def transform_logits_compiled(logits: mx.array, temperature: float, top_k: int = 0, top_p: float = 1.0) -> mx.array:
    """`transform_logits` as one compiled graph (as mlx-lm compiles its samplers), for temperature > 0:
    its elementwise steps fuse into a few kernels. Same result."""
    t = temperature if temperature > 0 else 1.0
    return _transform_core(logits, mx.array(t, mx.float32), mx.array(top_p, mx.float32), int(top_k), bool(top_p < 1.0))


def greedy(logits: mx.array) -> mx.array:
    """argmax over the last axis: [..., V] -> [...] (uint32)."""
    return mx.argmax(logits, axis=-1)


def sample(logprobs: mx.array, key: mx.array) -> mx.array:
    """Draw one token per row from log-probabilities [..., V] -> [...] (uint32)."""
    return mx.random.categorical(logprobs, axis=-1, key=key)


def verify_greedy(draft_tokens: mx.array, target_logits: mx.array) -> tuple[mx.array, mx.array]:
    """Greedy verification of one block.

    draft_tokens [..., K-1] (the drafts d1..d_{K-1}); target_logits [..., K, V] (logits or
    log-probabilities: only the argmax matters), where row i is the target's prediction for
    the token after the block's i-th input (row 0 checks d1, row K-1 follows the last draft).

    Returns (n_accepted [...], next_token [...]): drafts d1..dn equal the target's argmax, and
    next_token is the target's argmax at row n (the first mismatch, or after the last draft).
    """
    target = mx.argmax(target_logits, axis=-1)  # [..., K]
    n_accepted = _accepted_prefix(draft_tokens == target[..., :-1].astype(draft_tokens.dtype))
    next_token = mx.take_along_axis(target, n_accepted[..., None], axis=-1)[..., 0]
    return n_accepted, next_token


def verify_speculative(
    draft_tokens: mx.array,
    draft_logprobs: mx.array | SparseLogProbs,
    target_logprobs: mx.array,
    key: mx.array,
) -> tuple[mx.array, mx.array]:
    """Speculative sampling (Leviathan et al. / Chen et al.) for one block.

    draft_tokens [..., K-1]: d_i drawn from q_i.
    draft_logprobs [..., K-1, V]: q_1..q_{K-1}, the drafter's distributions the drafts came
        from (after `transform_logits`), or a `SparseLogProbs` over [..., K-1, m] candidates.
    target_logprobs [..., K, V]: p_1..p_K, the target's distributions (same transform).
    key: one PRNG key, consumed here.

    d_i is accepted with probability min(1, p_i(d_i) / q_i(d_i)), stopping at the first
    rejection. At a rejection in row n the next token is drawn from norm(max(p_n - q_n, 0));
    if every draft passes it is drawn from p_K. The emitted tokens then follow the target's
    distribution exactly, whatever q is.

    Returns (n_accepted [...] int32, next_token [...] uint32).
    """
    k_accept, k_next = mx.random.split(key)
    if isinstance(draft_logprobs, SparseLogProbs):
        draft_logprobs = draft_logprobs.dense(target_logprobs.shape[-1])
    p = mx.exp(target_logprobs)  # [..., K, V]
    q = mx.exp(draft_logprobs)  # [..., K-1, V]
    idx = draft_tokens[..., None].astype(mx.int32)
    p_d = mx.take_along_axis(p[..., :-1, :], idx, axis=-1)[..., 0]  # [..., K-1]
    q_d = mx.take_along_axis(q, idx, axis=-1)[..., 0]
    u = mx.random.uniform(shape=draft_tokens.shape, key=k_accept)  # [0, 1)
    # u < p/q written without the division: q_d = 0 (impossible for a real draw) accepts,
    # p_d = 0 always rejects.
    n_accepted = _accepted_prefix(u * q_d < p_d)

    # Residual for every row; the last row has no draft, so its "q" is zero and the
    # residual is p_K itself.
    q_ext = mx.concatenate([q, mx.zeros_like(p[..., -1:, :])], axis=-2)
    residual = mx.maximum(p - q_ext, 0.0)
    row = mx.take_along_axis(residual, n_accepted[..., None, None], axis=-2)[..., 0, :]
    p_row = mx.take_along_axis(p, n_accepted[..., None, None], axis=-2)[..., 0, :]
    # A rejection at a row with p == q has probability zero, but rounding can still leave an
    # all-zero residual there; fall back to p rather than sample from nothing.
    row = mx.where(row.sum(axis=-1, keepdims=True) > 0, row, p_row)
    next_token = mx.random.categorical(mx.log(row), axis=-1, key=k_next)
    return n_accepted, next_token


def _accepted_prefix(accept: mx.array) -> mx.array:
    """Length of the leading run of True along the last axis: [..., K-1] bool -> [...] int32."""
    if accept.shape[-1] == 0:
        return mx.zeros(accept.shape[:-1], dtype=mx.int32)
    return mx.cumprod(accept.astype(mx.int32), axis=-1).sum(axis=-1).astype(mx.int32)


class KeyStream:
    """A seeded sequence of PRNG keys: `next()` returns a fresh key each call.

    With seed None a random seed is drawn, so unseeded turns differ from each other.
    Splitting is lazy (no host sync).
    """

    def __init__(self, seed: int | None = None):
        self.seed = secrets.randbits(32) if seed is None else int(seed)
        self._key = mx.random.key(self.seed)

    def next(self) -> mx.array:
        self._key, sub = mx.random.split(self._key)
        return sub

    def split(self, n: int) -> list[mx.array]:
        """n fresh keys at once (e.g. one per draft step and one for verification)."""
        self._key, *subs = mx.random.split(self._key, n + 1)
        return list(subs)
