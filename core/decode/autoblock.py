"""Automatic block size: the K (tokens verified per round, K - 1 of them drafted) with the most
expected tokens per second, K = 1 (no drafting) included, from this machine's own rounds.

Acceptance (per draft position, DESIGN.md section 10)
- a_i is the chance that draft i is accepted given drafts 1..i-1 were; a round of block size K emits
      E(K) = 1 + a_1 + a_1 a_2 + ... + a_1 ... a_{K-1}      tokens on average (the target's own included).
- A round of K with n accepted tells: positions 1..n accepted, position n + 1 rejected (if n < K - 1),
  deeper ones unseen. Counts fade by `acceptance_decay` per drafting round (a window of a few rounds).
  a_1 leans on `acceptance_prior`, each deeper a_i on a_{i-1} (a position seldom reached is believed as
  likely as the one before: in text the drafter knows, long runs go on), so a good stretch reaches deep
  blocks within a few rounds.
- Change: `change_run` first drafts rejected in a row that the estimate made less likely than `surprise`
  mean the text changed (a reply drifting off what the drafter knows): the counts before them shrink to
  `change_keep`. A new turn keeps `turn_keep` of the counts. Greedy and sampled turns keep separate
  counts: rejection sampling keeps a draft with probability min(1, p/q), not when it is the argmax.

Costs (of this machine, measured)
- T(1) is the median of the last plain steps' times; T(K) for K >= 2 is kept as the ratio T(K) / T(1)
  (so a machine that gets busier slows both and the ratio stands), the median of that size's last
  rounds, blended with a line a + b (K - 1) through all sizes' ratios that fills in sizes not tried yet
  (a ridge fit pulled toward a prior slope). Before any drafting round the ratio is
  1 + (draft_cost + verify_slope) (K - 1), draft_cost the caller's hint (the drafter's bytes and layers
  against the target's: a 4-bit drafter is cheaper). Only clean times count (see `observe`); plain
  steps are timed now and then while drafting, and three of them before the first drafting round.
- Kept between sessions (`save_costs`): a session primed with them drafts from its first round, its
  ratios taken against a T(1) guessed from the primed costs until a plain step is timed. Those compare
  the sizes but echo the primed costs back, so they are not kept: only ratios to a timed plain step
  are (else a busy moment's costs would pass from session to session, never measured again). Kept
  costs too low (timed against a busy moment's T(1)) would have it draft where drafts lose for as long
  as no plain step is timed, so it times one `primed_timing_at` rounds in (`primed_timing_sure_at` where
  the first draft is believed kept `primed_timing_sure` of the time: a short reply's drafts pay anyway,
  and its three plain rounds would cost it most); its first `STALE_CHECK_ROUNDS` rounds of a kept size
  timed against it, their median `stale_margin` dearer than kept, drop the kept costs (`_check_kept`).
- Choice: argmax_K E(K) / T(K), ties to the smaller K, a little hysteresis, a block at most twice the
  last round's tokens and twice the largest size timed (a new turn starts at `turn_start_k`), but that
  cap never parks the controller where a larger size could pay (on the demo on a CPU only blocks of 6+
  paid, and every second reply parked at its first round), and now and then a neighbouring size, so one
  slow moment cannot leave a size untried for ever.

Parked (K = 1 wins)
- Every round is the plain step and the controller does O(1) work per round. After `probe_wait` plain
  rounds it probes: one round at the smallest block that could beat a plain step if every draft were
  kept. The wait is set from the probe's measured extra cost so probes take about `probe_budget` of the
  parked time; it doubles after every probe that does not bring drafting back, probes go on at once
  while they are accepted, and a new turn probes in its first rounds. When even a drafter that is always
  right could not pay at the measured costs, it does not probe at all; where only kept costs say so,
  one round of 2 checks them once a session, and kept costs it finds stale are forgotten.

Pure Python, deterministic: the same observations give the same choices. scripts/replay_autoblock.py
replays it on recorded acceptance traces under several cost models.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

ACCEPTANCE_SNAPSHOT_ROUNDS = 4  # drafting rounds a session needs before its long-run acceptance is kept
ACCEPTANCE_PRIME_ROUNDS = 4  # drafting rounds an earlier session's acceptance counts as
STALE_CHECK_ROUNDS = 3  # a session's first rounds of a kept size, timed against a plain step, that check it
# plain steps a process's first drafting round costs beyond its own, before this machine measured it (it
# traces the drafter's and the verify's compiled functions; measured on a 2-core Xeon: 1.5-1.8 plain steps,
# ~4.5 ms on the dense-style pack pairing and ~15 ms on the demo)
FIRST_DRAFT_PRIOR = 2.0


@dataclass(frozen=True)
class AutoChoice:
    """One choice of the controller: the block size, why (a code), and what it believes, in words."""

    block_size: int
    # "drafting" | "parked" (K = 1: drafts do not pay) | "probe" (one round to re-measure acceptance) |
    # "timing" (one plain round to re-measure a plain step) | "room" (the reply ends within the block)
    reason: str
    note: str
    acceptance: tuple[float, ...] = ()  # believed a_1, a_2, ... (chance draft i is kept given i-1 were)


def expected_tokens(k: int, alpha: float) -> float:
    """Mean tokens emitted by a block of k (k-1 drafts + the target's own token) at one acceptance rate."""
    if alpha >= 1.0:
        return float(k)
    return (1.0 - alpha**k) / (1.0 - alpha)


def expected_tokens_per_position(k: int, acceptance: list[float] | tuple[float, ...]) -> float:
    """E(k) = 1 + a_1 + a_1 a_2 + ... over the first k - 1 positions."""
    total, run = 1.0, 1.0
    for a in acceptance[: k - 1]:
        run *= a
        total += run
    return total


@dataclass
class AutoBlockConfig:
    k_min: int = 1
    k_max: int = 8
    acceptance_prior: float = 0.5  # a_1 before any round
    acceptance_prior_weight: float = 1.0  # pseudo-drafts behind it (and behind the long-run a_i)
    position_weight: float = 1.0  # pseudo-drafts tying each a_i to a_{i-1}
    acceptance_decay: float = 0.85  # per drafting round
    slow_decay: float = 0.9  # per drafting round: the pairing's long-run acceptance, the fast one's prior
    long_decay: float = 0.98  # per drafting round: the long-run estimate the slow one leans on
    park_confidence: float = 0.5  # standard errors of the 1st draft's acceptance that must rule drafting out
    parked_decay: float = 1.0  # per parked round: what the last drafting rounds said grows stale
    turn_keep: float = 0.45  # share of the acceptance counts a new turn keeps
    change_run: int = 3  # first drafts rejected in a row before the controller asks whether the text changed:
    surprise: float = 0.01  # a run less likely than this under the estimate is a change ...
    change_keep: float = 0.1  # ... and the counts before it shrink to this share
    draft_cost_prior: float = 0.15  # one draft step / one plain step, before any measurement
    verify_slope_prior: float = 0.03  # extra verify cost per extra token / one plain step
    time_window: int = 9  # rounds whose median is a block size's cost
    probe_budget: float = 0.01  # share of the parked time probes may cost
    probe_every_min: int = 4  # plain rounds before the first probe
    probe_every_max: int = 256  # the wait after failed probes doubles up to this
    probe_k: int = 2
    probe_burst: int = 4  # probes in a row while they are accepted
    pay_margin: float = 0.08  # a size "could pay" when k tokens cost under k / (1 + this) plain steps
    ramp: int = 3  # a block at most this many times the last round's tokens
    turn_start_k: int = 3  # the largest block of a turn's first drafting round
    turn_probe_after: int = 1  # a parked controller probes this many rounds into a new turn
    refresh_every: int = 16  # parked rounds between re-checks of the probe wait against T(1)
    explore_every: int = 16  # drafting rounds between tries of a neighbouring size
    ridge: float = 0.5  # rounds one block size away that the prior slope counts as
    plain_timing_every: int = 64  # while drafting, a plain round if none was timed for this many rounds
    primed_timing_at: int = 4  # a primed session times its first plain step this many rounds in
    primed_timing_sure: float = 0.8  # ... or, where it believes the first draft kept at least this often,
    primed_timing_sure_at: int = 16  # this many rounds in
    hysteresis: float = 0.02  # relative gain needed to move away from the current K
    park_margin: float = 0.03  # relative gain plain decoding needs before the controller stops drafting
    stale_margin: float = 0.25  # kept costs this far off a check (under) or a first timing (over): stale
    first_draft_horizon: int = 32  # tokens in which a process's first drafting round must pay back its tracing
    # a session primed with kept acceptance starts its slow and fast windows with this many rounds of it, as
    # a session that had drafted before would hold: one kept probe alone then moves the belief less
    kept_slow_rounds: float = 2.0
    kept_fast_rounds: float = 1.0

    def __post_init__(self) -> None:
        if not 1 <= self.k_min <= self.k_max:
            raise ValueError("need 1 <= k_min <= k_max")
        if not 1 <= self.probe_every_min <= self.probe_every_max:
            raise ValueError("need 1 <= probe_every_min <= probe_every_max")
        if not 0.0 <= self.acceptance_prior <= 1.0 or not 0.0 < self.acceptance_decay <= 1.0:
            raise ValueError("acceptance_prior must be in [0, 1] and acceptance_decay in (0, 1]")


@dataclass
class _Cost:
    """A running cost robust to a shared machine: the median of the last `window` samples (another
    process taking the core for a moment inflates a few rounds, not the estimate)."""

    value: float = 0.0
    count: int = 0
    last: int = 0  # the controller's round count at the last update
    recent: list[float] = field(default_factory=list)
    guessed: list[bool] = field(default_factory=list)  # per sample of `recent`: a ratio to a guessed T(1)
    primed: float | None = None  # the cost an earlier session kept
    own: int = 0  # samples from this session's rounds
    timed: list[float] = field(default_factory=list)  # this session's first ratios to a timed plain step

    def add(self, x: float, window: int, now: int, guessed: bool = False) -> None:
        self.recent = (self.recent + [x])[-window:]
        self.guessed = (self.guessed + [guessed])[-window:]
        self.value = statistics.median(self.recent)
        self.count += 1
        self.own += 1
        self.last = now

    def kept(self) -> float | None:
        """The cost to keep for the next session: the median of the samples timed against a plain step, else
        the one an earlier session kept. A ratio to a T(1) guessed from the primed costs echoes them back;
        kept as measured, a busy moment's costs would pass from session to session, never measured again."""
        timed = [x for x, g in zip(self.recent, self.guessed) if not g]
        if len(timed) == 1 and timed[0] <= 1.0:
            # a lone round timed under a plain step (clamped to one) is a timing artefact, not a cost: kept, it
            # told every later session "a round of 3 costs 1.0 plain steps" (the e-style pack pairing's file,
            # beside 1.77 for a round of 2 and 2.66 for a round of 4)
            return self.primed
        return statistics.median(timed) if timed else self.primed


@dataclass
class _Acceptance:
    """Faded counts per draft position: accepted[i], seen[i] for position i + 1."""

    accepted: list[float]
    seen: list[float]
    rounds: int = 0  # drafting rounds observed

    @classmethod
    def empty(cls, positions: int) -> _Acceptance:
        return cls([0.0] * positions, [0.0] * positions)

    def observe(self, k: int, ns: Sequence[int], decay: float) -> None:
        """One round of block size k: each row's accepted drafts `ns` (one for a single sequence). A
        batch's rows share the round's one observation (each weighs 1 / rows): the estimates fade per
        round, as for one sequence, and the share of rows that kept each draft is not rounded away."""
        self.rounds += 1
        for i in range(len(self.seen)):
            self.accepted[i] *= decay
            self.seen[i] *= decay
        w = 1.0 / len(ns)
        for n in ns:
            for i in range(min(n + 1, k - 1)):
                self.seen[i] += w
                if i < n:
                    self.accepted[i] += w

    def scale(self, keep: float) -> None:
        self.accepted = [a * keep for a in self.accepted]
        self.seen = [s * keep for s in self.seen]

    def estimates(self, c: AutoBlockConfig, prior: list[float] | None = None) -> list[float]:
        """a_1 leans on `acceptance_prior`, each deeper a_i on a_{i-1}: a position seldom reached is
        believed as likely as the one before it (in text the drafter knows, a run that got this far
        tends to go on), so the first rounds of a good stretch reach deep blocks, and a first draft
        rejected again and again drags the deeper beliefs down with it. With `prior` (the long-run
        estimates), each a_i also leans on the long-run a_i: a short window that has seen little
        falls back on what the pairing usually does."""
        if prior is not None:
            return self._leaning_on(prior, c.acceptance_prior_weight)
        prev, w = c.acceptance_prior, c.acceptance_prior_weight
        out = []
        for a, s in zip(self.accepted, self.seen):
            prev = (a + w * prev) / (s + w) if s + w > 0 else prev
            out.append(prev)
            w = c.position_weight
        return out

    def _leaning_on(self, prior: list[float], w: float) -> list[float]:
        """Each a_i from this window's counts, with `w` pseudo-drafts at the long-run a_i scaled by how
        far this window's a_{i-1} fell below (or rose above) the long-run one: a first draft kept less
        than usual drags the deeper beliefs down with it, not only the first."""
        out, scale = [], 1.0
        for a, s, p in zip(self.accepted, self.seen, prior):
            lean = min(1.0, p * scale)
            est = (a + w * lean) / (s + w) if s + w > 0 else lean
            out.append(est)
            scale = est / p if p > 0 else 1.0
        return out


@dataclass
class AutoBlock:
    """Block-size controller for one target/drafter pair (it lives as long as the loaded pairing).

    Per turn: `ctl.begin_turn(sampled)`. Per round: `choice = ctl.decide()`, run a round of
    `choice.block_size`, then `ctl.observe(k, accepted, round_s=...)`. Rounds of a fixed, user-chosen
    K may be observed too; they keep the estimates fresh.
    """

    config: AutoBlockConfig = field(default_factory=AutoBlockConfig)
    draft_cost: float | None = None  # the caller's hint: one draft step / one plain step
    rounds: int = 0
    _greedy: _Acceptance = field(init=False)
    _sampled: _Acceptance = field(init=False)
    _slow_greedy: _Acceptance = field(init=False)  # the same, counts fading slowly (across turns)
    _slow_sampled: _Acceptance = field(init=False)
    _long_greedy: _Acceptance = field(init=False)  # and more slowly still: what the pairing usually does
    _long_sampled: _Acceptance = field(init=False)
    _primed: bool = False  # block costs came from an earlier session (or a warm-up), not this one's rounds
    _sampling: bool = False
    _plain: _Cost = field(default_factory=_Cost)  # T(1)
    _ratio: dict[int, _Cost] = field(default_factory=dict)  # K >= 2: T(K) / T(1)
    _t1_guess: float = 0.0  # T(1) guessed from a drafting round, while no plain step is timed
    _last_plain_s: float | None = None  # the last round's time, when it was a plain step
    _current: int | None = None
    _parked_for: int = 0  # plain rounds since the controller parked (or last probed)
    _wait: int = 0  # plain rounds between probes in this parked stretch
    _probe_fails: int = 0  # probes in a row that did not bring drafting back
    _probing: bool = False  # the last choice was a probe
    _burst: int = 0  # probes in a row after accepted ones
    _last_accepted: int = 0  # drafts accepted in the last drafting round
    _last_emitted: int = 0  # tokens of the last drafting round of this turn
    _drafting_rounds: int = 0
    _zero_run: int = 0  # drafting rounds in a row whose first draft was rejected
    _never: bool = False  # at the measured costs even a drafter that is always right could not pay
    _probe_size: int | None = None
    _check_at: int | None = None  # kept costs alone say drafts can't pay: a round checks them at this round
    _checks: int = 0  # checks so far (a first round of a size also builds its kernels and is not timed)
    _checking: bool = False  # the last choice was a check
    _run_from: float = 0.0
    _parked_words: str = ""
    _parked_acc: tuple[float, ...] = ()
    _primed_rounds: dict[str, int] = field(default_factory=dict)  # per kind: what an earlier session counts as
    _timing_put_off: bool = False  # a primed session's early plain timing waits (`primed_timing_sure`)
    _fits: dict[tuple, tuple[float, float]] = field(default_factory=dict)  # `_line`'s fits by what they read
    # plain steps this process's first drafting round costs beyond its own (`observe`'s traced=True); 0 where
    # nothing is left to trace (uncompiled, traced at idle time, or the replay's model of a machine)
    first_draft_cost: float = 0.0
    _drafted: bool = False  # a drafting round ran in this process
    _windows_seeded: bool = False  # the slow and fast windows started from the kept acceptance (`begin_turn`)
    _first_draft: tuple[int, float, int] | None = None  # (k, seconds, plain steps in them), until priced
    _first_draft_measured: float | None = None

    def __post_init__(self) -> None:
        positions = max(self.config.k_max - 1, 0)
        self._greedy = _Acceptance.empty(positions)
        self._sampled = _Acceptance.empty(positions)
        self._slow_greedy = _Acceptance.empty(positions)
        self._slow_sampled = _Acceptance.empty(positions)
        self._long_greedy = _Acceptance.empty(positions)
        self._long_sampled = _Acceptance.empty(positions)

    # -- estimates ----------------------------------------------------------------------

    @property
    def _acc(self) -> _Acceptance:
        return self._sampled if self._sampling else self._greedy

    @property
    def _slow(self) -> _Acceptance:
        return self._slow_sampled if self._sampling else self._slow_greedy

    @property
    def _long(self) -> _Acceptance:
        return self._long_sampled if self._sampling else self._long_greedy

    def acceptance(self) -> list[float]:
        """Believed a_1 .. a_{k_max - 1} for the current turn's kind (greedy or sampled): the last few
        rounds, leaning on the long-run estimate where they have seen little."""
        c = self.config
        return self._acc.estimates(c, self._slow.estimates(c, self._long.estimates(c)))

    @property
    def alpha(self) -> float:
        """The believed acceptance of the first draft (the gatekeeper of every round)."""
        est = self.acceptance()
        return est[0] if est else 0.0

    def round_time(self, k: int) -> float:
        """Predicted seconds for a round of block size k (relative units before any timing)."""
        t1 = self._plain.value if self._plain.count else (self._t1_guess or 1.0)
        return t1 if k == 1 else t1 * self.cost_ratio(k)

    def cost_ratio(self, k: int) -> float:
        """T(k) / T(1). Kept as ratios to the plain step timed around them, so a busy spell of the machine,
        which slows every round alike, does not make measured sizes look dear or cheap for ever."""
        c = self.config
        prior_step = (self.draft_cost if self.draft_cost is not None else c.draft_cost_prior) + c.verify_slope_prior
        if k == 1:
            return 1.0
        if not self._ratio:
            return 1.0 + prior_step * (k - 1)
        a, b = self._fit(prior_step)
        line = a + b * (k - 1)
        own = self._ratio.get(k)
        if own is None:
            return line
        # a size run lately is believed as measured: costs jump between sizes (kernel tiles, SIMD
        # widths), which no line follows; the line fills in the sizes not run
        w = _weight(own, c)
        return (w * own.value + line) / (w + 1.0)

    def _fit(self, prior_step: float) -> tuple[float, float]:
        """`_line` through the kept costs, computed once per state of them: a parked round asks for the
        ratios of every size (the probe's, the wait's) and the costs have not moved since the last round
        that drafted. Keyed on what the fit reads, so no path that changes a cost can leave it stale."""
        c = self.config
        key = (prior_step, c.ridge, c.time_window, tuple((k, r.value, r.count) for k, r in self._ratio.items()))
        fit = self._fits.get(key)
        if fit is None:
            if len(self._fits) >= 4:  # two ridges (see `_smallest_that_could_pay`), a state or two back
                self._fits.clear()
            fit = self._fits[key] = _line(self._ratio, prior_step, c)
        return fit

    def rate(self, k: int, acceptance: list[float] | None = None) -> float:
        """Expected tokens per second (per unit time) at block size k."""
        acc = self.acceptance() if acceptance is None else acceptance
        return expected_tokens_per_position(k, acc) / self.round_time(k)

    def best(self) -> int:
        """argmax of `rate` over the allowed sizes, with hysteresis around the current K."""
        c = self.config
        acc = self.acceptance()
        # ramp: a block at most twice the last round's tokens (a new turn starts small), and no
        # more than twice the largest size timed yet: one failed round never costs much
        top = max([1] + list(self._ratio))
        reach = min(c.k_max, max(c.turn_start_k, c.ramp * self._last_emitted), 2 * top)
        ks = range(c.k_min, max(c.k_min, reach) + 1)
        rates = {k: self.rate(k, acc) for k in ks}
        best = max(ks, key=lambda k: (rates[k], -k))
        if best == 1 and reach < c.k_max:
            # the ramp must not park the controller where only a block beyond its cap can pay (a verify's
            # fixed cost, a busy machine): parked, a reply the drafter knows well waits dozens of rounds
            # for a probe. A block at the smallest size that could pay is judged like any other.
            pay = self._smallest_that_could_pay()
            if pay is not None and pay > reach:
                ks = range(c.k_min, pay + 1)
                rates.update({k: self.rate(k, acc) for k in ks if k not in rates})
                best = max(ks, key=lambda k: (rates[k], -k))
        if best == 1 and self._current not in (None, 1) and len(rates) > 1:
            # leaving drafting stops all news about acceptance: do it only when plain clearly wins
            drafting = max(k for k in ks if k > 1 and rates[k] == max(rates[j] for j in ks if j > 1))
            if rates[1] <= rates[drafting] * (1.0 + c.park_margin):
                best = drafting
            elif c.k_max >= 2 and self._could_still_pay(acc, rates[1]):
                best = 2  # parking ends the news about acceptance: only once it is clear that drafts don't pay
        cur = self._current
        if cur is not None and cur in rates and rates[best] <= rates[cur] * (1.0 + c.hysteresis):
            return cur
        return best

    def _could_still_pay(self, acc: list[float], plain_rate: float) -> bool:
        """Whether a block of 2 would beat a plain step were the first draft kept as often as the
        upper end of what the last rounds allow (`park_confidence` standard errors above the estimate,
        over the drafts seen lately): near the break-even a block of 2 loses little, and parked, the
        controller learns nothing."""
        c = self.config
        seen = self._acc.seen[0] if self._acc.seen else 0.0
        n = seen + c.acceptance_prior_weight
        a = acc[0]
        upper = min(1.0, a + c.park_confidence * math.sqrt(max(a * (1.0 - a), 1.0 / (n + 1.0)) / n))
        return self.rate(2, [upper, *acc[1:]]) > plain_rate

    @property
    def probe_wait(self) -> int:
        """Plain rounds between probes while parked (fixed when the controller parks)."""
        return self._wait

    def _probe_wait(self) -> int:
        """Probes cost at most `probe_budget` of the parked time, doubling after each that failed;
        none, when even a drafter that is always right could not pay at the measured costs."""
        c = self.config
        if c.k_max < 2:
            return c.probe_every_max
        self._probe_size = self._smallest_that_could_pay()
        settled = [k for k, r in self._ratio.items() if r.count >= 2]
        timed = [r.count for r in self._ratio.values() if r.count]
        # two sizes, four rounds in all (or an earlier session's costs): one slow moment cannot rule drafting out
        self._never = self._probe_size is None and len(timed) >= 2 and sum(timed) >= 4
        if self._never:
            self._schedule_check()
            return c.probe_every_max
        k = self._probe_size or self._smallest_probe
        # waits w, 2w, 4w, ...: probe m costs `extra` after about w 2^m parked rounds, so the first
        # comes soon (parking on little evidence is the likeliest mistake) and the share they cost
        # stays near `probe_budget` (at most twice it, right after parking). A cost resting on a round
        # or two is no ground for a long wait: one slow moment of the machine must not park us for long.
        extra = max(self.cost_ratio(k) - 1.0, 0.0)
        base = max(c.probe_every_min, math.ceil(extra / (4 * c.probe_budget))) if k in settled else c.probe_every_min
        if self._untraced():  # the first probe of the process also traces: it waits as its cost says
            base = max(base, math.ceil((extra + self._untraced()) / (4 * c.probe_budget)))
        return min(base * 2**self._probe_fails, c.probe_every_max)

    @property
    def _smallest_probe(self) -> int:
        """The block of a probe or a check when no size is known to pay: `probe_k`, within 2..k_max."""
        return max(2, min(self.config.probe_k, self.config.k_max))

    def _schedule_check(self) -> None:
        """Costs an earlier session kept, not one of this session's rounds, say drafts can't pay: were they
        timed in a busy moment, no later session would ever draft to find out. One round of the cheapest
        drafting size checks them, once the session has run enough rounds that the check costs about four
        times `probe_budget` of them, as a parked stretch's first probe does (a machine where drafting truly
        can't pay loses that little, once a session)."""
        c = self.config
        if any(r.own for r in self._ratio.values()) or self._checks >= 3 or self._check_at is not None:
            return
        extra = max(self.cost_ratio(self._smallest_probe) - 1.0, 0.0) + self._untraced()
        self._check_at = self.rounds + max(c.probe_every_min, math.ceil(extra / (4 * c.probe_budget)))

    def _smallest_that_could_pay(self) -> int | None:
        """The smallest block that would beat a plain step if every draft were accepted (k tokens for
        less than k plain steps), from `probe_k` up: a probe smaller than that tells nothing. Once two
        sizes are timed, the sizes between and beyond them follow the measured line alone (the prior
        slope must not keep a hope alive that the measurements have ruled out)."""
        c = self.config
        measured = len([r for r in self._ratio.values() if r.count >= 2]) >= 2
        ridge = c.ridge
        if measured:
            c.ridge = 1e-9
        try:
            ratios = {k: self.cost_ratio(k) for k in range(self._smallest_probe, c.k_max + 1)}
        finally:
            c.ridge = ridge
        # a size must beat plain decoding by a margin the timing noise cannot fake
        k = next((k for k, r in ratios.items() if k > r * (1.0 + c.pay_margin)), None)
        if k is not None and len(self._ratio) == 1:
            k = min(k, max(self._ratio) + 1)  # one size timed: the next one up, to learn the slope cheaply
        return k

    def _untraced(self) -> float:
        """Plain steps the next drafting round costs beyond its own (this process's first one traces), as
        far as the choices weigh it: with nothing known of the pairing's drafts (no earlier session kept
        their acceptance) a round is tried as before, since only a round tells."""
        return 0.0 if self._drafted or not self._long.rounds else self.first_draft_cost

    def _first_draft_pays(self) -> bool:
        """Before this process's first drafting round: whether drafts, as believed now, pay back its tracing
        within `first_draft_horizon` tokens at their best block size (n tokens cost n plain steps plain,
        n T(k) / E(k) drafted). A short reply of a pairing whose drafts hover around the break-even (the
        dense-style pack pairing on a CPU) would otherwise lose a one-shot `generate` 4-5 % to it."""
        c = self.config
        if self._untraced() <= 0.0 or c.k_max < 2:
            return True
        acc = self.acceptance()
        n = c.first_draft_horizon
        per_token = [self.cost_ratio(k) / expected_tokens_per_position(k, acc) for k in range(2, c.k_max + 1)]
        saved = n * (1.0 - min(per_token))
        return saved > self._untraced()

    def first_draft_measured(self) -> float | None:
        """Plain steps this process's first drafting round cost beyond its own, once a plain step priced it."""
        return self._first_draft_measured

    # -- priors from an earlier session --------------------------------------------------------

    def cost_snapshot(self) -> dict[int, float]:
        """T(K) / T(1) for every block size this controller has timed (to keep for the next session)."""
        kept = {k: r.kept() for k, r in sorted(self._ratio.items()) if r.count}
        return {k: round(v, 4) for k, v in kept.items() if v is not None}

    def prime(self, ratios: dict[int, float], rounds: int | None = None) -> None:
        """Start from costs measured before (an earlier session on this machine, or a warm-up): each
        ratio T(K) / T(1) counts as `rounds` rounds (default: a third of the window), so this
        session's own rounds replace it soon. A primed controller drafts from its first round when the
        costs say a drafter like the prior one would pay, instead of timing plain steps first."""
        c = self.config
        weight = max(1, c.time_window // 3) if rounds is None else max(1, rounds)
        for k, ratio in ratios.items():
            if 2 <= int(k) <= c.k_max and float(ratio) >= 1.0 and math.isfinite(float(ratio)):
                cost = _Cost()
                for _ in range(weight):
                    cost.add(float(ratio), c.time_window, 0)
                cost.primed, cost.own = float(ratio), 0
                self._ratio[int(k)] = cost
        self._primed = bool(self._ratio)
        if self._primed and not self._plain.count:
            # kept costs are only as good as the moment they were timed, and ratios taken against a T(1)
            # guessed from them echo them back: a few rounds in, time a plain step, the session's anchor
            self._plain.last = self.rounds + c.primed_timing_at - c.plain_timing_every

    def _long_by_kind(self) -> dict[str, _Acceptance]:
        return {"greedy": self._long_greedy, "sampled": self._long_sampled}

    def acceptance_snapshot(self) -> dict[str, list[float]]:
        """The pairing's long-run acceptance a_1, a_2, ... per kind ("greedy", "sampled"), where this
        session drafted enough rounds to say (to keep for the next session, beside the costs)."""
        c = self.config
        # this session's own rounds: a session that never drafted must not keep the primed values (each
        # such session would pull them a little toward the flat prior)
        return {
            name: [round(a, 4) for a in est.estimates(c)]
            for name, est in self._long_by_kind().items()
            if est.rounds - self._primed_rounds.get(name, 0) >= ACCEPTANCE_SNAPSHOT_ROUNDS
        }

    def prime_acceptance(self, snapshot: dict[str, list[float]], rounds: int = ACCEPTANCE_PRIME_ROUNDS) -> None:
        """Start the long-run acceptance from an earlier session's (`acceptance_snapshot`), worth `rounds`
        drafting rounds at every position: a first reply then bets on drafts as the pairing usually
        earns them on this machine (a deep first block for a drafter that is usually right, a probe or
        none for one that is not) instead of the flat `acceptance_prior`; its own rounds soon outweigh it."""
        for name, values in snapshot.items():
            est = self._long_by_kind().get(name)
            if est is None or est.rounds:
                continue
            for i, a in enumerate(values[: len(est.seen)]):
                if 0.0 <= a <= 1.0:
                    est.seen[i], est.accepted[i] = rounds, rounds * a
            est.rounds = self._primed_rounds[name] = rounds

    # -- per turn and per round -------------------------------------------------------------

    def begin_turn(self, sampled: bool = False) -> None:
        """A new reply: its acceptance is judged mostly on its own rounds, and a parked controller
        probes soon (a new question may be one the drafter knows)."""
        self._sampling = sampled
        self._acc.scale(self.config.turn_keep)
        self._slow.scale(self.config.turn_keep)  # a new reply leans more on what the pairing usually does
        kind = "sampled" if sampled else "greedy"
        if not self._windows_seeded and self._primed_rounds.get(kind) and not self._slow.rounds:
            self._windows_seeded = True
            kept = self._long.estimates(self.config)
            for est, weight in ((self._slow, self.config.kept_slow_rounds), (self._acc, self.config.kept_fast_rounds)):
                for i, a in enumerate(kept[: len(est.seen)]):
                    est.seen[i] += weight
                    est.accepted[i] += weight * a
        self._last_emitted = 0
        self._probe_fails = 0
        if self._current == 1:
            self._park()  # the wait is back to its base
            if self._wait < self.config.probe_every_max:
                self._parked_for = self._wait - self.config.turn_probe_after  # and the turn's first probe comes soon

    def choose(self) -> int:
        """Block size for the next round."""
        return self.decide().block_size

    def decide(self) -> AutoChoice:
        """The next round's block size, with the reason and a sentence for the user."""
        c = self.config
        was_probe, self._probing = self._probing, False
        if self._current == 1 and not was_probe:
            self._parked_for += 1
            if self._parked_for % c.refresh_every == 0:
                self._wait = self._probe_wait()  # T(1) moves with the machine's load
            if self._check_at is not None and self._never and self.rounds >= self._check_at:
                k, self._check_at = self._smallest_probe, None
                self._checks += 1
                self._probing = self._checking = True
                return AutoChoice(k, "probe", f"auto → {k}: checking the kept costs, which say drafts can't pay")
            if self._parked_for < self._wait:  # parked: O(1), nothing changed that could move the choice
                return self._parked_choice()
            # what the drafting rounds before the parked stretch said grows stale: lean on the long run
            self._acc.scale(c.parked_decay**self._parked_for)
            self._slow.scale(c.parked_decay**self._parked_for)
        elif (
            not was_probe
            and c.k_min == 1 < c.k_max
            and ((self._plain.count < 3 and not self._primed) or self.rounds - self._plain.last >= c.plain_timing_every)
        ):
            # every choice weighs drafting against a plain step: time three at the start (the first ones
            # after loading also build kernels) and one now and then (it costs little)
            if (
                self._primed
                and not self._plain.count
                and self.alpha >= c.primed_timing_sure
                and not self._timing_put_off
            ):
                # a primed session's early timing (`prime`) is for drafts in doubt. A drafter this often right
                # pays on most machines whatever a busy moment did to the kept costs, and three plain rounds
                # would cost a short reply a sixth of its time: later, where they cost a longer reply little
                self._timing_put_off = True
                self._plain.last = self.rounds + c.primed_timing_sure_at - c.primed_timing_at - c.plain_timing_every
            else:
                return AutoChoice(1, "timing", "auto → 1: timing a plain step, to weigh drafting against it")
        k = self.best()
        if k > 1 and not self._first_draft_pays():
            k = 1  # as plain decoding would, until drafts look good enough to pay for the tracing too
        if k == 1 and c.k_max >= 2:
            if was_probe and self._last_accepted > 0 and self._burst < c.probe_burst and self._probe_size:
                # the probe was accepted: probe on at once (one round is weak evidence either way)
                self._burst += 1
                self._probing = True
                return self._note(self._probe_size or self._smallest_probe, "probe")
            self._burst = 0
            if was_probe:
                self._probe_fails += 1
            untried = self._primed and self._slow.rounds == 0 and not was_probe and not self._never
            if untried and self._smallest_that_could_pay() is not None and self._first_draft_pays():
                # no drafting round seen yet: the prior alone is no ground to park; one round tells
                self._current = 1
                self._park()
                self._probing = True
                return self._note(self._probe_size or self._smallest_probe, "probe")
            if self._current != 1 or was_probe or self._never:
                self._current = 1
                self._park()
                return self._parked_choice()
            self._parked_for = 0
            self._probing = True
            return self._note(self._probe_size or self._smallest_probe, "probe")
        self._current = k
        self._probe_fails = self._burst = 0
        self._drafting_rounds += 1
        if self._drafting_rounds % c.explore_every == 0:
            # now and then a neighbouring size, so one slow moment cannot keep a size untried for ever
            k = self._neighbour(k)
        return self._note(k, "drafting")

    def _neighbour(self, k: int) -> int:
        """The size next to k (within the allowed range) timed longest ago."""
        c = self.config
        options = [j for j in (k - 1, k + 1) if 2 <= j <= c.k_max]
        if not options:
            return k
        return min(options, key=lambda j: self._ratio[j].last if j in self._ratio else -1)

    def _park(self) -> None:
        """Start (or restart) a parked stretch: the wait before the next probe, and its words."""
        self._parked_for = 0
        self._wait = self._probe_wait()
        acc = self.acceptance()
        cost = self.round_time(2) / self.round_time(1) if self.config.k_max >= 2 else 1.0
        first = acc[0] * 100 if acc else 0.0
        if self._never:
            self._parked_words = f"auto → 1: drafts can't pay on this machine (a round with one costs {cost:.1f}x)"
        elif not self._first_draft_pays() and max(
            self.rate(k, acc) for k in range(2, self.config.k_max + 1)
        ) > self.rate(1):
            self._parked_words = (
                f"auto → 1: drafts would gain too little to pay for tracing their first round (1st kept {first:.0f} %)"
            )
        else:
            self._parked_words = (
                f"auto → 1: drafts don't pay (1st kept {first:.0f} %, a round with one costs {cost:.1f}x)"
            )
        self._parked_acc = tuple(acc[:1])

    def _parked_choice(self) -> AutoChoice:
        if not self._never:
            tail = f"; trying again in {_rounds(self._wait - self._parked_for)}"
        elif self._check_at is not None:  # only kept costs say so (`_schedule_check`)
            tail = f"; costs kept from an earlier session, checking in {_rounds(max(self._check_at - self.rounds, 1))}"
        else:
            tail = ""
        return AutoChoice(1, "parked", self._parked_words + tail, self._parked_acc)

    def observe(
        self,
        k: int,
        accepted: int | Sequence[int],
        *,
        round_s: float | None = None,
        clean: bool = True,
        ahead: bool = False,
        traced: bool = False,
    ) -> None:
        """Record a finished round: block size k, drafts accepted (0..k-1; for a batch, one count per row
        that verified k tokens), and its time, sync to sync.

        clean=False: the time is not this block size's own. Rounds overlap (the next is built and
        submitted before this one is read), so the time between two syncs holds the host's work for
        one round and the device's for another; in a stretch of one block size that is the size's
        true cost per round, but where the size changes it is not: a plain step then also paid for
        building the drafting round queued behind it, and that round's time misses its own building.
        The engine says which times are clean; only those enter the costs. ahead=True: a drafting round
        queued on an unread plain step (a probe, the first drafting round after plain ones): its time
        misses its own building, which the plain step before it paid; the two together make its cost.
        traced=True: the round also traced its size's compiled functions (its first in this process); the
        process's first drafting round then prices `first_draft_cost` (`first_draft_measured`)."""
        c = self.config
        ns = [accepted] if isinstance(accepted, int) else list(accepted)
        if k < 1 or not all(0 <= n <= k - 1 for n in ns):
            raise ValueError(f"bad observation: k={k}, accepted={accepted}")
        self.rounds += 1
        self._note_first_draft(k, round_s, traced, ahead)
        checking = self._checking and k > 1  # the check may be queued behind a plain step observed first
        self._checking = self._checking and not checking
        if k > 1 and ns:
            most = max(ns)  # a batch's round is "all rejected" only when every row's first draft was
            if most == 0 and self._zero_run == 0:
                self._run_from = self.alpha  # what was believed when the rejections began
            self._acc.observe(min(k, c.k_max), ns, c.acceptance_decay)
            self._slow.observe(min(k, c.k_max), ns, c.slow_decay)
            self._long.observe(min(k, c.k_max), ns, c.long_decay)
            self._zero_run = self._zero_run + 1 if most == 0 else 0
            if self._zero_run >= c.change_run and (1.0 - self._run_from) ** self._zero_run < c.surprise:
                # rejections the estimate made unlikely: the text changed; forget what came before them
                for est in (self._acc, self._slow):  # the long-run estimate stays: the pairing is the same
                    est.scale(c.change_keep)
                    est.seen[0] += self._zero_run * (1.0 - c.change_keep)  # but not the run itself
                self._run_from = 0.0  # once per run
            self._last_accepted = most
            self._last_emitted = most + 1
            if self._current == 1 and most > 0:
                self._parked_for = max(self._parked_for, self._wait - 1)  # news: the next choice weighs it
        last_plain, self._last_plain_s = self._last_plain_s, (round_s if k == 1 else None)
        if round_s is not None and k > 1 and ahead:
            if last_plain is None or not self._plain.count:
                return
            round_s += max(last_plain - self._plain.value, 0.0)
        if round_s is not None and round_s > 0 and clean:
            if k == 1:
                self._plain.add(round_s, c.time_window, self.rounds)
            else:
                if not self._plain.count and not self._t1_guess:
                    # no plain step timed yet (a primed session drafts at once; k_min > 1, or fixed sizes the
                    # user chose): guess T(1) from the costs believed so far, so that the sizes compare
                    self._t1_guess = round_s / self.cost_ratio(k)
                t1 = self._plain.value if self._plain.count else self._t1_guess
                if round_s / t1 < 0.85 and self._plain.count and not ahead:
                    # a drafting round under a plain step: the plain step's time is stale (the machine
                    # got faster, or it was timed while kernels were still being built); time it again
                    self._plain.last = -c.plain_timing_every
                    if round_s / t1 < 0.6:
                        return
                ratio = max(round_s / t1, 1.0)  # verifying K tokens never costs less than one
                guessed = not self._plain.count  # it compares the sizes; what they cost is not known yet
                # the kept costs are stale (timed in a busy moment, or on another setup), either way: the check
                # of a kept "never" comes out far cheaper, or this session's first timed rounds of a kept size
                # far dearer. Start afresh: this session's own rounds decide from now on
                cheaper = checking and k in self._ratio and ratio * (1.0 + c.stale_margin) < self._ratio[k].value
                if cheaper or (not guessed and self._check_kept(k, ratio)):
                    self._ratio = {}
                    self._primed = self._never = False
                self._ratio.setdefault(k, _Cost()).add(ratio, c.time_window, self.rounds, guessed=guessed)

    def _note_first_draft(self, k: int, round_s: float | None, traced: bool, ahead: bool) -> None:
        """Keep this process's first drafting round's time (with the plain step it was queued on, when
        `ahead`: that step paid for building it) until a timed plain step prices its extra."""
        if k > 1 and not self._drafted:
            self._drafted = True
            if traced and round_s is not None and (not ahead or self._last_plain_s is not None):
                plain = 1 if ahead else 0
                self._first_draft = (k, round_s + (self._last_plain_s or 0.0) * plain, plain)
        pending = self._first_draft
        if pending is not None and self._plain.count:
            size, seconds, plain = pending
            self._first_draft = None
            self._first_draft_measured = max(seconds / self._plain.value - self.cost_ratio(size) - plain, 0.0)

    def _check_kept(self, k: int, ratio: float) -> bool:
        """Count `ratio`, a round of size k timed against a plain step, toward this session's first
        `STALE_CHECK_ROUNDS` of that size, and say whether they show the cost kept for k stale: their median
        more than `stale_margin` above it. (Kept costs too high make a session draft less than it could,
        which its own rounds soon show; too low, they make it draft where drafts lose, the rounds echo them
        while no plain step is timed, and the next session keeps them again.) A median of a few: one slow
        round must not throw good costs away."""
        cost = self._ratio.get(k)
        if cost is None or cost.primed is None or len(cost.timed) >= STALE_CHECK_ROUNDS:
            return False
        cost.timed.append(ratio)
        if len(cost.timed) < STALE_CHECK_ROUNDS:
            return False
        # where they say drafts can't pay at all, dearer rounds only agree with them
        return not self._never and statistics.median(cost.timed) > cost.primed * (1.0 + self.config.stale_margin)

    # -- words --------------------------------------------------------------------------

    def _note(self, k: int, reason: str) -> AutoChoice:
        acc = self.acceptance()
        shown = acc[: max(k - 1, 1)]
        if reason == "probe" and self._long.rounds == 0:
            note = f"auto → {k}: trying drafts (none seen yet; this machine's costs say they can pay)"
        elif reason == "probe":
            note = f"auto → {k}: trying drafts again (1st kept {shown[0] * 100:.0f} % lately)"
        else:
            # the chance each draft of the block is kept (given the ones before it were), first ones first
            kept = " · ".join(f"{a * 100:.0f}" for a in shown[:4]) + (" …" if len(shown) > 4 else "")
            gain = self.rate(k, acc) * self.round_time(1)
            note = f"auto → {k}: drafts pay, ~{gain:.1f}x plain; kept {kept} %"
        return AutoChoice(k, reason, note, tuple(shown))


def _rounds(n: int) -> str:
    return "1 round" if n == 1 else f"{n} rounds"


def _weight(e: _Cost, config: AutoBlockConfig) -> float:
    """Rounds behind a cost, up to its window. Cost ratios are a property of the machine and the models,
    so old ones do not fade; new rounds replace them in the window."""
    return float(min(e.count, config.time_window))


def _line(points: dict[int, _Cost], prior_ratio: float, config: AutoBlockConfig) -> tuple[float, float]:
    """Intercept a (the line's value at K = 1) and slope b per extra token, through the per-size costs
    (K >= 2): weighted least squares (weight = rounds behind a cost, up to its window) with a ridge pull
    toward the prior slope prior_ratio * a, worth `ridge` rounds one size away. The slope stays >= 1 % of a."""
    ks = sorted(points)
    w = [_weight(points[k], config) for k in ks]
    t = [points[k].value for k in ks]
    x = [k - 1 for k in ks]
    sw = sum(w)
    mx = sum(wi * xi for wi, xi in zip(w, x)) / sw
    mt = sum(wi * ti for wi, ti in zip(w, t)) / sw
    sxx = sum(wi * (xi - mx) ** 2 for wi, xi in zip(w, x))
    sxt = sum(wi * (xi - mx) * (ti - mt) for wi, xi, ti in zip(w, x, t))
    a_guess = mt / (1.0 + prior_ratio * mx)
    prior_slope = prior_ratio * a_guess
    slope = (sxt + config.ridge * prior_slope) / (sxx + config.ridge)
    intercept = mt - slope * mx
    if intercept <= 0:  # noise on tiny timings: fall back to the prior shape
        intercept, slope = a_guess, prior_slope
    return intercept, max(slope, 0.01 * intercept)


def load_costs(path: Path) -> dict[int, float]:
    """Block costs T(K) / T(1) an earlier session kept (`save_costs`); {} for a missing, unreadable or
    corrupt file (a cold start is then all that is lost)."""
    return load_kept(path)[0]


def load_acceptance(path: Path) -> dict[str, list[float]]:
    """The long-run acceptance an earlier session kept beside its costs (`save_costs`); {} when there is
    none or the file is unreadable."""
    return load_kept(path)[1]


def load_first_draft(path: Path) -> float | None:
    """Plain steps an earlier process's first drafting round cost beyond its own (`save_costs`); None when
    none was kept or the file is unreadable."""
    return load_kept(path)[2]


def load_kept(path: Path) -> tuple[dict[int, float], dict[str, list[float]], float | None]:
    """Everything `save_costs` kept, from one read of the file: the block costs, the acceptance and the first
    drafting round's extra; each part that is missing or corrupt comes back empty on its own."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}, {}, None
    if not isinstance(data, dict):
        return {}, {}, None
    return _kept_costs(data), _kept_acceptance(data), _kept_first_draft(data)


def _kept_costs(data: dict) -> dict[int, float]:
    try:
        ratios = data.get("ratios", {})
        return {int(k): float(v) for k, v in ratios.items() if float(v) >= 1.0 and math.isfinite(float(v))}
    except (ValueError, TypeError, AttributeError):
        return {}


def _kept_acceptance(data: dict) -> dict[str, list[float]]:
    try:
        kept = data.get("acceptance", {})
        return {
            str(kind): [float(a) for a in values if 0.0 <= float(a) <= 1.0]
            for kind, values in kept.items()
            if kind in ("greedy", "sampled") and isinstance(values, list)
        }
    except (ValueError, TypeError, AttributeError):
        return {}


def _kept_first_draft(data: dict) -> float | None:
    try:
        v = float(data["first_draft"])
    except (ValueError, TypeError, KeyError):
        return None
    return v if 0.0 <= v < 1e6 else None


def save_costs(
    path: Path,
    ratios: dict[int, float],
    acceptance: dict[str, list[float]] | None = None,
    first_draft: float | None = None,
) -> None:
    """Keep the block costs (and the long-run acceptance, and what a process's first drafting round costs)
    for the next session (written whole, then renamed: a crash leaves the old file)."""
    if not ratios:
        return
    data: dict[str, object] = {"version": 1, "ratios": {str(k): v for k, v in sorted(ratios.items())}}
    if acceptance:
        data["acceptance"] = acceptance
    if first_draft is not None:
        data["first_draft"] = round(first_draft, 3)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only or full disk: the next session starts cold, nothing else is lost
