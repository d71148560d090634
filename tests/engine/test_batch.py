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

from core.decode.batch import BatchDecoder
from core.decode.prompt import encode_messages
from core.decode.spec import Controls, Decoder, Prompt
from core.engine.pairings import demo_spec
from core.events import RoundEvent, TokenEvent
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


def _run_batch(tg: Target, dr: Any, plans: list[Plan]) -> dict[int, Any]:
    """Join each plan at its round, cancel at its round, step until every row has left."""
    bd = BatchDecoder(tg, dr, lambda: None, STOP)
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
    name, tg, dr, texts = fam
    rng = np.random.default_rng(1000 * seed + FAMILIES.index(name))
    plans = _draw(rng, texts, int(rng.integers(2, 6)))
    results = _run_batch(tg, dr, plans)
    for i, p in enumerate(plans):
        solo = _solo(tg, p)
        r = results[i]
        tokens = [e for e in p.events if isinstance(e, TokenEvent)]
        assert [t.id for t in tokens] == r.token_ids
        if r.stats.stop_reason == "cancelled":
            assert r.token_ids == solo[: len(r.token_ids)], f"row {i} ({p}) diverged before its cancel"
        else:
            assert r.token_ids == solo, f"row {i}: {p.settings}, prompt of {len(p.prompt)}, joined {p.join_round}"
            assert r.committed == p.prompt + r.token_ids[:-1]  # its cache held exactly what it emitted
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
