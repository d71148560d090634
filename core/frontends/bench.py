"""Decode-speed benchmark: mlx-lm's `stream_generate` against our loop, drafter off and on.

    run_bench(target_dir, drafter_dir, BenchOptions(...)) -> BenchReport

Every configuration runs on the same loaded weights and prompt, interleaved inside each repeat
(mlx-lm, off, K=2.., auto, then again) so that thermal or load drift hits them alike; a
configuration's row is its median repeat by tok/s, with that repeat's own bound and efficiency
(so a row reconciles: tok/s = efficiency x bound). EOS is ignored everywhere so every run
emits exactly `max_tokens` tokens, and tok/s is measured the same way for all of them: the
tokens after the first over the time from the first token to the last (the first token carries
the prefill).

Prefill is timed the same way for mlx-lm and for our loop: a prompt of about `prefill_tokens`
tokens (the prompt text repeated), one new token, the whole call timed from outside; prefill tok/s
= prompt tokens / that time (so the first token's forward and sampling are in, for both).

Alongside: the measured costs of one verify of K tokens, one plain decode step and one draft
step on a warm cache, and each run's efficiency against the bound
    E[tokens per round] / (verify(K) + (K - 1) * draft step)
with E the run's own measured tokens per round; the K-1 draft steps are timed as the one lazy
chain a round runs (per K), which keeps the chain's fixed part (gathering the target's K/V) in.

`simulate_acceptance` (alpha) keeps the real drafter running (its cost is real), then replaces
each of its drafts by the target's own greedy token with probability alpha, on the device
(`mx.where` over a precomputed Bernoulli mask, no extra host sync). Greedy output cannot change,
so every such run must reproduce the teacher run exactly; the bench checks that.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.engine.contract import PairingSpec
from core.engine.loading import LoadedPairing, dtype_name
from core.limits import MAX_BLOCK_SIZE

if TYPE_CHECKING:
    import mlx.core as mx

    from core.decode.autoblock import AutoBlock
    from core.decode.spec import DraftModel
    from core.model.target import Target, TargetCache
    from core.sampling import SparseLogProbs

DEFAULT_PROMPT = "Write a long story about a lighthouse keeper who finds a message in a bottle."
DEMO_PROMPT = "What is speculative decoding?"  # `bench --demo`: a question the tiny demo was trained on


class BenchError(RuntimeError):
    pass


@dataclass
class BenchOptions:
    prompt: str = DEFAULT_PROMPT
    max_tokens: int = 128
    block_sizes: list = field(default_factory=lambda: [2, 3, 4, 5, 6, "auto"])
    repeats: int = 3
    simulate_acceptance: float | None = None
    dtype: str | None = None
    baseline: bool = True  # run mlx-lm's stream_generate
    cost_repeats: int = 5  # per repeat of the runs
    seed: int = 0
    prefill_tokens: int = 512  # prompt length for the prefill timing; 0 skips it


@dataclass
class RunResult:
    config: str  # "mlx-lm" | "off" | "K=3" | "auto"
    tps: float
    tokens: int
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    block_size_counts: dict = field(default_factory=dict)
    token_ids: list = field(default_factory=list)

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def tokens_per_round(self) -> float | None:
        # rounds emit every token after the first
        return (self.tokens - 1) / self.rounds if self.rounds else None


@dataclass
class ConfigSummary:
    config: str
    tps: float  # the median repeat's tok/s (the lower middle one for an even count)
    tps_runs: list[float]
    acceptance: float | None
    tokens_per_round: float | None
    bound_tps: float | None  # the median repeat's own bound
    efficiency: float | None  # the median repeat's tps / its bound: tps == efficiency * bound_tps
    vs_baseline: float | None
    matches_teacher: bool | None


@dataclass
class BenchReport:
    target: str
    drafter: str | None
    dtype: str
    prompt_tokens: int
    max_tokens: int
    repeats: int
    simulate_acceptance: float | None
    decode_step_s: float  # one synced 1-token forward on a warm cache
    verify_s: dict[int, float]  # K -> one synced K-token forward (+ verify argmax)
    draft_s: dict[int, float]  # n -> one synced draft chain of n steps (empty without a drafter)
    configs: list[ConfigSummary]
    machine: dict = field(default_factory=dict)  # machine_info(): where the figures come from
    prefill_tokens: int = 0  # the prefill timing's prompt length (0: not measured)
    prefill_runs: dict[str, list[float]] = field(default_factory=dict)  # "mlx-lm" / "off" -> tok/s per repeat
    auto_start: str = ""  # what auto's controller started from ("" without an auto row)

    @property
    def prefill_tps(self) -> dict[str, float]:
        """Median prefill tok/s per configuration (the lower middle one for an even count)."""
        return {k: statistics.median_low(v) for k, v in self.prefill_runs.items()}

    @property
    def prefill_vs_baseline(self) -> float | None:
        base, ours = self.prefill_tps.get("mlx-lm"), self.prefill_tps.get("off")
        return ours / base if base and ours else None

    def config(self, name: str) -> ConfigSummary | None:
        return next((c for c in self.configs if c.config == name), None)

    @property
    def best(self) -> ConfigSummary | None:
        ours = [c for c in self.configs if c.config != "mlx-lm"]
        return max(ours, key=lambda c: c.tps) if ours else None

    def as_dict(self) -> dict:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "configs"}
        d["verify_s"] = {str(k): v for k, v in self.verify_s.items()}
        d["verify_ratio"] = {str(k): v / self.decode_step_s for k, v in self.verify_s.items()}
        d["draft_s"] = {str(k): v for k, v in self.draft_s.items()}
        d["draft_step_ratio"] = self.draft_s[1] / self.decode_step_s if self.draft_s else None
        d["configs"] = [dict(c.__dict__) for c in self.configs]
        d["prefill_tps"] = self.prefill_tps
        d["prefill_vs_baseline"] = self.prefill_vs_baseline
        best = self.best
        d["best"] = best.config if best else None
        return d


def parse_block_sizes(text: str) -> list[int | str]:
    out: list[int | str] = []
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        if part == "auto":
            out.append("auto")
            continue
        try:
            k = int(part)
        except ValueError:
            raise ValueError(f"block sizes must be integers 2..{MAX_BLOCK_SIZE} or auto, got {part!r}") from None
        if not 2 <= k <= MAX_BLOCK_SIZE:
            raise ValueError(f"block sizes must be 2..{MAX_BLOCK_SIZE} or auto (K=1 is the drafter-off run), got {k}")
        out.append(k)
    if not out:
        raise ValueError(f"no block size given in {text!r}: list at least one, e.g. 2,3,4,auto")
    return out


# --- simulated acceptance -------------------------------------------------------------------


class SimulatedDrafter:
    """Runs the real drafter, then swaps draft i of a round (the token at absolute position
    P + i, the cache holding [0, P)) for the teacher's token there where a fixed Bernoulli(alpha)
    mask over positions says so. A position is tested against the target at most once as a
    draft that decides a round, so each tested draft is accepted with probability alpha (or by the
    drafter's own luck)."""

    def __init__(self, drafter: DraftModel, sequence: list[int], alpha: float, seed: int = 0, slack: int = 32) -> None:
        import mlx.core as mx
        import numpy as np

        self.drafter = drafter
        n = len(sequence) + slack
        rng = np.random.default_rng(seed)
        padded = list(sequence) + [0] * slack
        self.teacher = mx.array(np.array(padded, dtype=np.uint32))
        self.mask = mx.array(rng.random(n) < alpha)
        mx.eval(self.teacher, self.mask)

    def draft(
        self, target: Target, cache: TargetCache, bonus: mx.array, hidden: mx.array, n: int, **kw: Any
    ) -> tuple[mx.array, mx.array | SparseLogProbs | None]:
        import mlx.core as mx

        drafts, logprobs = self.drafter.draft(target, cache, bonus, hidden, n, **kw)
        P = cache.offset
        return mx.where(self.mask[P + 1 : P + 1 + n], self.teacher[P + 1 : P + 1 + n], drafts), logprobs


# --- the runs -------------------------------------------------------------------------------


class _Clock:
    """Token arrival times, the same way for every configuration."""

    def __init__(self) -> None:
        self.first: float | None = None
        self.last: float | None = None
        self.count = 0

    def tick(self) -> None:
        now = time.perf_counter()
        if self.first is None:
            self.first = now
        self.last = now
        self.count += 1

    @property
    def tps(self) -> float:
        if self.count < 2 or self.first is None or self.last is None or self.last <= self.first:
            return 0.0
        return (self.count - 1) / (self.last - self.first)


def run_ours(
    target: Target,
    drafter: DraftModel | None,
    tokenizer: Any,
    stops: Iterable[int],
    ids: list[int],
    max_tokens: int,
    block: int | str | None,
    auto: AutoBlock | None = None,
) -> RunResult:
    """block: None (drafter off), an int K or "auto"; auto: the controller to run it with (default: a cold one)."""
    from core.decode.detok import Detokenizer
    from core.decode.spec import Controls, Decoder, Prompt
    from core.events import TokenEvent
    from core.settings import GenerationSettings

    clock = _Clock()

    def emit(e: object) -> None:
        if isinstance(e, TokenEvent):
            clock.tick()

    settings = GenerationSettings(
        max_tokens=max_tokens, ignore_eos=True, block_size=block or 1, drafter_enabled=block is not None
    )
    decoder = Decoder(target, drafter if block is not None else None, Detokenizer(tokenizer), stops, auto=auto)
    controls = Controls(settings.block_size, settings.drafter_enabled)
    result = decoder.run(target.make_cache(), Prompt(list(ids)), settings, emit, controls)
    s = result.stats
    name = "off" if block is None else ("auto" if block == "auto" else f"K={block}")
    return RunResult(
        name,
        clock.tps,
        len(result.token_ids),
        s.rounds,
        s.drafted,
        s.accepted,
        dict(s.block_size_counts),
        list(result.token_ids),
    )


def prefill_prompt(tokenizer: Any, text: str, n: int) -> list[int]:
    """A chat-formatted prompt of at least n tokens: the text repeated (whole messages, so the chat
    template's tail stays intact)."""
    from core.decode import prompt as prompt_mod

    text = text if text.strip() else DEFAULT_PROMPT  # an empty --prompt would grow by newlines only
    content = text
    while True:
        ids = prompt_mod.encode_messages(tokenizer, [{"role": "user", "content": content}])
        if len(ids) >= n:
            return ids
        content = f"{content}\n{text}"


def time_prefill(run: Callable[[], object], n_tokens: int) -> float:
    """Prefill tok/s of one call that prefills n_tokens and emits one token, timed from outside."""
    t0 = time.perf_counter()
    run()
    return n_tokens / (time.perf_counter() - t0)


def run_mlx_lm(model: Any, tokenizer: Any, ids: list[int], max_tokens: int) -> RunResult:
    """mlx-lm's own streaming generation (greedy; the tokenizer's eos set must be empty)."""
    import mlx.core as mx
    from mlx_lm.generate import stream_generate

    clock = _Clock()
    tokens = []
    for r in stream_generate(model, tokenizer, mx.array(ids), max_tokens=max_tokens):
        clock.tick()
        tokens.append(int(r.token))
    return RunResult("mlx-lm", clock.tps, len(tokens), token_ids=tokens)


# --- costs ----------------------------------------------------------------------------------


def _timed(fn: Callable[[], None], repeats: int) -> float:
    fn()  # warm up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure_costs(
    target: Target, drafter: DraftModel | None, ids: list[int], continuation: list[int], ks: list[int], repeats: int
) -> tuple[float, dict[int, float], dict[int, float]]:
    """Synced costs on a cache warm with the prompt, each the median of `repeats`:
    (decode step s, {K: verify of K tokens s}, {n: draft chain of n steps s} (empty without a drafter)).

    A verify is the target forward of K tokens plus the greedy check's argmax; a draft chain is
    one `drafter.draft(..., n)` call evaluated once, as a round runs it (its fixed part, gathering
    the target's K/V, included)."""
    import mlx.core as mx

    cache = target.make_cache()
    _, hidden = target.forward(ids, cache, logits=None)
    h = hidden[-1]
    mx.eval(h)
    P = cache.offset
    need = max(ks)
    block = (list(continuation) + [0] * need)[:need]

    def verify(k: int) -> Callable[[], None]:
        def go() -> None:
            logits, H = target.forward(block[:k], cache, logits="all")
            assert logits is not None  # asked for
            mx.eval(mx.argmax(logits, axis=-1), H)
            cache.trim_to(P)

        return go

    verify_s = {k: _timed(verify(k), repeats) for k in sorted(set([1] + ks))}
    chains = {}
    if drafter is not None:
        b = mx.array(block[:1], dtype=mx.uint32)

        def chain(n: int) -> Callable[[], None]:
            def go() -> None:
                drafts, _ = drafter.draft(target, cache, b, h, n)
                mx.eval(drafts)

            return go

        chains = {n: _timed(chain(n), repeats) for n in sorted({1} | {k - 1 for k in ks if k > 1})}
    return verify_s[1], verify_s, chains


def bound_tps(run: RunResult, verify_s: dict, chains: dict) -> float | None:
    """The run's tok/s if each round of size K cost exactly verify(K) + a draft chain of K-1 steps."""
    if not run.rounds:
        return None
    seconds = 0.0
    for k, n in run.block_size_counts.items():
        if k not in verify_s or (k > 1 and k - 1 not in chains):
            return None
        seconds += n * (verify_s[k] + (chains[k - 1] if k > 1 else 0.0))
    return (run.tokens - 1) / seconds if seconds > 0 else None


# --- the whole bench ------------------------------------------------------------------------


def _config_names(block_sizes: list[int | str], with_drafter: bool, baseline: bool) -> list[int | str | None]:
    out: list[int | str | None] = ["mlx-lm"] if baseline else []
    out.append(None)
    if with_drafter:
        out += list(block_sizes)
    return out


@dataclass
class _Bench:
    """What every configuration of one bench shares: the loaded pairing, the prompts, the teacher."""

    pairing: LoadedPairing
    options: BenchOptions
    ids: list[int]  # the decode prompt
    long_ids: list[int]  # the prefill prompt ([] : prefill not timed)
    teacher: RunResult  # plain greedy decoding by the target alone
    base_tok: Any = None  # mlx-lm's tokenizer for the baseline, with no eos (None: no baseline)
    auto: AutoBlock | None = None  # auto's controller, across every run as across a chat's replies
    auto_start: str = ""  # what it started from (`_session_controller`)

    def drafter_for(self, rep: int) -> DraftModel | None:
        """The drafter of repeat `rep`: the real one, or wrapped to simulate an acceptance rate."""
        o, drafter = self.options, self.pairing.drafter
        if o.simulate_acceptance is None or drafter is None:
            return drafter
        return SimulatedDrafter(drafter, self.ids + self.teacher.token_ids, o.simulate_acceptance, o.seed + rep)

    def run(self, config: int | str | None, drafter: DraftModel | None, max_tokens: int) -> RunResult:
        """One run of a configuration name from `_config_names` ("mlx-lm", None: drafter off, K or "auto")."""
        p = self.pairing
        if config == "mlx-lm":
            return run_mlx_lm(p.target.model, self.base_tok, self.ids, max_tokens)
        return run_ours(p.target, drafter, p.tokenizer, p.stop_ids, self.ids, max_tokens, config, self.auto)

    def prefillers(self) -> dict[str, Callable[[], object]]:
        p, long_ids = self.pairing, self.long_ids
        if not long_ids:
            return {}
        out: dict[str, Callable[[], object]] = {}
        if self.base_tok is not None:
            out["mlx-lm"] = lambda: run_mlx_lm(p.target.model, self.base_tok, long_ids, 1)
        out["off"] = lambda: run_ours(p.target, None, p.tokenizer, p.stop_ids, long_ids, 1, None)
        return out


@dataclass
class _Measured:
    runs: dict[str, list[RunResult]] = field(default_factory=dict)
    bounds: dict[str, list[float | None]] = field(default_factory=dict)  # per run, aligned with runs
    costs: list[tuple[float, dict[int, float], dict[int, float]]] = field(default_factory=list)
    prefill_runs: dict[str, list[float]] = field(default_factory=dict)


def run_bench(
    target_dir: str | Path,
    drafter_dir: str | Path | None,
    options: BenchOptions | None = None,
    progress: Callable[[str], None] | None = None,
) -> BenchReport:
    """Load the pairing, run every configuration interleaved, measure the costs; see the module doc."""
    import mlx.core as mx

    o = options or BenchOptions()
    say = progress or (lambda s: None)
    bench = _prepare(Path(target_dir), Path(drafter_dir) if drafter_dir is not None else None, o, say)
    measured = _measure(bench, say)
    mx.clear_cache()
    return _report(bench, measured)


def _prepare(target_dir: Path, drafter_dir: Path | None, o: BenchOptions, say: Callable[[str], None]) -> _Bench:
    """Load through the engine's own path (core.engine.loading), check the options, run the teacher."""
    from core.decode import prompt as prompt_mod
    from core.engine.loading import load_pairing
    from core.model.loader import load_tokenizer

    say(f"loading {target_dir.name}")
    spec = PairingSpec(
        target_dir.name, str(target_dir), str(drafter_dir) if drafter_dir is not None else None, dtype=o.dtype
    )
    pairing = load_pairing(spec, vision=False)
    if o.simulate_acceptance is not None:
        if pairing.drafter is None:
            raise BenchError("--simulate-acceptance needs a drafter")
        if not 0.0 <= o.simulate_acceptance <= 1.0:
            raise BenchError("--simulate-acceptance must be between 0 and 1")
    target, tokenizer = pairing.target, pairing.tokenizer
    ids = prompt_mod.encode_messages(tokenizer, [{"role": "user", "content": o.prompt}])
    if len(ids) + o.max_tokens + 16 >= target.context_length:
        raise BenchError("prompt + max tokens do not fit the model's context")
    # a small model's context caps the prefill prompt (at half of it, so the repeats' overshoot fits)
    n_prefill = min(o.prefill_tokens, target.context_length // 2)
    long_ids = prefill_prompt(tokenizer, o.prompt, n_prefill) if n_prefill > 0 else []
    say("teacher run")
    teacher = run_ours(target, None, tokenizer, pairing.stop_ids, ids, o.max_tokens, None)
    base_tok = None
    if o.baseline:  # mlx-lm runs on the very weights mlx_lm.load builds (mlx_lm.utils.load_model)
        base_tok = load_tokenizer(pairing.target_dir)
        base_tok.eos_token_ids = set()  # never stop: every run emits max_tokens tokens
    auto, auto_start = _session_controller(pairing, spec, target_dir, drafter_dir, o)
    return _Bench(pairing, o, ids, long_ids, teacher, base_tok, auto, auto_start)


def _session_controller(
    pairing: LoadedPairing, spec: PairingSpec, target_dir: Path, drafter_dir: Path | None, o: BenchOptions
) -> tuple[AutoBlock | None, str]:
    """The controller auto runs with, and words for what it starts from. As in the app: one controller for
    all of auto's runs (a chat's replies), started from the block costs and acceptance that sessions on this
    machine kept for the pairing. A cold controller per run measured a first session's first reply every
    time (the dense-style pack pairing: auto 0.92x of drafter off, where a session runs about even). The
    file is only read: simulated acceptance must not become what the app believes."""
    from core.decode.spec import Decoder
    from core.engine.local import block_costs_path

    if pairing.drafter is None or "auto" not in o.block_sizes:
        return None, ""
    path = block_costs_path(target_dir, drafter_dir, spec)
    kept = path is not None and path.is_file()
    # a Decoder primes its controller as the engine's does (the Metal cap, the draft cost hint, the file)
    auto = Decoder(pairing.target, pairing.drafter, costs_path=path if kept else None).auto
    if kept:
        return auto, f"auto: one controller across the runs, from the block costs this machine kept ({path})"
    return auto, "auto: one controller across the runs, cold (no block costs kept for this pairing on this machine yet)"


def _measure(bench: _Bench, say: Callable[[str], None]) -> _Measured:
    """Warm up, then every repeat: the costs, every configuration once, the prefill timings."""
    o, pairing = bench.options, bench.pairing
    configs = _config_names(o.block_sizes, pairing.drafter is not None, o.baseline)
    say("warm-up")
    for c in configs:  # first-call costs (kernel builds, compiled functions) stay out of the figures
        bench.run(c, bench.drafter_for(0), min(8, o.max_tokens))
    prefillers = bench.prefillers()
    for fn in prefillers.values():  # warm: the long prompt's chunk shapes are new
        fn()
    # every size up to the largest asked for: a turn's last rounds shrink to fit max_tokens;
    # auto's rounds get a bound only when it kept to the measured sizes
    fixed = [k for k in o.block_sizes if k != "auto"]
    ks = list(range(1, max([int(k) for k in fixed] + [2]) + 1)) if pairing.drafter is not None else [1]
    m = _Measured()
    for rep in range(o.repeats):
        # the costs are measured in every repeat too, so each run meets a bound from the same conditions
        cost = measure_costs(pairing.target, pairing.drafter, bench.ids, bench.teacher.token_ids, ks, o.cost_repeats)
        m.costs.append(cost)
        sim = bench.drafter_for(rep)
        for c in configs:
            r = bench.run(c, sim, o.max_tokens)
            m.bounds.setdefault(r.config, []).append(None if c == "mlx-lm" else bound_tps(r, cost[1], cost[2]))
            say(f"repeat {rep + 1}/{o.repeats} {r.config}: {r.tps:.1f} tok/s")
            m.runs.setdefault(r.config, []).append(r)
            if o.simulate_acceptance is not None and r.config != "mlx-lm" and r.token_ids != bench.teacher.token_ids:
                raise BenchError(
                    f"{r.config} with simulated acceptance changed the greedy output "
                    f"(first difference at token {_first_diff(r.token_ids, bench.teacher.token_ids)})"
                )
        for name, fn in prefillers.items():
            tps = time_prefill(fn, len(bench.long_ids))
            m.prefill_runs.setdefault(name, []).append(tps)
            say(f"repeat {rep + 1}/{o.repeats} prefill {name}: {tps:.1f} tok/s")
    return m


def _report(bench: _Bench, m: _Measured) -> BenchReport:
    o, teacher = bench.options, bench.teacher
    base_tps = m.runs["mlx-lm"][median_repeat(m.runs["mlx-lm"])].tps if "mlx-lm" in m.runs else None
    summaries = []
    for name, rs in m.runs.items():
        # One repeat stands for the row: its tok/s, bound and efficiency are measured together,
        # so the row reconciles (tok/s = effic x bound); medians taken column by column do not.
        mid = median_repeat(rs)
        tps = rs[mid].tps
        bound = m.bounds[name][mid]
        drafted = sum(r.drafted for r in rs)
        rounds = sum(r.rounds for r in rs)
        summaries.append(
            ConfigSummary(
                config=name,
                tps=tps,
                tps_runs=[r.tps for r in rs],
                acceptance=sum(r.accepted for r in rs) / drafted if drafted else None,
                tokens_per_round=sum(r.tokens - 1 for r in rs) / rounds if rounds else None,
                bound_tps=bound,
                efficiency=tps / bound if bound else None,
                vs_baseline=tps / base_tps if base_tps else None,
                matches_teacher=all(r.token_ids == teacher.token_ids for r in rs),
            )
        )
    p, costs = bench.pairing, m.costs
    return BenchReport(
        machine=machine_info(),
        target=str(p.target_dir),
        drafter=str(p.drafter_dir) if p.drafter_dir else None,
        dtype=dtype_name(p.target.dtype),
        prompt_tokens=len(bench.ids),
        max_tokens=o.max_tokens,
        repeats=o.repeats,
        simulate_acceptance=o.simulate_acceptance,
        auto_start=bench.auto_start,
        decode_step_s=statistics.median(c[0] for c in costs),
        verify_s={k: statistics.median(c[1][k] for c in costs) for k in costs[0][1]},
        draft_s={n: statistics.median(c[2][n] for c in costs) for n in costs[0][2]},
        configs=summaries,
        prefill_tokens=len(bench.long_ids),
        prefill_runs=m.prefill_runs,
    )


def median_repeat(runs: list[RunResult]) -> int:
    """Index of the run with the median tok/s (the lower middle one for an even count)."""
    order = sorted(range(len(runs)), key=lambda i: runs[i].tps)
    return order[(len(order) - 1) // 2]


def _first_diff(a: list, b: list) -> int:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def machine_info() -> dict:
    """Machine, OS, MLX device and versions, for a report someone else reads."""
    import os
    import platform
    import subprocess

    import mlx.core as mx

    info: dict[str, Any] = {
        "machine": platform.machine(),
        "os": platform.platform(terse=True),
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "mlx": getattr(mx, "__version__", "?"),
        "device": str(mx.default_device()),
    }
    from core import blas

    choice = blas.active()
    if choice is not None and mx.default_device() == mx.cpu:
        info["blas"] = choice.description  # what MLX's CPU float32 products run on
    if platform.system() == "Darwin":
        try:
            out = subprocess.run(
                ["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True, timeout=2
            ).stdout.strip()
            info["cpu"] = out or info["cpu"]
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        if mx.metal.is_available():
            d = mx.metal.device_info()
            info["gpu"] = d.get("device_name", "Metal")
            info["memory_gb"] = round(int(d.get("memory_size", 0)) / 2**30, 1)
    except (AttributeError, RuntimeError):
        pass
    try:
        from importlib.metadata import version

        info["mlx_lm"] = version("mlx-lm")
    except Exception:  # not installed as a distribution (a source checkout)
        info["mlx_lm"] = "?"
    return info


# An efficiency above 1 is a run faster than its own bound: the bound's costs (or the run) were
# measured within timing noise. Such a figure is printed marked, with the note below.
NOISE_MARK = "*"


def efficiency_text(efficiency: float | None) -> str:
    """'0.912', or '1.171*' for a figure above its bound (noise-bound; see noise_notes)."""
    if efficiency is None:
        return "-"
    return f"{efficiency:.3f}{NOISE_MARK if efficiency > 1.0 else ''}"


def noise_notes(report: BenchReport) -> list[str]:
    """What the table's figures cannot tell apart from timing noise: efficiencies above their own
    bound, and any figure of a single repeat."""
    notes = []
    if any(c.efficiency is not None and c.efficiency > 1.0 for c in report.configs):
        notes.append(
            f"{NOISE_MARK} efficiency above 1 is noise-bound: faster than its own bound, so that bound's measured"
            " costs are within timing noise; more --repeats narrow it"
        )
    if report.repeats < 2:
        notes.append(
            "one repeat: every tok/s, bound and efficiency here is a single measurement, noise-bound"
            " (--repeats 3 or more for figures to compare)"
        )
    return notes


def format_markdown(report: BenchReport) -> str:
    """A Markdown report to paste into an issue: machine, MLX device, pairing, tok/s per config, ratios."""
    m = report.machine
    gpu = f", GPU {m['gpu']}" if m.get("gpu") else ""
    mem = f", {m['memory_gb']} GiB" if m.get("memory_gb") else ""
    off = report.config("off")

    def num(v: float | None, fmt: str) -> str:
        return format(v, fmt) if v is not None else "-"

    lines = [
        "### gemma-chat bench",
        "",
        f"- machine: {m.get('cpu', '?')} ({m.get('machine', '?')}, {m.get('cores', '?')} cores{mem}{gpu}), "
        f"{m.get('os', '?')}",
        f"- MLX {m.get('mlx', '?')} on `{m.get('device', '?')}`, mlx-lm {m.get('mlx_lm', '?')}"
        + (f", float32 products on {m['blas']}" if m.get("blas") else ""),
        f"- target `{Path(report.target).name}`, drafter `{Path(report.drafter).name if report.drafter else '-'}`, "
        f"{report.dtype}",
        f"- prompt {report.prompt_tokens} tokens, {report.max_tokens} new tokens (eos ignored), median of "
        f"{report.repeats} interleaved repeats"
        + (f", simulated acceptance {report.simulate_acceptance:g}" if report.simulate_acceptance is not None else ""),
        f"- decode step {report.decode_step_s * 1e3:.2f} ms"
        + (f", draft step {report.draft_s[1] * 1e3:.2f} ms" if report.draft_s else ""),
        "",
        "| config | tok/s | x mlx-lm | x drafter off | acceptance | tokens/round | efficiency | same output |",
        "|---|---:|---:|---:|---:|---:|---:|:---:|",
    ]
    for c in report.configs:
        vs_off = c.tps / off.tps if off and off.tps and c.config != "mlx-lm" else None
        lines.append(
            f"| {c.config} | {c.tps:.1f} | {num(c.vs_baseline, '.3f')} | {num(vs_off, '.3f')} "
            f"| {num(c.acceptance, '.0%')} | {num(c.tokens_per_round, '.2f')} | {efficiency_text(c.efficiency)} "
            f"| {'yes' if c.matches_teacher else 'no'} |"
        )
    lines += _prefill_lines(report, markdown=True)
    lines += [
        *([f"- {report.auto_start}"] if report.auto_start else []),
        "",
        "efficiency = tok/s over the bound tokens-per-round / (verify(K) + draft chain(K-1)) from measured costs;"
        " same output = identical to plain greedy decoding by the target.",
        *(f"\n{note}." for note in noise_notes(report)),
    ]
    return "\n".join(lines) + "\n"


def format_table(report: BenchReport) -> str:
    """The human-readable table (no colours, fixed columns)."""
    lines = [
        f"target  {report.target}",
        f"drafter {report.drafter or '-'}",
        *([f"BLAS    {report.machine['blas']}"] if report.machine.get("blas") else []),
        f"dtype {report.dtype} | prompt {report.prompt_tokens} tokens | {report.max_tokens} new tokens (eos ignored)"
        f" | median repeat of {report.repeats} interleaved"
        + (f" | simulated acceptance {report.simulate_acceptance:g}" if report.simulate_acceptance is not None else ""),
        "",
        f"{'config':<8} {'tok/s':>8} {'x mlx-lm':>9} {'accept':>7} {'tok/rnd':>8} "
        f"{'bound':>8} {'effic':>6} {'same':>5}",
    ]

    def num(v: float | None, fmt: str) -> str:
        return format(v, fmt) if v is not None else "-"

    for c in report.configs:
        same = "yes" if c.matches_teacher else "no"
        lines.append(
            f"{c.config:<8} {c.tps:>8.1f} {num(c.vs_baseline, '.3f'):>9} "
            f"{num(c.acceptance, '.0%') if c.acceptance is not None else '-':>7} {num(c.tokens_per_round, '.2f'):>8} "
            f"{num(c.bound_tps, '.1f'):>8} {efficiency_text(c.efficiency):>6} {same:>5}"
        )
    d = report.decode_step_s
    costs = "  ".join(f"K={k} {v / d:.2f}" for k, v in sorted(report.verify_s.items()) if k > 1)
    lines += [
        "",
        f"decode step {d * 1e3:.2f} ms | verify cost / decode step: {costs}",
    ]
    if report.draft_s:
        chain = "  ".join(f"{n}: {v / d:.2f}" for n, v in sorted(report.draft_s.items()))
        lines.append(
            f"draft step {report.draft_s[1] * 1e3:.2f} ms = {report.draft_s[1] / d:.3f} decode steps"
            f" | draft chain of n steps / decode step: {chain}"
        )
    lines += _prefill_lines(report, markdown=False)
    if report.auto_start:
        lines.append(report.auto_start)
    lines.append("bound = tokens per round / (verify(K) + draft chain(K-1)), measured costs; effic = tok/s / bound")
    lines.append(
        "each row is its median repeat by tok/s (lower middle for an even count); bound and effic are that"
        " repeat's own, costs measured in the same repeat, so tok/s = effic x bound"
    )
    best = report.best
    if best is not None:
        off = report.config("off")
        speedup = f" ({best.tps / off.tps:.2f}x drafter off)" if off and off.tps else ""
        lines.append(f"best block size: {best.config} at {best.tps:.1f} tok/s{speedup}")
    lines.append("same: output identical to plain greedy decoding by the target")
    lines += noise_notes(report)
    return "\n".join(lines)


def _prefill_lines(report: BenchReport, markdown: bool) -> list[str]:
    """'prefill, 517-token prompt (median of 3): mlx-lm 812.3 tok/s, ours 845.0 tok/s (1.040x mlx-lm)',
    the ratio being that of the two medians."""
    if not report.prefill_tps:
        return []
    parts = [f"{'ours' if k == 'off' else k} {v:.1f} tok/s" for k, v in report.prefill_tps.items()]
    ratio = report.prefill_vs_baseline
    text = f"prefill, {report.prefill_tokens}-token prompt (median of {report.repeats}): " + ", ".join(parts)
    if ratio is not None:
        text += f" ({ratio:.3f}x mlx-lm)"
    return ["", f"- {text}"] if markdown else [text]
