"""app.prefill_eta: a prefill's time left from its recent rate, not its average since the start."""

from app.prefill_eta import RATE_WINDOW_S, PrefillClock


def test_the_time_left_follows_the_last_seconds_of_a_prefill_that_slows_down():
    # 1,000 tokens a second for 10 s, then 250 a second (a long context's chunks cost more)
    clock = PrefillClock(started=100.0)
    assert clock.seconds_left(0, 20_000, now=100.5) is None  # no progress yet: no guess
    for t in range(1, 11):
        clock.seconds_left(1000 * t, 20_000, now=100.0 + t)
    done = 10_000
    for t in range(11, 17):
        done += 250
        left = clock.seconds_left(done, 20_000, now=100.0 + t)
    assert left is not None
    recent = (20_000 - done) / 250  # 33 s at the rate of the last seconds
    average = (20_000 - done) * 16 / done  # 15 s at the average since the start: far too hopeful
    assert abs(left - recent) < 0.1 * recent and left > 1.5 * average
    assert 100.0 + 16 - clock.samples[0][0] <= RATE_WINDOW_S + 1  # old samples are let go


def test_before_the_window_fills_the_rate_counts_from_the_start():
    clock = PrefillClock(started=0.0)
    assert clock.seconds_left(500, 1500, now=1.0) == 2.0  # 500 tokens in 1 s: 1,000 left at 500/s
    assert clock.seconds_left(1000, 1500, now=2.0) == 1.0
