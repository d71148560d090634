"""`gemma-chat bench`: every configuration runs and reports; simulated acceptance forces what it says
and never changes the greedy output. No timing is asserted (the machine is shared)."""

import json
from pathlib import Path

import pytest

from app.cli import main
from core.frontends.bench import (
    BenchOptions,
    RunResult,
    SimulatedDrafter,
    bound_tps,
    format_table,
    median_repeat,
    parse_block_sizes,
    run_bench,
    run_ours,
)
from core.model.drafter import load_drafter
from core.model.loader import load_tokenizer
from core.model.target import load_target

PACK = "tests/data/pack/models"
N = 24


def test_bench_end_to_end_table_and_json(factory_checkpoints):
    target, drafter = factory_checkpoints.pairing("e-style")
    report = run_bench(
        target, drafter, BenchOptions(max_tokens=6, repeats=1, block_sizes=[2, 3, "auto"], cost_repeats=1)
    )
    names = [c.config for c in report.configs]
    assert all(c.bound_tps for c in report.configs[1:4])  # the last rounds shrink: their sizes are measured too
    assert names == ["mlx-lm", "off", "K=2", "K=3", "auto"]
    for c in report.configs:
        assert c.tps > 0 and len(c.tps_runs) == 1
        assert c.matches_teacher  # float32: mlx-lm, plain and drafted greedy all agree
    for c in report.configs[1:]:
        assert c.vs_baseline > 0
    for c in report.configs[1:4]:  # auto's rounds may use sizes that were not measured: no bound then
        assert c.bound_tps > 0 and c.efficiency > 0
    assert report.config("off").tokens_per_round == 1.0 and report.config("off").acceptance is None
    assert 0 <= report.config("K=3").acceptance <= 1
    assert set(report.verify_s) >= {1, 2, 3} and set(report.draft_s) == {1, 2} and report.draft_s[1] > 0
    table = format_table(report)
    for name in names:
        assert f"\n{name} " in table
    assert "best block size:" in table and "verify cost / decode step: K=2" in table
    d = json.loads(json.dumps(report.as_dict()))
    assert [c["config"] for c in d["configs"]] == names and d["best"] in names[1:]
    assert set(d["verify_ratio"]) >= {"1", "2", "3"} and d["verify_ratio"]["1"] == 1.0
    # prefill: mlx-lm and ours on the same long prompt, each timed as a one-token run
    assert report.prefill_tokens >= BenchOptions().prefill_tokens
    assert set(report.prefill_tps) == {"mlx-lm", "off"} and all(v > 0 for v in report.prefill_tps.values())
    assert report.prefill_vs_baseline == pytest.approx(report.prefill_tps["off"] / report.prefill_tps["mlx-lm"])
    assert f"prefill, {report.prefill_tokens}-token prompt (median of 1): mlx-lm " in table
    assert d["prefill_vs_baseline"] > 0 and len(d["prefill_runs"]["off"]) == 1


def test_prefill_timing_runs_the_same_prompt_through_both(factory_checkpoints):
    """The long prompt is a whole chat turn of at least n tokens, and mlx-lm and our loop read it
    alike: the same first token (float32), so the two timings are of the same work."""
    from core.frontends.bench import prefill_prompt, run_mlx_lm

    target, _ = factory_checkpoints.pairing("e-style")
    tg, tok = load_target(target), load_tokenizer(target)
    short = prefill_prompt(tok, "Hello there.", 1)
    ids = prefill_prompt(tok, "Hello there.", 300)
    assert len(ids) >= 300 and ids[:4] == short[:4] and ids[-4:] == short[-4:]  # the same chat framing
    assert tok.decode(ids).count("Hello there.") > 10
    blank = prefill_prompt(tok, " ", 300)  # an empty prompt text falls back to the default one
    assert len(blank) >= 300 and "lighthouse" in tok.decode(blank)
    tok.eos_token_ids = set()
    ours = run_ours(tg, None, tok, set(), ids, 1, None)
    theirs = run_mlx_lm(tg.model, tok, ids, 1)
    assert ours.token_ids == theirs.token_ids and len(ours.token_ids) == 1


def test_prefill_timing_can_be_skipped_and_is_capped_by_the_context(factory_checkpoints, tmp_path):
    from support.factory import build_pairing

    target, _ = factory_checkpoints.pairing("e-style")
    o = BenchOptions(max_tokens=4, repeats=1, block_sizes=[2], cost_repeats=1, prefill_tokens=0)
    report = run_bench(target, None, o)
    assert report.prefill_tokens == 0 and report.prefill_tps == {} and "prefill," not in format_table(report)
    small, _ = build_pairing(tmp_path, "e-style", config_overrides={"max_position_embeddings": 256})
    huge = BenchOptions(max_tokens=4, repeats=1, block_sizes=[2], cost_repeats=1, prefill_tokens=10**6)
    report = run_bench(small, None, huge)
    assert 128 <= report.prefill_tokens < 256 - 16 and set(report.prefill_tps) == {"mlx-lm", "off"}


def test_rows_reconcile_tps_equals_efficiency_times_bound(factory_checkpoints):
    """Each row is one repeat, its median by tok/s: tok/s, bound and effic agree with each other
    (medians taken column by column did not: K=5 179.2 tok/s, bound 129.4, effic 0.845)."""
    target, drafter = factory_checkpoints.pairing("e-style")
    report = run_bench(target, drafter, BenchOptions(max_tokens=6, repeats=3, block_sizes=[2, 3], cost_repeats=1))
    for c in report.configs:
        assert c.tps == sorted(c.tps_runs)[1]  # the median repeat's own figure
        if c.config != "mlx-lm":
            assert c.bound_tps > 0
            assert c.tps == pytest.approx(c.efficiency * c.bound_tps, rel=1e-9)
    assert "tok/s = effic x bound" in format_table(report)


def test_median_repeat_takes_the_lower_middle_for_an_even_count():
    runs = [RunResult("off", tps, 6) for tps in (30.0, 10.0, 40.0, 20.0)]
    assert median_repeat(runs) == 3  # 20.0: the lower of the middle two
    assert median_repeat(runs[:3]) == 0  # 30.0 of 10, 30, 40


def test_bench_cli_json_with_simulated_acceptance(factory_checkpoints, capsys):
    target, drafter = factory_checkpoints.pairing("e-style")
    rc = main(
        [
            "bench",
            "--model",
            str(target),
            "--drafter",
            str(drafter),
            "--max-tokens",
            "8",
            "--repeats",
            "1",
            "--block-sizes",
            "4",
            "--simulate-acceptance",
            "1",
            "--json",
        ]
    )
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["simulate_acceptance"] == 1.0
    k4 = next(c for c in out["configs"] if c["config"] == "K=4")
    assert k4["acceptance"] == 1.0 and k4["matches_teacher"]
    assert k4["tokens_per_round"] > 2  # 7 tokens after the first: rounds of 4 then 3


def test_bench_cli_refuses_bad_block_sizes(capsys):
    assert main(["bench", "--demo", "--block-sizes", "1,3"]) == 1
    assert "--block-sizes" in capsys.readouterr().err
    assert main(["bench", "--demo", "--prefill-tokens", "-1"]) == 1
    assert "--prefill-tokens >= 0" in capsys.readouterr().err


def test_parse_block_sizes_and_bound():
    assert parse_block_sizes("2, 3,auto") == [2, 3, "auto"]
    for bad in ("1", "x", "17"):
        with pytest.raises(ValueError):
            parse_block_sizes(bad)
    run = RunResult("K=3", tps=20.0, tokens=31, rounds=10, drafted=20, accepted=20, block_size_counts={3: 10})
    # 30 tokens over 10 rounds of (verify 0.1 s + a 2-step draft chain of 0.02 s)
    assert bound_tps(run, {1: 0.05, 3: 0.1}, {1: 0.015, 2: 0.02}) == pytest.approx(25.0)
    assert bound_tps(run, {1: 0.05, 3: 0.1}, {1: 0.015}) is None  # a size that was not measured
    assert run.tokens_per_round == 3.0 and run.acceptance == 1.0


@pytest.fixture(scope="module")
def pack_pair():
    """The trained e-style pack pair: its drafter's own acceptance is well above zero."""
    tg = load_target(f"{PACK}/e-style-target")
    dr = load_drafter(f"{PACK}/e-style-assistant")
    tok = load_tokenizer(f"{PACK}/e-style-target")
    ref = json.load(open("tests/data/pack/references/text/e-style.json"))["prompts"]["long"]
    ids = ref["prompt_ids"]
    teacher = run_ours(tg, None, tok, set(), ids, N, None)
    assert teacher.token_ids == ref["greedy_no_eos_stop"]["ids"][:N]
    return tg, dr, tok, ids, teacher


@pytest.mark.parametrize("k", [3, 5])
def test_alpha_one_accepts_every_draft(pack_pair, k):
    tg, dr, tok, ids, teacher = pack_pair
    sim = SimulatedDrafter(dr, ids + teacher.token_ids, 1.0)
    r = run_ours(tg, sim, tok, set(), ids, N, k)
    assert r.token_ids == teacher.token_ids
    assert r.accepted == r.drafted and r.acceptance == 1.0
    # every round emits its whole block; only the last may be shorter, to fit max_tokens
    assert sum(kk * n for kk, n in r.block_size_counts.items()) == N - 1
    assert r.block_size_counts[k] == (N - 1) // k and r.rounds == -(-(N - 1) // k)


def test_alpha_zero_is_the_drafters_own_acceptance(pack_pair):
    tg, dr, tok, ids, teacher = pack_pair
    own = run_ours(tg, dr, tok, set(), ids, N, 4)
    sim = run_ours(tg, SimulatedDrafter(dr, ids + teacher.token_ids, 0.0), tok, set(), ids, N, 4)
    assert sim.token_ids == own.token_ids == teacher.token_ids
    assert (sim.accepted, sim.drafted, sim.rounds) == (own.accepted, own.drafted, own.rounds)
    assert 0 < own.accepted < own.drafted


def test_partial_alpha_keeps_the_output_and_lands_between(pack_pair):
    tg, dr, tok, ids, teacher = pack_pair
    own = run_ours(tg, dr, tok, set(), ids, N, 4)
    half = run_ours(tg, SimulatedDrafter(dr, ids + teacher.token_ids, 0.6, seed=3), tok, set(), ids, N, 4)
    assert half.token_ids == teacher.token_ids
    assert own.acceptance < half.acceptance < 1.0


def test_bench_report_writes_a_markdown_table(factory_checkpoints, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    target, drafter = factory_checkpoints.pairing("e-style")
    out = tmp_path / "bench.md"
    args = ["bench", "--model", str(target), "--drafter", str(drafter), "--max-tokens", "4", "--repeats", "1"]
    rc = main(args + ["--block-sizes", "2", "--report", str(out)])
    assert rc == 0
    text = out.read_text()
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    assert rows[0].startswith("| config | tok/s | x mlx-lm")
    assert [r.split("|")[1].strip() for r in rows[1:]] == ["mlx-lm", "off", "K=2"]
    assert "MLX " in text and "cpu" in text.lower() and Path(target).name in text
    off = rows[2].split("|")
    assert float(off[2]) > 0 and float(off[3]) > 0 and off[4].strip() == "1.000"  # off vs itself
    captured = capsys.readouterr()
    assert "| config |" in text and "Markdown report written" in captured.err
    assert any(len(line) > 80 for line in captured.out.splitlines())  # a pipe: one line per entry
    # a report path in a missing directory is refused before anything runs
    assert main(args + ["--report", str(tmp_path / "nope" / "x.md")]) == 1
    assert "no such directory" in capsys.readouterr().err


def test_the_bench_table_fits_the_terminal(factory_checkpoints, capsys, monkeypatch):
    """At 80 columns the long lines (the BLAS line, the costs, the notes) wrap between words, indented
    under their first line; the table's rows are as they were."""
    target, drafter = factory_checkpoints.pairing("e-style")
    monkeypatch.setenv("COLUMNS", "80")
    args = ["bench", "--model", str(target), "--drafter", str(drafter), "--max-tokens", "4", "--repeats", "1"]
    assert main(args + ["--block-sizes", "2", "--prefill-tokens", "0"]) == 0
    lines = capsys.readouterr().out.splitlines()
    # a path longer than a line stays whole on a line of its own (a copy of it stays intact)
    assert lines and all(len(line) <= 80 or len(line.split()) == 1 for line in lines), lines
    assert any(line.startswith("K=2 ") for line in lines) and any(line.startswith("  ") for line in lines)


def test_bench_runs_auto_as_a_session_from_the_costs_this_machine_kept(factory_checkpoints):
    """auto's row is what the app does: one controller across the runs (a chat's replies), started from the
    block costs and acceptance kept for the pairing on this machine, and the file only read. A cold
    controller per run measured a first session's first reply every time: it times plain steps, then tries
    drafts on the prior alone (the dense-style pack pairing: 0.92x of drafter off)."""
    from core.engine.contract import PairingSpec
    from core.engine.local import block_costs_path
    from core.frontends.bench import _prepare

    target, drafter = factory_checkpoints.pairing("e-style")
    path = block_costs_path(Path(target), Path(drafter), PairingSpec(Path(target).name, str(target), str(drafter)))
    assert path is not None
    path.unlink(missing_ok=True)
    options = BenchOptions(max_tokens=8, repeats=2, block_sizes=["auto"], cost_repeats=1, prefill_tokens=0)
    cold = run_bench(target, drafter, options)
    assert "auto: one controller across the runs, cold" in format_table(cold)
    assert cold.config("auto").acceptance is not None  # the prior says drafts may pay: a cold one tries them
    assert not path.exists()

    # kept costs that say no drafter could pay here: every auto round is a plain step, from the first
    path.parent.mkdir(parents=True, exist_ok=True)
    kept = {"version": 1, "ratios": {"2": 4.0, "3": 7.0}, "acceptance": {"greedy": [0.5] * 7}, "first_draft": 0.0}
    path.write_text(json.dumps(kept))
    try:
        report = run_bench(target, drafter, options)
        auto = report.config("auto")
        assert auto.acceptance is None and auto.tokens_per_round == 1.0 and auto.matches_teacher
        assert f"from the block costs this machine kept ({path})" in format_table(report)
        assert json.loads(path.read_text()) == kept  # read, never written: simulated acceptance must not land
        # one controller for every run of auto
        bench = _prepare(Path(target), Path(drafter), options, lambda s: None)
        assert bench.auto is not None
        bench.run("auto", bench.drafter_for(0), 8)
        before = bench.auto.rounds
        bench.run("auto", bench.drafter_for(1), 8)
        assert before > 0 and bench.auto.rounds == 2 * before
    finally:
        path.unlink(missing_ok=True)
