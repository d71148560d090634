"""Batched decoding (core.decode.batch): every row of a batch gets exactly the ids it gets alone.

Scenarios are drawn at random from a seed (prompt lengths across the sliding window, block sizes,
join rounds, cancellations, max tokens, eos on or off) and every finished row is compared with the
same request decoded alone by the target without the drafter (`Decoder`, block size 1), on each
reference-pack family and the demo. A cancelled row must have emitted a prefix of its solo ids.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest

from core.decode import batch as batch_mod
from core.decode.batch import BatchDecoder
from core.decode.prefix_cache import PrefixCache
from core.decode.prompt import encode_messages
from core.decode.spec import Controls, Decoder, Prompt
from core.engine.pairings import demo_spec
from core.events import PrefillDone, RoundEvent, TokenEvent
from core.model.drafter import load_drafter
from core.model.loader import load_tokenizer
from core.model.target import Target, load_target
from core.settings import GenerationSettings

PACK = "tests/data/pack/models"
FAMILIES = ["e-style", "moe-style", "dense-style", "unified-style", "demo"]
STOP = {1, 22, 12, 106}


@pytest.fixture(scope="module", params=FAMILIES)
def fam(request: pytest.FixtureRequest) -> tuple[str, Target, Any, list[list[int]]]:
    name = request.param
    if name == "demo":
        spec = demo_spec()
        assert spec.drafter is not None
        tg, dr = load_target(spec.target), load_drafter(spec.drafter)
        tok = load_tokenizer(Path(spec.target))
        chat = [{"role": "user", "content": "Tell me about the sea and the ships that sail on it."}]
        asked = encode_messages(tok, chat)
        rng = np.random.default_rng(7)
        noise = [int(i) for i in rng.integers(3, 2000, size=600)]  # nothing the demo knows: low acceptance
        return name, tg, dr, [asked, noise + asked]
    tg = load_target(f"{PACK}/{name}-target")
    dr = load_drafter(f"{PACK}/{name}-assistant")
    ref = json.load(open(f"tests/data/pack/references/text/{name}.json"))["prompts"]
    return name, tg, dr, [ref[k]["prompt_ids"] for k in ("short", "multiturn", "long")]


@dataclass
class Plan:
    prompt: list[int]
    settings: GenerationSettings
    join_round: int
    cancel_round: int | None = None  # rounds after its join
    events: list[object] = field(default_factory=list)


def _draw(rng: np.random.Generator, texts: list[list[int]], rows: int) -> list[Plan]:
    plans = []
    for _ in range(rows):
        text = texts[int(rng.integers(len(texts)))]
        length = int(rng.integers(2, len(text) + 1))
        block = [1, 2, 3, 4, 6, "auto"][int(rng.integers(6))]
        settings = GenerationSettings(
            max_tokens=int(rng.integers(1, 22)), block_size=block, ignore_eos=bool(rng.integers(2))
        )
        cancel = int(rng.integers(0, 6)) if rng.random() < 0.25 else None
        plans.append(Plan(text[:length], settings, int(rng.integers(0, 8)), cancel))
    return plans


def _solo(tg: Target, plan: Plan) -> list[int]:
    settings = GenerationSettings(max_tokens=plan.settings.max_tokens, ignore_eos=plan.settings.ignore_eos)
    return Decoder(tg, None, None, STOP).run(tg.make_cache(), Prompt(plan.prompt), settings, lambda e: None).token_ids


def _run_batch(
    tg: Target, dr: Any, plans: list[Plan], reuse: bool = True, prefill_tokens: int | None = None
) -> dict[int, Any]:
    """Join each plan at its round, cancel at its round, step until every row has left. reuse=False: no
    prefix cache; prefill_tokens: a fixed prefill budget per step while rows decode (else measured)."""
    prefix = None if reuse else PrefixCache(max_entries=0)
    bd = BatchDecoder(tg, dr, lambda: None, STOP, prefix_cache=prefix, prefill_tokens=prefill_tokens)
    controls = [Controls(p.settings.block_size, True) for p in plans]
    results: dict[int, Any] = {}
    rnd = 0
    while len(results) < len(plans):
        for i, p in enumerate(plans):
            if p.join_round == rnd:
                bd.join(Prompt(p.prompt), p.settings, p.events.append, controls[i], tag=i)
            if p.cancel_round is not None and p.join_round + p.cancel_round == rnd:
                controls[i].cancel_event.set()
        bd.step()
        for row, result in bd.take_finished():
            assert row.tag not in results
            results[row.tag] = result
        rnd += 1
        assert rnd < 500, "the batch never drained"
    assert not bd.rows
    return results


@pytest.mark.parametrize("seed", [0, 1])
def test_batched_greedy_rows_equal_their_solo_runs(fam: tuple, seed: int) -> None:
    """seed 0: no prefix reuse, prompts prefilled 16 tokens per step while rows decode (many chunks,
    joins mid-prefill); seed 1: the measured prefill budget and the prefix cache (plans share prefixes
    of the same texts, so later rows start from earlier rows' caches)."""
    name, tg, dr, texts = fam
    rng = np.random.default_rng(1000 * seed + FAMILIES.index(name))
    plans = _draw(rng, texts, int(rng.integers(2, 6)))
    results = _run_batch(tg, dr, plans, reuse=seed == 1, prefill_tokens=16 if seed == 0 else None)
    for i, p in enumerate(plans):
        solo = _solo(tg, p)
        r = results[i]
        tokens = [e for e in p.events if isinstance(e, TokenEvent)]
        assert [t.id for t in tokens] == r.token_ids
        if r.stats.stop_reason == "cancelled":
            assert r.token_ids == solo[: len(r.token_ids)], f"row {i} ({p}) diverged before its cancel"
        else:
            assert r.token_ids == solo, f"row {i}: {p.settings}, prompt of {len(p.prompt)}, joined {p.join_round}"
            # its cache held exactly what it emitted (after the prefix it reused from an earlier row)
            assert r.committed == p.prompt[r.stats.reused_tokens :] + r.token_ids[:-1]
        rounds = [e for e in p.events if isinstance(e, RoundEvent)]
        assert sum(e.emitted for e in rounds) == max(0, len(r.token_ids) - 1) == r.stats.decode_tokens
        if p.settings.block_size != "auto":  # each row verifies at its own block size, whatever its neighbours'
            assert all(e.block_size <= int(p.settings.block_size) for e in rounds)


def test_rows_draft_together_and_accept_their_own_prefix(fam: tuple) -> None:
    """Rows at different lengths in one batch at block size 4: they accept different numbers of drafts
    in the same round, and still each equals its solo run."""
    _, tg, dr, texts = fam
    plans = [
        Plan(
            texts[0][: max(2, len(texts[0]) // 2)], GenerationSettings(max_tokens=24, block_size=4, ignore_eos=True), 0
        ),
        Plan(texts[-1], GenerationSettings(max_tokens=24, block_size=4, ignore_eos=True), 0),
        Plan(texts[0], GenerationSettings(max_tokens=24, block_size=4, ignore_eos=True), 0),
    ]
    results = _run_batch(tg, dr, plans)
    per_round = [[e.accepted for e in p.events if isinstance(e, RoundEvent)] for p in plans]
    assert all(max(e.block_size for e in p.events if isinstance(e, RoundEvent)) == 4 for p in plans)
    assert len({tuple(r) for r in per_round}) > 1  # rows advanced at different speeds
    for i, p in enumerate(plans):
        assert results[i].token_ids == _solo(tg, p)


def test_a_row_leaves_at_once_and_frees_its_cache(fam: tuple) -> None:
    _, tg, dr, texts = fam
    bd = BatchDecoder(tg, dr, lambda: None, STOP)
    short = GenerationSettings(max_tokens=2, block_size=3, ignore_eos=True)
    long = GenerationSettings(max_tokens=20, block_size=3, ignore_eos=True)
    bd.join(Prompt(texts[0]), short, lambda e: None, Controls(3), tag="short")
    bd.join(Prompt(texts[-1]), long, lambda e: None, Controls(3), tag="long")
    bd.step()
    finished = bd.take_finished()
    assert [row.tag for row, _ in finished] == ["short"] and [r.tag for r in bd.rows] == ["long"]
    assert finished[0][1].token_ids and len(finished[0][1].token_ids) == 2
    assert finished[0][0].h is None  # nothing of the row is kept alive by the batch


def test_a_drained_batch_gives_mlxs_buffer_cache_back() -> None:
    """When the last row leaves, the buffers MLX keeps for reuse are freed (the server's memory goes back to
    its idle level between bursts)."""
    spec = demo_spec()
    assert spec.drafter is not None
    tg, dr = load_target(spec.target), load_drafter(spec.drafter)
    bd = BatchDecoder(tg, dr, lambda: None, STOP)
    short = GenerationSettings(max_tokens=3, block_size=3, ignore_eos=True)
    long = GenerationSettings(max_tokens=12, block_size=3, ignore_eos=True)
    bd.join(Prompt(list(range(3, 40))), short, lambda e: None, Controls(3), tag="short")
    bd.join(Prompt(list(range(5, 60))), long, lambda e: None, Controls(3), tag="long")
    left: list[Any] = []
    while len(left) < 2:
        bd.step()
        done = bd.take_finished()
        left += [row.tag for row, _ in done]
    assert left == ["short", "long"] and mx.get_cache_memory() == 0


def test_seeded_sampled_rows_draw_what_they_draw_alone() -> None:
    """Temperature > 0: each row verifies by rejection sampling with its own key stream at its own block
    size (3, 5, and a plain step inside the others' drafting rounds), so with the same seed a row's ids
    equal its solo run with the drafter."""
    tg = load_target(f"{PACK}/e-style-target")
    dr = load_drafter(f"{PACK}/e-style-assistant")
    ref = json.load(open("tests/data/pack/references/text/e-style.json"))["prompts"]
    prompts = [ref["short"]["prompt_ids"], ref["multiturn"]["prompt_ids"], ref["long"]["prompt_ids"][:40]]
    settings = [
        GenerationSettings(max_tokens=20, block_size=b, ignore_eos=True, temperature=t, seed=s, top_k=k)
        for t, s, k, b in ((0.8, 1, 0, 3), (1.0, 2, 50, 5), (1.3, 3, 0, 1))
    ]
    bd = BatchDecoder(tg, dr, lambda: None, STOP)
    for i, (p, s) in enumerate(zip(prompts, settings)):
        bd.join(Prompt(p), s, lambda e: None, Controls(s.block_size), tag=i)
    results = {}
    while bd.rows:
        bd.step()
        results.update({row.tag: r for row, r in bd.take_finished()})
    for i, (p, s) in enumerate(zip(prompts, settings)):
        solo = Decoder(tg, dr, None, STOP).run(tg.make_cache(), Prompt(p), s, lambda e: None)
        assert results[i].token_ids == solo.token_ids
    assert len({tuple(r.token_ids) for r in results.values()}) == 3
    mx.clear_cache()


def _drain(bd: BatchDecoder, results: dict[Any, Any], steps: int = 400) -> None:
    for _ in range(steps):
        if not bd.rows:
            return
        bd.step()
        results.update({row.tag: r for row, r in bd.take_finished()})
    raise AssertionError("the batch never drained")


def _join_while_two_decode(bd: BatchDecoder, plans: list) -> tuple[int, list[int]]:
    """Rows 0 and 1 join and decode two steps, then row 2 joins: step until its prefill is done. (steps it
    took, rounds rows 0 and 1 ran meanwhile)."""
    for i, p in enumerate(plans[:2]):
        bd.join(Prompt(p.prompt), p.settings, p.events.append, Controls(3), tag=i)
    bd.step()
    bd.step()
    row = bd.join(Prompt(plans[2].prompt), plans[2].settings, plans[2].events.append, Controls(3), tag=2)

    def rounds() -> list[int]:
        return [len([e for e in p.events if isinstance(e, RoundEvent)]) for p in plans[:2]]

    before, steps = rounds(), 0
    while row.prefill is not None:
        bd.step()
        steps += 1
    return steps, [a - b for a, b in zip(rounds(), before)]


def test_a_long_prompt_prefills_in_chunks_while_the_others_decode(fam: tuple) -> None:
    """A long prompt joining two decoding rows is prefilled 24 tokens per step: the running rows get a
    round every step meanwhile, the newcomer's first token comes once its last chunk ran, and every
    row still equals its solo run."""
    _, tg, dr, texts = fam
    bd = BatchDecoder(tg, dr, lambda: None, STOP, prefill_tokens=24)
    go = GenerationSettings(max_tokens=60, block_size=3, ignore_eos=True)
    plans = [Plan(texts[0][:20], go, 0), Plan(texts[0], go, 0), Plan(texts[-1], go, 2)]
    steps, rounds = _join_while_two_decode(bd, plans)
    assert steps >= (len(plans[2].prompt) - 1) // 24  # chunks of at most 24 tokens
    assert all(n >= steps - 1 for n in rounds)  # the others decoded meanwhile
    assert isinstance(plans[2].events[0], PrefillDone) and isinstance(plans[2].events[1], TokenEvent)
    results: dict[Any, Any] = {}
    _drain(bd, results)
    for i, p in enumerate(plans):
        assert results[i].token_ids == _solo(tg, p), f"row {i}"


def test_a_joining_prompt_prefills_in_join_steps_while_the_others_decode(
    fam: tuple, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the measured budget, a long prompt joining two decoding rows prefills in at most JOIN_STEPS steps
    (its first token within its prefill + JOIN_STEPS - 1 of the others' rounds), the others get a round in
    every step meanwhile, and every row equals its solo run. (The stall cap is lifted: this machine's speed
    must not decide the count; its own test is below.)"""
    _, tg, dr, texts = fam
    monkeypatch.setattr(batch_mod, "JOIN_MAX_STALL_S", 1e9)
    bd = BatchDecoder(tg, dr, lambda: None, STOP, prefix_cache=PrefixCache(max_entries=0))
    go = GenerationSettings(max_tokens=30, block_size=3, ignore_eos=True)
    plans = [Plan(texts[0][:20], go, 0), Plan(texts[0][:12], go, 0), Plan(texts[-1], go, 2)]
    steps, rounds = _join_while_two_decode(bd, plans)
    assert 1 <= steps <= batch_mod.JOIN_STEPS
    assert rounds == [steps, steps]  # a round for the others every step
    assert isinstance(plans[2].events[0], PrefillDone) and isinstance(plans[2].events[1], TokenEvent)
    results: dict[Any, Any] = {}
    _drain(bd, results)
    for i, p in enumerate(plans):
        assert results[i].token_ids == _solo(tg, p), f"row {i}"


def test_the_join_budget_takes_a_share_of_the_prompt_within_the_stall_cap() -> None:
    """While rows decode, a step prefills the larger of the round's share and 1/JOIN_STEPS of the joining
    prompt; the latter at most JOIN_MAX_STALL_S of prefill at the measured rate; nothing decoding: no limit."""
    spec = demo_spec()
    assert spec.drafter is not None
    tg = load_target(spec.target)
    bd = BatchDecoder(tg, None, lambda: None, STOP)
    bd.join(Prompt(list(range(3, 603))), GenerationSettings(), lambda e: None, Controls(1))
    per_step = -(-600 // batch_mod.JOIN_STEPS)
    bd.round_s, bd.prefill_tps = 0.05, 2000.0  # a round's share: 0.05 s x 2000 tok/s x PREFILL_SHARE = 50 -> 48
    assert bd._prefill_budget(True) == per_step
    bd.prefill_tps = 100.0  # slow prefill: the share is the floor (16); the prompt's share capped at 1 s of it
    assert bd._prefill_budget(True) == min(per_step, int(batch_mod.JOIN_MAX_STALL_S * 100))
    bd.round_s, bd.prefill_tps = 10.0, 2000.0  # a long round: its share (capped at PREFILL_CHUNK) is larger
    assert bd._prefill_budget(True) == max(per_step, batch_mod.PREFILL_CHUNK)
    assert bd._prefill_budget(False) is None


def test_a_prompt_quick_to_prefill_joins_in_one_step() -> None:
    """A joining prompt whose prefill takes at most JOIN_ONE_STEP_S at the measured rate runs whole in the next
    step (its first token waits for no round of the others); a longer one is split; with no rate measured yet,
    it is split too."""
    spec = demo_spec()
    tg = load_target(spec.target)
    bd = BatchDecoder(tg, None, lambda: None, STOP)
    bd.join(Prompt(list(range(3, 303))), GenerationSettings(), lambda e: None, Controls(1))
    bd.round_s = 0.01  # a round's own share is the floor (16 tokens)
    bd.prefill_tps = 300 / batch_mod.JOIN_ONE_STEP_S  # exactly JOIN_ONE_STEP_S for all 300
    assert bd._prefill_budget(True) == 300
    bd.prefill_tps = 299 / batch_mod.JOIN_ONE_STEP_S  # a little slower: two steps
    assert bd._prefill_budget(True) == 300 // batch_mod.JOIN_STEPS
    bd.prefill_tps = None
    assert bd._prefill_budget(True) == max(4 * batch_mod.PREFILL_MIN_CHUNK, 300 // batch_mod.JOIN_STEPS)
    bd.prefill_tps = 200 / batch_mod.JOIN_ONE_STEP_S  # half of it in already: the other half fits in one step
    bd.rows[0].prefill.done = 150  # type: ignore[union-attr]
    assert bd._prefill_budget(True) == 150


def test_requests_that_arrive_together_join_the_next_round_together() -> None:
    """Several quick prompts waiting while a row decodes (a client fanning out) all prefill in the next step
    and decode in its round, not one more per round; a queue longer than one step's pause is split, in
    join order, and every row equals its solo run."""
    spec = demo_spec()
    assert spec.drafter is not None
    tg, dr = load_target(spec.target), load_drafter(spec.drafter)
    tok = load_tokenizer(spec.target)
    texts = [encode_messages(tok, [{"role": "user", "content": q}]) for q in ("Hi.", "Hello there.", "Why?")]
    bd = BatchDecoder(tg, dr, lambda: None, STOP, prefix_cache=PrefixCache(max_entries=0))
    go = GenerationSettings(max_tokens=12, block_size=2, ignore_eos=True)
    plans = [Plan(texts[i % 3], go, 0) for i in range(5)]
    bd.join(Prompt(plans[0].prompt), go, plans[0].events.append, Controls(2), tag=0)
    bd.step()  # row 0 alone: prefilled at full speed, then its first round
    bd.round_s = 1e-6  # a round's own share of prefill is the floor (PREFILL_MIN_CHUNK)
    for i, p in enumerate(plans[1:], 1):
        bd.join(Prompt(p.prompt), go, p.events.append, Controls(2), tag=i)
    # room for exactly rows 1-3 in one step's pause (JOIN_ONE_STEP_S): row 4 waits for the next
    bd.prefill_tps = sum(len(p.prompt) for p in plans[1:4]) / batch_mod.JOIN_ONE_STEP_S
    bd.step()

    def rounds(p: Plan) -> int:
        return len([e for e in p.events if isinstance(e, RoundEvent)])

    assert [rounds(p) for p in plans] == [2, 1, 1, 1, 0]
    assert all(isinstance(p.events[0], PrefillDone) for p in plans[1:4]) and not plans[4].events
    results: dict[Any, Any] = {}
    _drain(bd, results)
    for i, p in enumerate(plans):
        assert results[i].token_ids == _solo(tg, p), f"row {i}"


def test_a_continued_conversation_prefills_only_its_new_tokens(fam: tuple) -> None:
    """Turn 2 resends turn 1's prompt and reply with more tokens: it starts from turn 1's cache (the reused
    count is exact) and decodes exactly what it decodes from scratch; a request that shares only a prefix
    the sliding cache has compacted away reuses nothing and is exact too."""
    _, tg, dr, texts = fam
    bd = BatchDecoder(tg, dr, lambda: None, STOP)
    turn1 = Plan(texts[-1], GenerationSettings(max_tokens=12, block_size=3, ignore_eos=True), 0)
    bd.join(Prompt(turn1.prompt), turn1.settings, turn1.events.append, Controls(3), tag="t1")
    results: dict[Any, Any] = {}
    _drain(bd, results)
    reply = results["t1"].token_ids
    turn2 = Plan(turn1.prompt + reply + texts[0][:9], GenerationSettings(max_tokens=16, block_size=4), 0)
    other = Plan(texts[0], GenerationSettings(max_tokens=30, block_size=2, ignore_eos=True), 0)
    bd.join(Prompt(other.prompt), other.settings, other.events.append, Controls(2), tag="other")
    bd.step()
    row = bd.join(Prompt(turn2.prompt), turn2.settings, turn2.events.append, Controls(4), tag="t2")
    assert row.stats.reused_tokens == len(turn1.prompt) + len(reply) - 1  # all its cache held
    _drain(bd, results)
    assert results["t2"].token_ids == _solo(tg, turn2) and results["other"].token_ids == _solo(tg, other)
    done = next(e for e in turn2.events if isinstance(e, PrefillDone))
    assert done.reused_tokens == results["t2"].stats.reused_tokens and done.prefill_tokens == 10
    if tg.window > 64:
        return  # the demo's window is 1024: the pack's families (window 12) show the refusal
    # a long first turn: its sliding cache compacts (window 12, 256 slots of slack), so its early prefix is gone
    bd = BatchDecoder(tg, dr, lambda: None, STOP)
    long1 = Plan((texts[-1] * 3)[:500], GenerationSettings(max_tokens=20, block_size=3, ignore_eos=True), 0)
    bd.join(Prompt(long1.prompt), long1.settings, long1.events.append, Controls(3), tag="long")
    _drain(bd, results)
    branch = Plan(long1.prompt[:100] + texts[0][:5], GenerationSettings(max_tokens=8), 0)
    row = bd.join(Prompt(branch.prompt), branch.settings, branch.events.append, Controls(3), tag="branch")
    assert len(bd.prefix) == 1 and row.stats.reused_tokens == 0  # not restorable: refused
    _drain(bd, results)
    assert results["branch"].token_ids == _solo(tg, branch)
    mx.clear_cache()
