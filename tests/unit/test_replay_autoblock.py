"""The auto block size controller replayed on recorded acceptance traces (scripts/replay_autoblock.py).

The traces (tests/data/traces/, scripts/record_traces.py) come from real replies of the demo and the
reference pack's trained pairings, greedy and sampled; the replay is deterministic (seeded noise on the
times the controller sees, none on the costs it is scored on), so these are exact regression floors.
tests/data/traces-held-out/ holds other replies of the same categories (`record_traces.py --held-out`),
which no controller change is tuned on: their floors check that a change is not fitted to the first set.
By default the controller starts with the block costs an earlier session on the machine left (the
engine keeps them between sessions); "cold" is a pairing's first session on a machine.

Issue 22's targets and where they stand (`scripts/replay_autoblock.py` prints the table; the floors
below sit just under today's figures, and each fails on the controller before this wave's, whose
figures are in brackets):
- auto >= 0.98x plain decoding on every trace and cost model: the median trace is 0.99-1.10x per cost
  model; the worst reply of >= 24 round tokens is 0.94x (0.85x), the worst of all 0.86x (0.85x): a
  reply of 7-11 tokens after replies the drafter knew well, where the first rounds of the turn are a
  blind bet on the new text (one rejected round of 3 costs 0.3-1.2 plain steps, over 2 % of such a reply);
- auto >= 0.95x the best fixed K in hindsight on every trace: met over each cost model's traces
  together (0.954-1.0x), not per trace: the worst long reply is 0.79x (0.75x), the worst of all 0.72x
  (a reply of 2 round tokens: one round, whose block size nothing about the reply can inform);
- overall >= 0.85x the clairvoyant: 0.840x (0.837x). The best fixed K of every trace in hindsight
  reaches only 0.862x, and a policy that picks its K from the last round's outcome (3 contexts, each
  K chosen per trace in hindsight) 0.870x: the clairvoyant's edge is mostly where each accepted run
  ends, which nothing the controller sees predicts. An online controller would have to come within
  1.4 % of per-trace hindsight overall; this one is 2.5 % away.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import replay_autoblock as replay  # noqa: E402
from autoblock_prompts import cases_for  # noqa: E402

SHORT = replay.SHORT


@pytest.fixture(scope="module")
def traces():
    out = replay.load_traces()
    assert {"demo", "e-style", "moe-style", "dense-style"} <= set(out)
    return out


@pytest.fixture(scope="module")
def rows(traces):
    return replay.evaluate(traces)


@pytest.fixture(scope="module")
def held_out_rows():
    return replay.evaluate(replay.load_traces(replay.HELD_OUT_TRACES))


@pytest.fixture(scope="module")
def cold_rows(traces):
    return replay.evaluate(traces, primed=False)


def _per_model(rows):
    return {m: replay.summary([r for r in rows if r.model == m]) for m in replay.MODELS.keys() | {"cpu"}}


def test_traces_cover_the_cases_the_issue_names(rows):
    cats = {r.trace.category for r in rows}
    assert {"in-corpus", "paraphrase", "off-topic", "second-turn", "long"} <= cats
    assert {r.trace.mode for r in rows} == {"greedy", "sampled"}
    assert any(r.trace.tokens >= 299 for r in rows)


def test_never_slower_than_plain_decoding_overall_and_close_on_every_reply(rows):
    for model, s in _per_model(rows).items():
        assert s["median_vs_plain"] >= 0.98, (model, s)
        assert s["min_vs_plain_long"] >= 0.94, (model, s)
        assert s["min_vs_plain"] >= 0.86, (model, s)


def test_close_to_the_best_fixed_block_size_in_hindsight(rows):
    for model, s in _per_model(rows).items():
        assert s["overall_vs_fixed"] >= 0.95, (model, s)
        assert s["min_vs_fixed_long"] >= 0.78, (model, s)
        assert s["min_vs_fixed"] >= 0.71, (model, s)


def test_against_the_clairvoyant(rows):
    assert replay.summary(rows)["overall_vs_clairvoyant"] >= 0.839


def test_a_first_session_on_a_machine_is_close_too(cold_rows):
    # no block costs kept from before: the first reply times plain steps before it drafts
    s = replay.summary(cold_rows)
    assert s["overall_vs_clairvoyant"] >= 0.839 and s["min_vs_plain_long"] >= 0.93 and s["median_vs_plain"] >= 0.99
    big = [r.vs_plain for r in cold_rows if r.model == "cpu-big"]
    assert min(big) >= 0.95 and sum(big) / len(big) >= 0.99


def test_a_session_that_starts_from_the_acceptance_an_earlier_one_kept(traces, rows):
    # the engine keeps a pairing's long-run acceptance beside its costs: over all replies a little closer
    # to hindsight (0.977x the best fixed K against 0.975x), paid for on a few replies of 9-11 tokens,
    # where a first block that the kept acceptance makes deeper is a bet the short reply loses
    kept = replay.summary(replay.evaluate(traces, kept=True))
    assert kept["overall_vs_fixed"] >= 0.976 > replay.summary(rows)["overall_vs_fixed"]
    assert kept["overall_vs_clairvoyant"] >= 0.840 and kept["min_vs_plain_long"] >= 0.90


def test_drafting_that_cannot_pay_is_left_alone(rows):
    # a real-size target on a CPU (verify K = K plain steps): with the costs an earlier session measured,
    # auto is plain decoding from the first round of the first reply
    big = [r for r in rows if r.model == "cpu-big"]
    assert all(set(r.chosen) == {1} for r in big), [r.trace.name for r in big if set(r.chosen) != {1}]


def test_a_known_machine_drafts_from_the_first_round_of_the_first_reply(rows, cold_rows):
    first = {"demo": "speculative", "e-style": "reverse", "moe-style": "reverse", "dense-style": "reverse"}

    def opening(rs):
        return [r.chosen[0] for r in rs if r.model == "apple-cheap" and first[r.trace.pairing] == r.trace.case]

    assert all(k > 1 for k in opening(rows))  # primed: the costs say drafts can pay, so it tries at once
    assert all(k == 1 for k in opening(cold_rows))  # cold: it times a plain step first
    speculative = next(r for r in rows if r.model == "apple-cheap" and r.trace.name == "demo/greedy/speculative")
    cold = next(r for r in cold_rows if r.model == "apple-cheap" and r.trace.name == "demo/greedy/speculative")
    assert speculative.vs_plain >= cold.vs_plain + 0.3 and speculative.vs_plain >= 3.0


def test_in_corpus_replies_are_much_faster_on_a_gpu_cost_model(rows):
    demo = [r for r in rows if r.model == "apple-cheap" and r.trace.pairing == "demo"]
    fast = [r.vs_plain for r in demo if r.trace.category == "in-corpus" and r.trace.mode == "greedy"]
    assert min(fast) >= 2.0


def test_replies_no_change_was_tuned_on_score_as_the_main_set_does(traces, held_out_rows, rows):
    # tests/data/traces-held-out: other replies of the same categories and pairings, with the same costs;
    # a controller fitted to the main set's replies would fall behind here (a parameter search that did
    # is in scripts/replay_autoblock.py's docstring)
    held = replay.load_traces(replay.HELD_OUT_TRACES)
    assert set(held) == set(traces)
    for pairing, (data, ts) in held.items():  # recorded from the prompt lists, with the main set's costs
        assert [t.case for t in ts] == [c.name for c in cases_for(pairing, held_out=True)] * 2
        assert data["cpu_costs"] == traces[pairing][0]["cpu_costs"]
    assert {r.trace.category for r in held_out_rows} == {r.trace.category for r in rows}
    assert not {r.trace.name for r in rows} & {r.trace.name for r in held_out_rows}
    for model, s in _per_model(held_out_rows).items():
        assert s["median_vs_plain"] >= 0.98, (model, s)
        assert s["min_vs_plain_long"] >= 0.93, (model, s)
        assert s["overall_vs_fixed"] >= 0.945, (model, s)
    assert all(set(r.chosen) == {1} for r in held_out_rows if r.model == "cpu-big")
    held_clair = replay.summary(held_out_rows)["overall_vs_clairvoyant"]
    assert held_clair >= 0.834 and abs(held_clair - replay.summary(rows)["overall_vs_clairvoyant"]) < 0.01


@pytest.mark.xfail(strict=True, reason="issue 22's replay targets are not all met yet (see the module docstring)")
def test_issue_22_replay_targets(rows):
    s = replay.summary(rows)
    assert s["min_vs_plain"] >= 0.98 and s["min_vs_fixed"] >= 0.95, s
    assert s["overall_vs_clairvoyant"] >= 0.85, s
