"""The bench report says which figures are noise-bound (no model: a report built by hand)."""

from __future__ import annotations

from core.frontends.bench import BenchReport, ConfigSummary, format_markdown, format_table


def report(repeats: int, efficiency: float) -> BenchReport:
    def config(name: str, tps: float, effic: float | None) -> ConfigSummary:
        bound = tps / effic if effic else None
        return ConfigSummary(name, tps, [tps] * repeats, None, 1.0, bound, effic, None, True)

    return BenchReport(
        target="t",
        drafter="d",
        dtype="float32",
        prompt_tokens=10,
        max_tokens=8,
        repeats=repeats,
        simulate_acceptance=None,
        decode_step_s=0.01,
        verify_s={1: 0.01, 2: 0.012},
        draft_s={1: 0.002},
        configs=[config("off", 100.0, 0.95), config("K=2", 150.0, efficiency)],
    )


def test_a_single_repeat_above_its_bound_is_marked_noise_bound():
    # bench --repeats 1 once printed efficiency 1.171 with no word about it
    for text in (format_table(report(1, 1.171)), format_markdown(report(1, 1.171))):
        assert "1.171*" in text and "0.950*" not in text
        assert "* efficiency above 1 is noise-bound: faster than its own bound" in text
        assert "one repeat: every tok/s, bound and efficiency here is a single measurement, noise-bound" in text


def test_figures_within_their_bound_over_repeats_carry_no_note():
    text = format_table(report(3, 0.9))
    assert "0.900 " in text and "*" not in text and "noise" not in text
    assert "noise-bound" in format_table(report(3, 1.02))  # above 1 is noise whatever the repeats
