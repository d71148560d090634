"""The auto block size controller replayed on recorded acceptance traces (scripts/replay_autoblock.py).

The traces (tests/data/traces/, scripts/record_traces.py) come from real replies of the demo and the
reference pack's trained pairings, greedy and sampled; the replay is deterministic (seeded noise on the
times the controller sees, none on the costs it is scored on), so these are exact regression floors.
tests/data/traces-held-out/ holds other replies of the same categories (`record_traces.py --held-out`),
which no controller change is tuned on: their floors check that a change is not fitted to the first set.
By default the controller starts with the block costs an earlier session on the machine left (the
engine keeps them between sessions); "cold" is a pairing's first session on a machine.

Issue 22's targets and where they stand (`scripts/replay_autoblock.py` prints the table; the floors
below sit just under today's figures). The main set's demo traces were recorded again with the demo
shipped then ("E" in scripts/train_demo.py) and the drafter's per-draft probabilities (2026-12-03; until
then they were of the demo before it: its second-turn replies were 2 tokens long); the pack's traces did
not change. The demos shipped since (wave 6 on 2026-12-06, waves 7 and 8 on 2026-12-07) are not in them: the
traces stay a record of real replies, and the floors below are the controller's on them.
- auto >= 0.98x plain decoding on every trace and cost model: the median trace is 0.99-1.25x per cost
  model; the worst reply of >= 24 round tokens is 0.97x (this CPU's costs), the worst of all 0.89x
  (drafter-expensive, where a draft step costs 0.6 of a plain step and drafting gains ~1.2x at best, on
  a sampled reply of 18 round tokens). Before a primed session timed a plain step early (2026-12-07:
  `test_kept_costs_that_make_drafts_look_free_cost_little`) they were 0.94x and 0.94x;
- auto >= 0.95x the best fixed K in hindsight on every trace: met over each cost model's traces
  together (0.951-1.0x), not per trace: the worst reply of >= 24 round tokens is 0.75x (0.78x before
  the early timing), the worst of all 0.66x (a reply of 18 round tokens: three rounds, where K = 7 in
  hindsight is luck);
- overall >= 0.85x the clairvoyant: 0.838x. The best fixed K of every trace in hindsight
  reaches only 0.858x (0.862x on the old demo traces, where a policy that picks its K from the last
  round's outcome, each K chosen per trace in hindsight, reached 0.870x): the clairvoyant's edge is
  mostly where each accepted run ends, which nothing the controller sees predicts (the drafter's own
  probability of a draft does, in part: `replay_autoblock.py --confidence`; a gate on it, replayed,
  gained ~1 % of the clairvoyant at no sync cost and nothing at 0.03 plain steps per draft-step sync).
  `replay_autoblock.py --bound` (2026-12-08): one fixed K per pairing, cost model and mode, chosen in
  hindsight, reaches 0.847x; a block size per state of the last drafting round (outcome, plain rounds
  since), fitted in hindsight per pairing, cost model and mode, 0.865x on the replies it was fitted on and
  0.858x fitted on the held-out set. That policy knows the costs and learns nothing; the controller, which
  measures both as it goes, is 0.838x. Fitted instead to lift each group's worst reply against the first
  two targets, such a policy still misses them in 9 of the 40 groups (the demo's short replies, sampled).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import replay_autoblock as replay  # noqa: E402
from autoblock_prompts import cases_for  # noqa: E402

SHORT = replay.SHORT


class ScriptedSizes:
    """A stand-in controller for `replay.replay`: round n (from 1) has block size `size(n)`; it records what
    every round was seen as: (k, round_s, ahead, traced)."""

    def __init__(self, size: Callable[[int], int]) -> None:
        self.size, self.n = size, 0
        self.seen: list[tuple[int, float | None, bool, bool]] = []

    def begin_turn(self, sampled: bool = False) -> None:
        pass

    def decide(self):
        self.n += 1
        return type("Choice", (), {"block_size": self.size(self.n)})()

    def observe(self, k, n, *, round_s=None, clean=True, ahead=False, traced=False):
        self.seen.append((k, round_s, ahead, traced))


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
        assert s["min_vs_plain_long"] >= 0.97, (model, s)
        assert s["min_vs_plain"] >= 0.88, (model, s)


def test_close_to_the_best_fixed_block_size_in_hindsight(rows):
    for model, s in _per_model(rows).items():
        assert s["overall_vs_fixed"] >= 0.95, (model, s)
        assert s["min_vs_fixed_long"] >= 0.74, (model, s)
        assert s["min_vs_fixed"] >= 0.59, (model, s)


def test_against_the_clairvoyant(rows):
    assert replay.summary(rows)["overall_vs_clairvoyant"] >= 0.837


def test_a_first_session_on_a_machine_is_close_too(cold_rows):
    # no block costs kept from before: the first reply times plain steps before it drafts
    s = replay.summary(cold_rows)
    assert s["overall_vs_clairvoyant"] >= 0.836 and s["min_vs_plain_long"] >= 0.95 and s["median_vs_plain"] >= 0.99
    big = [r.vs_plain for r in cold_rows if r.model == "cpu-big"]
    assert min(big) >= 0.95 and sum(big) / len(big) >= 0.99


def test_a_session_that_starts_from_the_acceptance_an_earlier_one_kept(traces, rows):
    # the engine keeps a pairing's long-run acceptance beside its costs: a first reply bets on drafts as the
    # pairing usually earns them. Over all replies that scores as the main set does (0.977x the best fixed K
    # against 0.977x; before the session's slow and fast windows started from it too (stop 54), 0.975x, and
    # its worst reply 0.957x plain, of >= 24 round tokens 0.964x, against 0.960x and 0.960x now)
    kept = replay.summary(replay.evaluate(traces, kept=True))
    main = replay.summary(rows)["overall_vs_fixed"]
    assert kept["overall_vs_fixed"] >= 0.975 and abs(kept["overall_vs_fixed"] - main) < 0.005
    assert kept["overall_vs_clairvoyant"] >= 0.837 and kept["min_vs_plain"] >= 0.958


def _drafting_rounds_per_session(rows) -> dict[tuple[str, str], int]:
    out: dict[tuple[str, str], int] = {}
    for r in rows:
        key = (r.trace.pairing, r.trace.mode)
        out[key] = out.get(key, 0) + sum(k > 1 for k in r.chosen)
    return out


def test_drafting_that_cannot_pay_is_left_alone(rows):
    # a real-size target on a CPU (verify K = K plain steps): with the costs an earlier session measured,
    # auto is plain decoding from the first round of the first reply, but for one round per session that
    # checks those costs (kept from a busy moment, they would park every later session for good)
    big = [r for r in rows if r.model == "cpu-big"]
    assert set(_drafting_rounds_per_session(big).values()) == {1}
    assert min(r.vs_plain for r in big) >= 0.98


def test_a_known_machine_drafts_from_the_first_round_of_the_first_reply(rows, cold_rows):
    first = {"demo": "speculative", "e-style": "reverse", "moe-style": "reverse", "dense-style": "reverse"}

    def opening(rs):
        return [r.chosen[0] for r in rs if r.model == "apple-cheap" and first[r.trace.pairing] == r.trace.case]

    assert all(k > 1 for k in opening(rows))  # primed: the costs say drafts can pay, so it tries at once
    assert all(k == 1 for k in opening(cold_rows))  # cold: it times a plain step first
    speculative = next(r for r in rows if r.model == "apple-cheap" and r.trace.name == "demo/greedy/speculative")
    cold = next(r for r in cold_rows if r.model == "apple-cheap" and r.trace.name == "demo/greedy/speculative")
    assert speculative.vs_plain >= cold.vs_plain + 0.3 and speculative.vs_plain >= 3.0


def test_kept_costs_that_make_drafts_look_free_cost_little(traces):
    # a session primed with kept costs timed against a busy moment's T(1) (each ratio's extra over a plain
    # step cut to nothing, or to half): it drafts at once, and until a plain step is timed its rounds'
    # ratios echo the file. It times one a few rounds in (AutoBlockConfig.primed_timing_at; 16 where it
    # believes its drafts are kept 80 % of the time: a short reply's would pay anyway), and its first rounds
    # of a kept size timed against it, far dearer than kept, drop the kept costs. Before: 0.40x plain at
    # worst (cpu-big), 0.64x on this CPU's costs; with half the extra 0.77x and 0.86x. Now 0.65x (cpu-big,
    # a demo reply whose drafts are kept: its timing waits for round 16) and 0.88x; 0.74x and 0.93x
    for stale, floor, cpu_floor in ((0.0, 0.64, 0.88), (0.5, 0.74, 0.92)):
        rows = replay.evaluate(traces, stale=stale)
        assert replay.summary(rows)["min_vs_plain"] >= floor, stale
        assert min(r.vs_plain for r in rows if r.model == "cpu") >= cpu_floor, stale
        assert replay.summary(rows)["overall_vs_clairvoyant"] >= 0.82, stale


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
        assert s["overall_vs_fixed"] >= 0.94, (model, s)
    assert set(_drafting_rounds_per_session([r for r in held_out_rows if r.model == "cpu-big"]).values()) == {1}
    held_clair = replay.summary(held_out_rows)["overall_vs_clairvoyant"]
    assert held_clair >= 0.833 and abs(held_clair - replay.summary(rows)["overall_vs_clairvoyant"]) < 0.01


@pytest.mark.xfail(strict=True, reason="issue 22's replay targets are not all met yet (see the module docstring)")
def test_issue_22_replay_targets(rows):
    s = replay.summary(rows)
    assert s["min_vs_plain"] >= 0.98 and s["min_vs_fixed"] >= 0.95, s
    assert s["overall_vs_clairvoyant"] >= 0.85, s


def test_the_drafters_own_probability_is_recorded_and_scored(traces):
    # every position of every trace carries the drafter's p of each of its k_max - 1 drafts
    for data, ts in traces.values():
        for t in ts:
            assert len(t.conf) == len(t.runs) and all(len(c) == data["k_max"] - 1 for c in t.conf), t.name
            assert all(0.0 < p < 1.0 for c in t.conf for p in c), t.name

    def trace(pairs):
        return replay.Trace("x", "c", "cat", "greedy", [r for _, r in pairs], [[p] * 7 for p, _ in pairs])

    def auc(pairs):
        return replay.confidence_report({"x": ({}, [trace(pairs)])})["x/greedy"]["auc"]

    assert auc([(0.9, 3), (0.8, 1), (0.2, 0), (0.1, 0)]) == 1.0  # every kept draft above every rejected one
    assert auc([(0.1, 3), (0.9, 0)]) == 0.0
    assert auc([(0.5, 1), (0.5, 0), (0.9, 2), (0.1, 0)]) == 0.875  # a tie counts half: (1 + 0.5 + 1 + 1) / 4
    report = replay.confidence_report(traces)
    # the demo's drafter knows when it knows (AUC ~0.90 greedy); the pack's, trained far less, less so
    assert report["demo/greedy"]["auc"] > 0.85 > report["moe-style/greedy"]["auc"] > 0.6
    buckets = report["demo/greedy"]["buckets"]
    assert sum(n for _, _, n, _ in buckets) == report["demo/greedy"]["drafts"]
    assert buckets[0][3] < 0.3 < 0.9 < buckets[-1][3]  # rarely kept when unsure, nearly always when sure


def test_a_reply_in_a_process_of_its_own_pays_its_tracing_once(traces):
    """--one-shot X replays `gemma-chat generate`: a fresh controller per reply, primed with what an earlier
    session kept, whose first drafting round costs X plain steps more (it traces the compiled functions),
    and the first round of every other block size NEW_SIZE_TRACING of X (its verify is traced per shape).
    A block size that always drafts pays X once per reply; auto stays close to plain decoding wherever
    drafts cannot pay (cpu-big), and over all replies as the sessions do (measured: 0.970x plain at worst
    on cpu-big, 0.963x at worst, on replies of >= 24 round tokens too, and 0.995x median over all at X = 1;
    before the windows started from the kept acceptance (stop 54), 0.942x, 0.951x and 0.993x)."""
    trace = traces["demo"][1][0]
    cost = replay.measured_cost(traces["demo"][0]["cpu_costs"])
    always_3 = replay.AutoBlock(replay.AutoBlockConfig(k_min=3, k_max=3))
    plain, chosen = replay.replay(always_3, trace, cost, replay.random.Random(0), 0.0)
    always_3 = replay.AutoBlock(replay.AutoBlockConfig(k_min=3, k_max=3))
    traced, again = replay.replay(always_3, trace, cost, replay.random.Random(0), 0.0, tracing=1.5)
    assert chosen == again and set(chosen) == {3} and traced == pytest.approx(plain + 1.5 * cost(1))

    flat = replay.linear_cost(0.0, 0.5)
    ctl = ScriptedSizes(lambda n: 2 + (n + 1) % 2)  # 2, 3, 2, 3, ...: the first round of 3 traces its verify too
    total, chosen = replay.replay(ctl, trace, flat, replay.random.Random(0), 0.0, tracing=2.0)
    traced = [t for _, _, _, t in ctl.seen]
    assert chosen[:2] == [2, 3] and traced[:3] == [True, True, False] and not any(traced[2:])
    untraced = sum(flat(k) for k in chosen)
    assert total == pytest.approx(untraced + 2.0 + 2.0 * replay.NEW_SIZE_TRACING)

    rows = replay.evaluate(traces, one_shot=1.0)
    assert len(rows) == len(replay.evaluate(traces)) and all(r.trace.tokens for r in rows)
    big = [r.vs_plain for r in rows if r.model == "cpu-big"]
    assert min(big) >= 0.96, min(big)
    s = replay.summary(rows)
    assert s["min_vs_plain"] >= 0.96 and s["median_vs_plain"] >= 0.99, s


def test_a_round_queued_on_a_plain_step_runs_and_is_seen_as_cheaper_as_the_discount_says(traces):
    """--ahead-discount D models what stop 53 measured on a 2-core CPU: a drafting round queued on an unread
    plain step runs D plain steps cheaper than in a drafting stretch (its building overlapped the step), and
    the controller sees it so. Rounds of a stretch are charged in full."""

    trace = replay.Trace("x", "y", "z", "greedy", [0] * 30)  # no draft kept: every round emits one token
    cost = replay.linear_cost(0.1, 0.4)  # a round of 3 costs 2.0 plain steps
    ctl = ScriptedSizes(lambda n: 1 if n % 3 == 1 else 3)  # plain, 3, 3, ...: one queued round of 3 in three
    total, chosen = replay.replay(ctl, trace, cost, replay.random.Random(0), 0.0, ahead_discount=0.9)
    queued = [i for i in range(1, len(chosen)) if chosen[i] > 1 and chosen[i - 1] == 1]
    stretch = [i for i in range(1, len(chosen)) if chosen[i] > 1 and chosen[i - 1] > 1]
    assert queued and stretch
    assert total == pytest.approx(chosen.count(1) + 2.0 * len(stretch) + 1.1 * len(queued))
    assert {round(s, 6) for k, s, a, _ in ctl.seen if k == 3 and a} == {1.1}
    assert {round(s, 6) for k, s, a, _ in ctl.seen if k == 3 and not a} == {2.0}


def test_the_outcome_policy_bound_finds_a_policy_that_reacts_to_the_last_round():
    """`replay_autoblock.py --bound` fits, in hindsight, a block size per state (the last drafting round's
    outcome, the plain rounds since it) to judge how far from the best reachable the controller is. On replies
    whose drafts are all kept for a stretch and all rejected for the next, it must find what a fixed K cannot:
    a full block after a full round, no drafts after a rejected one, and a try after a few plain rounds."""
    runs: list[int] = []
    for _ in range(6):
        runs += [7] * 48 + [0] * 24  # 48 positions the drafter knows, 24 it does not
    trace = replay.Trace("x", "c", "long", "greedy", runs)
    cost = replay.MODELS["apple-dear"]  # a round of 8 costs 3.1 plain steps
    policy, total = replay.fit_outcome_policy([trace], cost, 8)
    assert total == pytest.approx(replay.outcome_policy_cost(policy, trace, cost))
    fixed = min(replay.fixed_cost(trace, k, cost) for k in range(1, 9))
    assert total < 0.85 * fixed
    all_kept, all_rejected = replay.OUTCOMES.index("all"), replay.OUTCOMES.index("zero")
    assert policy[(all_kept, 0)] == 8 and policy[(all_rejected, 0)] == 1
    assert any(policy[(all_rejected, s)] > 1 for s in range(1, replay.PLAIN_SINCE))  # it does not park for good


def test_the_bounds_are_ordered_and_one_k_per_pairing_never_loses_to_plain(traces):
    one = {"moe-style": traces["moe-style"]}
    b = replay.bounds(one)
    data, ts = traces["moe-style"]
    for model in ("cpu-big", "apple-cheap"):
        cost = replay.MODELS[model]
        clair = sum(replay.clairvoyant_cost(t, cost, data["k_max"]) for t in ts)
        plain = sum(t.tokens * cost(1) for t in ts)
        # one K for all replies is at least as good as plain decoding (K = 1 is one of them); on cpu-big, where
        # drafts never pay, it is plain decoding, as good as the clairvoyant
        assert b[model]["pairing_fixed"] >= clair / plain - 1e-9, model
    assert b["cpu-big"]["pairing_fixed"] == pytest.approx(1.0)
    for model, got in b.items():
        # one K for all of a pairing's replies is never better than each reply's own best K, and the fitted
        # policy starts from that one K; nothing beats the clairvoyant
        assert got["pairing_fixed"] <= got["per_reply_fixed"] + 1e-9 <= 1.0 + 1e-9, (model, got)
        assert got["pairing_fixed"] - 1e-9 <= got["fitted"] <= 1.0 + 1e-9, (model, got)
