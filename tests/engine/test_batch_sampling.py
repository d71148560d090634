"""Temperature > 0 in a batch (core.decode.batch): every sampled row keeps the target's distribution.

Many one-round rows on the same prompt (the pack's e-style pairing, top-k 6 so the support is small),
in batches that mix block sizes 2, 3 and 4 with greedy neighbours: the first token comes from the
prefill, the second from the batched round (an accepted draft or the residual sample of per-row
rejection sampling). Both are compared with the target's own distribution by a chi-square test, the
second one given the first (pooled over the first tokens drawn). The counterpart of
tests/engine/test_sampling.py's B = 1 tests, through the batched path and the real models.
"""

from __future__ import annotations

import json
from collections import Counter

import mlx.core as mx
import numpy as np
from test_sampling import chi2_sf

from core import sampling
from core.decode.batch import BatchDecoder
from core.decode.spec import Controls, Prompt
from core.events import RoundEvent
from core.model.drafter import load_drafter
from core.model.target import Target, load_target
from core.settings import GenerationSettings

PACK = "tests/data/pack/models"
TEMPERATURE, TOP_K = 1.0, 6
BATCHES, SAMPLED, GREEDY = 90, 6, 2  # 540 sampled rows
BLOCKS = [2, 3, 4]


def _target_probs(tg: Target, ids: list[int]) -> np.ndarray:
    logits, _ = tg.forward(ids, tg.make_cache(), logits="last")
    assert logits is not None
    lp = sampling.transform_logits(logits[0], TEMPERATURE, TOP_K, 1.0)
    return np.array(mx.exp(lp).astype(mx.float32), dtype=np.float64)


def _pooled_chi2(groups: dict[int, Counter], probs: dict[int, np.ndarray]) -> float:
    """A chi-square p-value over every group's counts against its own distribution; cells expecting
    fewer than 5 are merged into one per group (the approximation's usual rule). A token drawn outside its
    group's support gives 0."""
    stat, df = 0.0, 0
    for g, counts in groups.items():
        n = sum(counts.values())
        p = probs[g]
        if any(p[t] <= 0 for t in counts):
            return 0.0
        expected = n * p
        big = np.flatnonzero(expected >= 5)
        observed = [counts.get(int(t), 0) for t in big]
        cells = list(zip(observed, expected[big]))
        rest_e = n - float(expected[big].sum())
        if rest_e > 1e-9:
            cells.append((n - sum(observed), rest_e))
        stat += sum((o - e) ** 2 / e for o, e in cells)
        df += len(cells) - 1
    return chi2_sf(stat, df)


def test_sampled_rows_in_a_batch_keep_the_targets_distribution() -> None:
    tg = load_target(f"{PACK}/e-style-target")
    dr = load_drafter(f"{PACK}/e-style-assistant")
    prompt = json.load(open("tests/data/pack/references/text/e-style.json"))["prompts"]["short"]["prompt_ids"]
    bd = BatchDecoder(tg, dr, lambda: None, {1, 106})
    firsts: Counter = Counter()
    seconds: dict[int, Counter] = {}
    accepted = 0
    for batch in range(BATCHES):
        events: dict[int, list] = {}
        for i in range(SAMPLED + GREEDY):
            k = BLOCKS[(batch + i) % len(BLOCKS)] if i < SAMPLED else 4
            temp = TEMPERATURE if i < SAMPLED else 0.0
            seed = batch * 100 + i
            s = GenerationSettings(
                max_tokens=1 + k, block_size=k, ignore_eos=True, temperature=temp, top_k=TOP_K, seed=seed
            )
            events[i] = []
            bd.join(Prompt(prompt), s, events[i].append, Controls(k), tag=i)
        results = {}
        for _ in range(8):  # the prefills (from the cached prompt after the first batch), then the rounds
            bd.step()
            results.update({row.tag: r for row, r in bd.take_finished()})
        assert len(results) == SAMPLED + GREEDY and not bd.rows
        for i in range(SAMPLED):
            t1, t2 = results[i].token_ids[:2]
            firsts[t1] += 1
            seconds.setdefault(t1, Counter())[t2] += 1
            accepted += next(e for e in events[i] if isinstance(e, RoundEvent)).accepted > 0
    n = BATCHES * SAMPLED
    assert 0.05 < accepted / n < 0.95, f"drafts accepted in {accepted} of {n} rows: the test needs both paths"
    assert _pooled_chi2({-1: firsts}, {-1: _target_probs(tg, prompt)}) > 1e-3
    probs = {t1: _target_probs(tg, prompt + [t1]) for t1 in seconds}
    assert _pooled_chi2(seconds, probs) > 1e-3
    # the test can fail: the same counts against a wrong distribution (the first token's) are rejected
    wrong = {t1: _target_probs(tg, prompt) for t1 in seconds}
    assert _pooled_chi2(seconds, wrong) < 1e-6
    mx.clear_cache()
