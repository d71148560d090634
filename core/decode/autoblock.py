"""Automatic block size: pick K (tokens verified per round, K-1 of them drafted) that maximises
expected tokens per second, from what recent rounds showed.

Model
- Each draft is accepted with probability alpha, independently, until the first rejection, so a
  block of K emits on average E(K) = 1 + alpha + ... + alpha^(K-1) = (1 - alpha^K) / (1 - alpha)
  tokens (the bonus token included).
- A round costs T(K) = t_verify(K) + (K-1) * t_draft, with t_verify(K) = a + b*(K-1) (a K-token
  target forward: on bandwidth-bound hardware b is small against a).
- Choose argmax_K E(K) / T(K) over k_min..k_max (ties -> smaller K), changing K only when the
  gain exceeds `hysteresis`, so noise does not make it flap.

Estimates
- alpha: accepted and rejected drafts counted with exponential forgetting (`alpha_decay` per
  round), plus `alpha_prior_weight` pseudo-drafts at `alpha_prior` that fade with the same decay
  as drafting rounds are observed (a prior that never faded kept alpha >= 0.1 with a drafter that
  never agrees, enough to keep drafting). A round with n of K-1 drafts accepted is n successes
  and, if n < K-1, one failure.
- times: per-K exponential moving averages of the measured round time (or of the verify time and
  the per-step draft time when the caller measures them apart), then a line through the
  per-K averages, pulled toward a prior slope when few block sizes have been tried (a ridge
  fit), so it can extrapolate to sizes it has not tried. A block size not run lately counts less
  (its weight halves every `time_half_life` rounds): otherwise a K = 1 time taken in a slow moment
  of the machine stays, K = 1 looks dear for ever and the controller never leaves drafting.
- K = 1 means no drafting. When K = 1 keeps winning, one round at `probe_k` measures acceptance
  again after `probe_every` K = 1 rounds, so the controller can come back when drafting pays. A
  probe is not free (it also breaks the pipelined plain decoding): each probe that accepts nothing
  doubles the wait before the next, up to `probe_every_max`; a probe that accepts anything, or
  drafting winning again, resets it. With a drafter that never agrees (the random-weight demo
  pairing) probing every 16 rounds cost ~20 % of plain decoding; backed off, auto runs within
  noise of K = 1 there.

Pure Python, deterministic: the same observations give the same choices.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class AutoChoice:
    """One choice of the controller: the block size, why (a code), and what it believes, in words."""

    block_size: int
    reason: str  # "drafting" | "parked" (K = 1: drafts do not pay) | "probe" (one round to re-measure)
    note: str


def expected_tokens(k: int, alpha: float) -> float:
    """Mean tokens emitted by a block of k (k-1 drafts + the target's own token)."""
    if alpha >= 1.0:
        return float(k)
    return (1.0 - alpha**k) / (1.0 - alpha)


@dataclass
class AutoBlockConfig:
    k_min: int = 1
    k_max: int = 8
    alpha_prior: float = 0.6
    alpha_prior_weight: float = 2.0  # in drafts
    alpha_decay: float = 0.9  # per observed round
    time_ewma: float = 0.25  # weight of a new time measurement
    time_half_life: float = 64.0  # rounds after which a block size's time counts half
    draft_cost_prior: float = 0.15  # one draft step / one target step, before any measurement
    verify_slope_prior: float = 0.03  # extra verify cost per extra token / one target step
    probe_every: int = 16  # K = 1 rounds before a probe
    probe_every_max: int = 256  # the wait after failed probes doubles up to this
    probe_k: int = 2
    hysteresis: float = 0.03  # relative gain needed to move away from the current K

    def __post_init__(self) -> None:
        if not 1 <= self.k_min <= self.k_max:
            raise ValueError("need 1 <= k_min <= k_max")
        if not 1 <= self.probe_every <= self.probe_every_max:
            raise ValueError("need 1 <= probe_every <= probe_every_max")
        if not 0.0 <= self.alpha_prior <= 1.0 or not 0.0 < self.alpha_decay <= 1.0:
            raise ValueError("alpha_prior must be in [0, 1] and alpha_decay in (0, 1]")


@dataclass
class _Ewma:
    value: float = 0.0
    count: int = 0
    last: int = 0  # the controller's round count at the last update

    def add(self, x: float, weight: float, now: int = 0) -> None:
        self.value = x if self.count == 0 else (1.0 - weight) * self.value + weight * x
        self.count += 1
        self.last = now


@dataclass
class AutoBlock:
    """Block-size controller for one target/drafter pair.

    Per round: `k = ctl.choose()`, run the round, then
    `ctl.observe(k, accepted, round_s=...)` (or with `draft_s` and `verify_s` measured apart).
    Rounds of a fixed, user-chosen K may be observed too; they keep the estimates fresh.
    """

    config: AutoBlockConfig = field(default_factory=AutoBlockConfig)
    _accepted: float = 0.0
    _rejected: float = 0.0
    _round_time: dict[int, _Ewma] = field(default_factory=dict)
    _verify_time: dict[int, _Ewma] = field(default_factory=dict)
    _draft_step: _Ewma = field(default_factory=_Ewma)
    _current: int | None = None
    _k1_streak: int = 0
    _probe_wait: int = field(init=False)  # K = 1 rounds before the next probe
    _probing: bool = False  # the last choice was a probe
    _draft_rounds: int = 0  # rounds with drafts observed (fades the alpha prior)
    rounds: int = 0

    def __post_init__(self) -> None:
        self._probe_wait = self.config.probe_every

    # -- estimates ----------------------------------------------------------------------

    @property
    def alpha(self) -> float:
        c = self.config
        prior = c.alpha_prior_weight * c.alpha_decay**self._draft_rounds
        return (self._accepted + c.alpha_prior * prior) / (self._accepted + self._rejected + prior)

    def round_time(self, k: int) -> float:
        """Predicted seconds for a round of block size k (relative units before any timing)."""
        c = self.config
        if self._verify_time:
            a, b = _line(self._verify_time, c.verify_slope_prior, c, self.rounds, min_ratio=0.01)
            step = self._draft_step.value if self._draft_step.count else c.draft_cost_prior * a
            return a + (b + step) * (k - 1)
        if self._round_time:
            # a round of K > 1 also drafts: it costs at least a few % more than a plain step
            a, b = _line(self._round_time, c.draft_cost_prior + c.verify_slope_prior, c, self.rounds, min_ratio=0.05)
            return a + b * (k - 1)
        return 1.0 + (c.draft_cost_prior + c.verify_slope_prior) * (k - 1)

    def rate(self, k: int) -> float:
        """Expected tokens per second (per unit time) at block size k."""
        return expected_tokens(k, self.alpha) / self.round_time(k)

    def best(self) -> int:
        """argmax of `rate` over the allowed sizes, with hysteresis around the current K."""
        c = self.config
        ks = range(c.k_min, c.k_max + 1)
        rates = {k: self.rate(k) for k in ks}
        best = max(ks, key=lambda k: (rates[k], -k))
        cur = self._current
        if cur is not None and cur in rates and rates[best] <= rates[cur] * (1.0 + c.hysteresis):
            return cur
        return best

    # -- per round ----------------------------------------------------------------------

    def choose(self) -> int:
        """Block size for the next round."""
        c = self.config
        k = self.best()
        self._current = k
        self._probing = False
        if k == 1 and c.k_max >= 2:
            self._k1_streak += 1
            if self._k1_streak > self.probe_wait:
                self._k1_streak = 0
                self._probing = True
                return max(2, min(c.probe_k, c.k_max))
        else:
            self._k1_streak = 0
            self._probe_wait = c.probe_every  # drafting pays again: probe eagerly next time
        return k

    def decide(self) -> AutoChoice:
        """`choose()`, with the reason and a sentence for the user (the panel shows it as it is)."""
        k = self.choose()
        accepted = f"{self.alpha * 100:.0f} % of drafts accepted lately"
        if self._probing:
            return AutoChoice(k, "probe", f"auto → {k}: one round to see if drafts pay again ({accepted})")
        if k == 1:
            left = max(self.probe_wait - self._k1_streak, 0)
            return AutoChoice(k, "parked", f"auto → 1: drafts not paying ({accepted}); trying again in {left} rounds")
        return AutoChoice(k, "drafting", f"auto → {k}: drafting pays ({accepted})")

    @property
    def probe_wait(self) -> int:
        """K = 1 rounds before the next probe."""
        return self._probe_wait

    def observe(
        self,
        k: int,
        accepted: int,
        *,
        round_s: float | None = None,
        draft_s: float | None = None,
        verify_s: float | None = None,
    ) -> None:
        """Record a finished round: block size k, drafts accepted (0..k-1), and its timing.

        round_s: whole round; draft_s / verify_s: its two parts when measured apart (then
        round_s is not needed). Missing times only update the acceptance estimate.
        """
        c = self.config
        if k < 1 or not 0 <= accepted <= k - 1:
            raise ValueError(f"bad observation: k={k}, accepted={accepted}")
        self.rounds += 1
        if self._probing and k > 1:
            self._probing = False
            self._probe_wait = c.probe_every if accepted else min(2 * self._probe_wait, c.probe_every_max)
        if k > 1:
            self._draft_rounds += 1
            self._accepted = self._accepted * c.alpha_decay + accepted
            self._rejected = self._rejected * c.alpha_decay + (1 if accepted < k - 1 else 0)
        if verify_s is not None:
            self._verify_time.setdefault(k, _Ewma()).add(verify_s, c.time_ewma, self.rounds)
            if k > 1 and draft_s is not None:
                self._draft_step.add(draft_s / (k - 1), c.time_ewma, self.rounds)
        total = round_s if round_s is not None else (verify_s + (draft_s or 0.0) if verify_s is not None else None)
        if total is not None:
            self._round_time.setdefault(k, _Ewma()).add(total, c.time_ewma, self.rounds)


def _line(
    points: dict[int, _Ewma], prior_ratio: float, config: AutoBlockConfig, now: int, min_ratio: float
) -> tuple[float, float]:
    """Intercept a = time at K=1 and slope b per extra token, from per-K averages.

    Weighted least squares (weight = rounds averaged, capped at the EWMA's effective sample
    size, halved every `time_half_life` rounds since the block size was last run) with a ridge
    pull toward the prior slope prior_ratio * a, worth one round one block size away. The slope
    is kept >= min_ratio * a.
    """
    cap = (2.0 - config.time_ewma) / config.time_ewma
    ks = sorted(points)
    w = [min(points[k].count, cap) * 0.5 ** ((now - points[k].last) / config.time_half_life) for k in ks]
    t = [points[k].value for k in ks]
    x = [k - 1 for k in ks]
    sw = sum(w)
    mx = sum(wi * xi for wi, xi in zip(w, x)) / sw
    mt = sum(wi * ti for wi, ti in zip(w, t)) / sw
    sxx = sum(wi * (xi - mx) ** 2 for wi, xi in zip(w, x))
    sxt = sum(wi * (xi - mx) * (ti - mt) for wi, xi, ti in zip(w, x, t))
    # the prior slope, with `a` guessed from the (weighted) mean point under the prior ratio
    a_guess = mt / (1.0 + prior_ratio * mx)
    prior_slope = prior_ratio * a_guess
    slope = (sxt + prior_slope) / (sxx + 1.0)
    intercept = mt - slope * mx
    if intercept <= 0:  # noise on tiny timings: fall back to the prior shape
        intercept, slope = a_guess, prior_slope
    # a verify or draft step is never free; keep the slope from going to zero or below
    slope = max(slope, min_ratio * intercept)
    return intercept, slope
