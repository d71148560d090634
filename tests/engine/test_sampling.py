"""core.sampling: logit transforms, greedy and speculative verification.

The speculative tests run many independent trials at once through the functions' leading
dimensions and compare the emitted tokens with the target distribution by a chi-square test.
Seeds are fixed, so the outcome is deterministic.
"""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np
import pytest

from core import sampling
from core.sampling import (
    KeyStream,
    greedy,
    sample,
    transform_logits,
    verify_greedy,
    verify_speculative,
)

N_TRIALS = 20_000


def chi2_sf(x: float, df: int) -> float:
    """Survival function of the chi-square distribution (regularised upper incomplete gamma)."""
    a, z = df / 2.0, x / 2.0
    if z <= 0:
        return 1.0
    # lower regularised gamma by its series; the p-values we care about are far from 0 and 1
    term = 1.0 / a
    total = term
    for n in range(1, 10_000):
        term *= z / (a + n)
        total += term
        if term < total * 1e-16:
            break
    lower = math.exp(a * math.log(z) - z - math.lgamma(a)) * total
    return max(0.0, 1.0 - lower)


def chi2_pvalue(samples: np.ndarray, probs: np.ndarray) -> float:
    counts = np.bincount(samples.ravel(), minlength=probs.size)[: probs.size]
    expected = probs * samples.size
    support = expected > 0
    assert counts[~support].sum() == 0, f"drew tokens outside the support: {counts}"
    stat = float((((counts - expected) ** 2)[support] / expected[support]).sum())
    return chi2_sf(stat, int(support.sum()) - 1)


def test_chi2_helper_is_calibrated():
    # known quantiles: chi2(5) 95 % point is 11.0705, chi2(1) 95 % point is 3.8415
    assert chi2_sf(11.0705, 5) == pytest.approx(0.05, abs=1e-4)
    assert chi2_sf(3.8415, 1) == pytest.approx(0.05, abs=1e-4)
    assert chi2_sf(35.0, 35) == pytest.approx(0.4690, abs=2e-3)
    rng = np.random.default_rng(0)
    p = np.array([0.1, 0.2, 0.3, 0.4])
    assert chi2_pvalue(rng.choice(4, size=20_000, p=p), p) > 1e-3
    assert chi2_pvalue(rng.choice(4, size=20_000, p=[0.15, 0.2, 0.25, 0.4]), p) < 1e-6


# --- transform_logits -------------------------------------------------------------------


def _probs(logprobs: mx.array) -> np.ndarray:
    return np.array(mx.exp(logprobs))


def test_temperature_scales_logits():
    x = mx.array([1.0, 2.0, -0.5, 0.0, 3.0])
    for t in (0.3, 1.0, 2.5):
        got = _probs(transform_logits(x, temperature=t))
        want = np.exp(np.array(x) / t)
        np.testing.assert_allclose(got, want / want.sum(), rtol=1e-5)
    # temperature 0 (greedy) leaves the argmax alone
    assert int(greedy(transform_logits(x, temperature=0.0))) == 4


def test_no_op_settings_keep_every_token():
    x = mx.array([[0.1, -3.0, 2.0, 2.0, -20.0, 0.0]])
    base = _probs(transform_logits(x))
    for kw in ({"top_k": 0}, {"top_k": 6}, {"top_k": 100}, {"top_p": 1.0}):
        got = _probs(transform_logits(x, **kw))
        assert (got > 0).all()
        np.testing.assert_allclose(got, base, rtol=1e-6)


def test_top_k_keeps_k_best_and_all_ties_at_the_boundary():
    x = mx.array([1.0, 2.0, 2.0, 0.5, -1.0, 3.0])
    got = _probs(transform_logits(x, top_k=1))
    assert np.nonzero(got)[0].tolist() == [5]
    got = _probs(transform_logits(x, top_k=2))  # 3.0 then a tie at 2.0: both kept
    assert np.nonzero(got)[0].tolist() == [1, 2, 5]
    assert got[1] == got[2]
    got = _probs(transform_logits(x, top_k=4))
    assert np.nonzero(got)[0].tolist() == [0, 1, 2, 5]
    assert got.sum() == pytest.approx(1.0, abs=1e-6)
    # renormalised softmax over the kept set
    kept = np.exp(np.array([1.0, 2.0, 2.0, 3.0]))
    np.testing.assert_allclose(got[[0, 1, 2, 5]], kept / kept.sum(), rtol=1e-5)


def test_top_p_nucleus_with_ties():
    probs = np.array([0.5, 0.25, 0.1, 0.1, 0.05])
    x = mx.array(np.log(probs).astype(np.float32))
    assert np.nonzero(_probs(transform_logits(x, top_p=0.4)))[0].tolist() == [0]
    assert np.nonzero(_probs(transform_logits(x, top_p=0.7)))[0].tolist() == [0, 1]
    # 0.5 + 0.25 < 0.8: the nucleus needs one 0.1 token, and its tie comes along
    got = _probs(transform_logits(x, top_p=0.8))
    assert np.nonzero(got)[0].tolist() == [0, 1, 2, 3]
    np.testing.assert_allclose(got[:4], probs[:4] / 0.95, rtol=1e-5)
    # tiny top_p still keeps the most likely token
    assert np.nonzero(_probs(transform_logits(x, top_p=1e-6)))[0].tolist() == [0]


def test_transform_order_and_rows():
    # temperature, then top-k, then top-p on the renormalised top-k distribution, per row
    x = mx.array([[4.0, 3.0, 2.0, 1.0, 0.0], [0.0, 1.0, 2.0, 3.0, 4.0]])
    got = _probs(transform_logits(x, temperature=2.0, top_k=3, top_p=0.6))
    z = np.exp(np.array([2.0, 1.5, 1.0]))
    top3 = z / z.sum()  # [0.506, 0.307, 0.186] -> nucleus at 0.6 is the first two
    assert top3[0] < 0.6 < top3[0] + top3[1]
    np.testing.assert_allclose(got[0, :2], top3[:2] / top3[:2].sum(), rtol=1e-5)
    assert (got[0, 2:] == 0).all()
    np.testing.assert_allclose(got[1], got[0][::-1], rtol=1e-6)


def _reference_transform(x: np.ndarray, t: float, k: int, p: float) -> np.ndarray:
    """The documented rule, written plainly in float64 for one row."""
    x = x.astype(np.float64) / (t if t > 0 else 1.0)
    if 0 < k < x.size:
        x = np.where(x >= np.sort(x)[::-1][k - 1], x, -np.inf)
    if p < 1:
        probs = np.exp(x - x.max())
        probs /= probs.sum()
        desc = np.sort(probs)[::-1]
        before = np.cumsum(desc) - desc
        n_keep = max(int((before < p).sum()), 1)
        x = np.where(probs >= desc[n_keep - 1], x, -np.inf)
    e = np.exp(x - x.max())
    return e / e.sum()


def test_transform_matches_reference_on_random_rows_with_ties():
    rng = np.random.default_rng(0)
    for trial in range(60):
        vocab = int(rng.integers(5, 300))
        row = np.round(rng.normal(0, 2, vocab), 1).astype(np.float32)  # rounding makes ties
        t = float(rng.choice([0.0, 0.5, 1.0, 1.7]))
        k = int(rng.choice([0, 1, 3, 10, 64, vocab]))
        p = float(rng.choice([1.0, 0.9, 0.5, 0.97, 0.2]))
        got = _probs(transform_logits(mx.array(row), t, k, p))
        want = _reference_transform(row, t, k, p)
        assert ((got > 0) == (want > 0)).all(), (trial, t, k, p)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-7)


def test_transform_accepts_minus_inf_inputs():
    # the centroid drafter head gives -inf to every token outside its candidates
    x = mx.array([-mx.inf, 1.0, -mx.inf, 0.5, 0.2, -mx.inf])
    for kw in ({}, {"top_k": 2}, {"top_p": 0.5}, {"temperature": 0.7, "top_k": 5, "top_p": 0.9}):
        got = _probs(transform_logits(x, **kw))
        assert np.isfinite(got).all() and got.sum() == pytest.approx(1.0, abs=1e-6)
        assert got[[0, 2, 5]].sum() == 0


def test_transform_upcasts_half_precision():
    x = mx.array([1.0, 2.0, 3.0], dtype=mx.bfloat16)
    assert transform_logits(x).dtype == mx.float32


# --- greedy verification ----------------------------------------------------------------


def _onehot_logits(argmaxes: list[int], vocab: int = 8) -> mx.array:
    rows = np.full((len(argmaxes), vocab), -1.0, dtype=np.float32)
    for i, t in enumerate(argmaxes):
        rows[i, t] = 5.0
    return mx.array(rows)


@pytest.mark.parametrize(
    "drafts, target, n, nxt",
    [
        ([3, 1, 4], [3, 1, 4, 7], 3, 7),  # all accepted: bonus from the last row
        ([2, 1, 4], [3, 1, 4, 7], 0, 3),  # first draft wrong
        ([3, 1, 5], [3, 1, 4, 7], 2, 4),  # mismatch in the last draft
        ([3, 0, 4], [3, 1, 4, 7], 1, 1),  # later matches after a mismatch do not count
        ([], [6], 0, 6),  # K = 1: no drafts
    ],
)
def test_verify_greedy(drafts, target, n, nxt):
    got_n, got_t = verify_greedy(mx.array(drafts, dtype=mx.uint32), _onehot_logits(target))
    assert (int(got_n), int(got_t)) == (n, nxt)


def test_verify_greedy_batched_and_int32_drafts():
    logits = mx.stack([_onehot_logits([3, 1, 4]), _onehot_logits([2, 2, 2])])
    drafts = mx.array([[3, 1], [2, 5]], dtype=mx.int32)
    n, t = verify_greedy(drafts, logits)
    assert n.tolist() == [2, 1] and t.tolist() == [4, 2]


# --- speculative verification -----------------------------------------------------------

P1 = np.array([0.30, 0.05, 0.25, 0.10, 0.00, 0.30])
Q1 = np.array([0.10, 0.40, 0.20, 0.00, 0.20, 0.10])  # mass where p has none, none where p has some
P2 = np.array([0.05, 0.50, 0.05, 0.20, 0.10, 0.10])
Q2 = np.array([0.20, 0.30, 0.10, 0.10, 0.20, 0.10])
P3 = np.array([0.25, 0.15, 0.15, 0.15, 0.15, 0.15])


def _lp(*rows: np.ndarray, n: int = N_TRIALS) -> mx.array:
    with np.errstate(divide="ignore"):
        lp = np.log(np.stack(rows)).astype(np.float32)
    return mx.broadcast_to(mx.array(lp), (n, *lp.shape))


def _one_round(keys: KeyStream, q_rows, p_rows):
    """Draft from q then verify against p, for N_TRIALS independent trials."""
    q = _lp(*q_rows)
    drafts = sample(q, keys.next())  # [N, K-1]
    n, t = verify_speculative(drafts, q, _lp(*p_rows), keys.next())
    mx.eval(drafts, n, t)
    return np.array(drafts), np.array(n), np.array(t)


def test_speculative_first_token_follows_target_and_beats_sample_and_match():
    keys = KeyStream(1234)
    drafts, n, t = _one_round(keys, [Q1], [P1, P2])
    first = np.where(n >= 1, drafts[:, 0], t)
    assert chi2_pvalue(first, P1) > 1e-3

    # acceptance equals sum_x min(p, q) (within 5 standard errors) ...
    theory = np.minimum(P1, Q1).sum()
    se = math.sqrt(theory * (1 - theory) / N_TRIALS)
    assert abs(n.mean() - theory) < 5 * se
    # ... which beats sampling the target independently and accepting on equality
    match_theory = (P1 * Q1).sum()
    independent = np.array(sample(_lp(P1), keys.next()))[:, 0]
    match_rate = (independent == drafts[:, 0]).mean()
    assert abs(match_rate - match_theory) < 5 * math.sqrt(match_theory * (1 - match_theory) / N_TRIALS)
    assert n.mean() > match_rate + 10 * se


def test_speculative_two_tokens_joint_distribution():
    """The first two emitted tokens are distributed as p1 x p2 (rows fixed, so independent)."""
    keys = KeyStream(99)
    drafts, n, t = _one_round(keys, [Q1, Q2], [P1, P2, P3])
    # trials that emitted only one token need a second round, whose first row is p2
    drafts2, n2, t2 = _one_round(keys, [Q2], [P2, P3])
    first = np.where(n >= 1, drafts[:, 0], t)
    second = np.where(n >= 2, drafts[:, 1], np.where(n == 1, t, np.where(n2 >= 1, drafts2[:, 0], t2)))
    assert chi2_pvalue(second, P2) > 1e-3
    joint = first * 6 + second
    assert chi2_pvalue(joint, np.outer(P1, P2).ravel()) > 1e-3
    # both acceptance events happen at their theoretical rates
    a1, a2 = np.minimum(P1, Q1).sum(), np.minimum(P2, Q2).sum()
    assert abs((n >= 1).mean() - a1) < 0.02
    assert abs((n >= 2).mean() - a1 * a2) < 0.02


def test_speculative_q_equal_p_accepts_everything():
    keys = KeyStream(7)
    drafts, n, t = _one_round(keys, [P1, P2], [P1, P2, P3])
    assert (n == 2).all()
    assert chi2_pvalue(t, P3) > 1e-3  # the bonus comes from the last row


def test_speculative_disjoint_supports_accept_nothing():
    keys = KeyStream(8)
    p = np.array([0.5, 0.5, 0, 0, 0, 0])
    q = np.array([0, 0, 0.25, 0.25, 0.25, 0.25])
    drafts, n, t = _one_round(keys, [q, q], [p, P2, P3])
    assert (n == 0).all()
    assert chi2_pvalue(t, p) > 1e-3


def test_speculative_is_seeded():
    q, p = _lp(Q1, Q2, n=64), _lp(P1, P2, P3, n=64)
    d = sample(q, mx.random.key(5))
    a = verify_speculative(d, q, p, mx.random.key(6))
    b = verify_speculative(d, q, p, mx.random.key(6))
    c = verify_speculative(d, q, p, mx.random.key(7))
    assert a[0].tolist() == b[0].tolist() and a[1].tolist() == b[1].tolist()
    assert a[0].tolist() != c[0].tolist() or a[1].tolist() != c[1].tolist()
    # batch-1 shapes give scalars
    n, t = verify_speculative(d[0], q[0], p[0], mx.random.key(6))
    assert n.shape == () and t.shape == ()


def test_speculative_k1_samples_from_target():
    keys = KeyStream(3)
    p = _lp(P1)
    n, t = verify_speculative(mx.zeros((N_TRIALS, 0), dtype=mx.uint32), p[:, :0], p, keys.next())
    assert (np.array(n) == 0).all()
    assert chi2_pvalue(np.array(t), P1) > 1e-3


def test_sample_follows_distribution_and_keystream_is_deterministic():
    a, b = KeyStream(11), KeyStream(11)
    ka, kb = a.split(3), b.split(3)
    assert all(x.tolist() == y.tolist() for x, y in zip(ka, kb))
    assert a.next().tolist() == b.next().tolist()
    assert KeyStream(12).next().tolist() != KeyStream(11).next().tolist()
    draws = np.array(sample(_lp(P2), a.next()))[:, 0]
    assert chi2_pvalue(draws, P2) > 1e-3


def test_speculative_accepts_sparse_draft_distributions():
    """A SparseLogProbs q (candidates only) verifies exactly as its dense form, key for key."""
    V, K = 50, 4
    rng = np.random.default_rng(7)
    ids = mx.array(np.stack([rng.permutation(V)[:8] for _ in range(K - 1)]).astype(np.int32))
    lp = sampling.transform_logits(mx.array(rng.normal(size=(K - 1, 8)).astype(np.float32)), 1.0)
    q = sampling.SparseLogProbs(ids, lp)
    dense = q.dense(V)
    assert dense.shape == (K - 1, V)
    assert np.isfinite(np.array(dense)).sum() == (K - 1) * 8
    p_lp = sampling.transform_logits(mx.array(rng.normal(size=(K, V)).astype(np.float32)), 1.0)
    for seed in range(20):
        key = mx.random.key(seed)
        drafts = ids[mx.arange(K - 1), mx.array([seed % 8] * (K - 1))]
        a = sampling.verify_speculative(drafts, q, p_lp, key)
        b = sampling.verify_speculative(drafts, dense, p_lp, key)
        assert [int(x.item()) for x in a] == [int(x.item()) for x in b]


@pytest.mark.parametrize(
    "temp,top_k,top_p", [(1.0, 0, 1.0), (0.7, 5, 1.0), (1.3, 0, 0.9), (0.9, 40, 0.95), (0.5, 1, 0.5)]
)
def test_compiled_transform_matches_eager(temp, top_k, top_p):
    rng = np.random.default_rng(3)
    x = rng.normal(size=(3, 300)).astype(np.float32) * 3
    x[:, 10:20] = x[:, 10:11]  # ties at the boundary
    x[1, 50:] = -np.inf
    logits = mx.array(x)
    eager = np.array(sampling.transform_logits(logits, temp, top_k, top_p))
    compiled = np.array(sampling.transform_logits_compiled(logits, temp, top_k, top_p))
    assert (np.isfinite(eager) == np.isfinite(compiled)).all()
    np.testing.assert_allclose(compiled[np.isfinite(compiled)], eager[np.isfinite(eager)], atol=1e-6)
