"""The engine's batch mode (`Engine(parallel=N)`, core.engine.batching) on the demo pairing: requests
from several threads decode together and each gets the reply it gets from a one-at-a-time engine;
cancelling one request stops only that one; more requests than rows wait and join as rows leave."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from core.engine.local import Engine
from core.engine.pairings import demo_spec
from core.events import PrefillDone, TokenEvent, TurnDone
from core.settings import GenerationSettings

PROMPTS = ["Tell me about the sea.", "What is a cat?", "Write a poem about rain.", "hi", "Explain rivers."]
BLOCKS: list[int | str] = [3, "auto", 4, 1, 2]


@pytest.fixture(scope="module")
def solo() -> dict[int, tuple[int, ...]]:
    engine = Engine()
    try:
        engine.load(demo_spec(), None).result(timeout=120)
        out = {}
        for i, p in enumerate(PROMPTS):
            s = GenerationSettings(max_tokens=24, block_size=BLOCKS[i])
            out[i] = engine.chat([{"role": "user", "content": p}], s, lambda e: None).result(timeout=120).token_ids
        return out
    finally:
        engine.close()


@pytest.fixture(scope="module")
def batched() -> Iterator[Engine]:
    engine = Engine(parallel=3)
    engine.load(demo_spec(), None).result(timeout=120)
    yield engine
    engine.close()


def test_concurrent_requests_get_their_solo_replies_and_wait_for_a_row(
    batched: Engine, solo: dict[int, tuple[int, ...]]
) -> None:
    events: dict[int, list[object]] = {i: [] for i in range(len(PROMPTS))}
    futures = {}
    for i, p in enumerate(PROMPTS):  # five requests, three rows: two wait and join as rows leave
        s = GenerationSettings(max_tokens=24, block_size=BLOCKS[i])
        futures[i] = batched.chat([{"role": "user", "content": p}], s, events[i].append)
    reset = batched.reset()  # not a generation request: it runs once the batch is empty
    dones = {i: f.result(timeout=300) for i, f in futures.items()}
    reset.result(timeout=60)
    for i, done in dones.items():
        assert done.error is None and done.token_ids == solo[i]
        tokens = [e for e in events[i] if isinstance(e, TokenEvent)]
        assert [t.id for t in tokens] == list(done.token_ids)
        assert isinstance(events[i][0], PrefillDone) and isinstance(events[i][-1], TurnDone)
        assert done.stats.tokens == len(done.token_ids) and done.stats.prompt_tokens > 0
    # the stats are each row's own: its rounds, its acceptance
    assert len({(d.stats.rounds, d.stats.accepted) for d in dones.values()}) > 1


def test_cancel_turn_stops_only_that_request(batched: Engine, solo: dict[int, tuple[int, ...]]) -> None:
    first_token = threading.Event()

    def on_event(ev: object) -> None:
        if isinstance(ev, TokenEvent):
            first_token.set()

    s = GenerationSettings(max_tokens=400, ignore_eos=True, block_size=3)
    doomed = batched.chat([{"role": "user", "content": "Count forever."}], s, on_event)
    keep = batched.chat(
        [{"role": "user", "content": PROMPTS[0]}], GenerationSettings(max_tokens=24, block_size=3), lambda e: None
    )
    assert first_token.wait(120)
    t0 = time.monotonic()
    batched.cancel_turn(doomed)
    done = doomed.result(timeout=60)
    assert done.stats.stop_reason == "cancelled" and len(done.token_ids) < 400
    assert time.monotonic() - t0 < 30
    kept = keep.result(timeout=120)
    assert kept.stats.stop_reason != "cancelled" and kept.token_ids == solo[0]


def test_a_refused_request_does_not_disturb_the_batch(batched: Engine, solo: dict[int, tuple[int, ...]]) -> None:
    good = batched.chat(
        [{"role": "user", "content": PROMPTS[1]}], GenerationSettings(max_tokens=24, block_size="auto"), lambda e: None
    )
    nan = GenerationSettings(temperature=float("nan"))
    bad = batched.chat([{"role": "user", "content": "hi"}], nan, lambda e: None)
    refused = bad.result(timeout=120)
    assert refused.stats.stop_reason == "error" and refused.error and "temperature" in refused.error
    assert good.result(timeout=120).token_ids == solo[1]


def test_reset_forgets_the_batchs_cached_prefixes(batched: Engine, solo: dict[int, tuple[int, ...]]) -> None:
    """A finished row's cache serves a later request that continues it (reused prompt tokens > 0); after
    `Engine.reset()` nothing is reused: the next request prefills its whole prompt, with the same reply."""
    first = [{"role": "user", "content": PROMPTS[2]}]
    s = GenerationSettings(max_tokens=24, block_size=BLOCKS[2])
    done = batched.chat(first, s, lambda e: None).result(timeout=120)
    again = [*first, {"role": "assistant", "content": done.text}, {"role": "user", "content": "More."}]
    reused = batched.chat(again, s, lambda e: None).result(timeout=120)
    assert reused.stats.reused_tokens > 0
    batched.reset().result(timeout=60)
    fresh = batched.chat(again, s, lambda e: None).result(timeout=120)
    assert fresh.stats.reused_tokens == 0 and fresh.stats.prefill_tokens == fresh.stats.prompt_tokens
    assert fresh.token_ids == reused.token_ids
