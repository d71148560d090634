"""The engine thread: load, chat turns with cache reuse, cancel, live controls, errors."""

import json
import threading

import pytest

from core.engine.contract import EngineError, PairingSpec
from core.engine.local import Engine
from core.events import LoadProgress, PrefillDone, RoundEvent, TokenEvent, TurnDone
from core.settings import GenerationSettings

PACK = "tests/data/pack/models"
TEXT = "tests/data/pack/references/text"


def _spec(family, drafter=True):
    return PairingSpec(family, f"{PACK}/{family}-target", f"{PACK}/{family}-assistant" if drafter else None)


@pytest.fixture(scope="module")
def engine():
    eng = Engine()
    stages = []
    info = eng.load(_spec("dense-style"), stages.append).result(timeout=120)
    assert [p.stage for p in stages][-1] == "ready" and all(isinstance(p, LoadProgress) for p in stages)
    assert info.context_length == 131072 and info.vocab_size == 2048 and info.sliding_window == 12
    assert info.has_vision and info.dtype == "float32" and info.drafter_path.endswith("dense-style-assistant")
    assert eng.info is info
    yield eng
    eng.close()


def _chat(eng, messages, **kw):
    events = []
    done = eng.chat(messages, GenerationSettings(**kw), events.append).result(timeout=120)
    assert events[-1] is done and isinstance(done, TurnDone)
    return done, events


def test_chat_renders_with_template_and_matches_reference(engine):
    ref = json.load(open(f"{TEXT}/dense-style.json"))["prompts"]
    engine.reset().result()
    for name in ("short", "multiturn"):
        done, events = _chat(engine, ref[name]["messages"], block_size=4, max_tokens=40)
        assert list(done.token_ids) == ref[name]["greedy_eos_stop"]["ids"]
        assert done.stats.stop_reason == "eos" and done.error is None
        assert events[0].prompt_tokens == len(ref[name]["prompt_ids"])
        assert done.text == ref[name]["greedy_eos_stop"]["text_until_eos"]
        tokens = [e for e in events if isinstance(e, TokenEvent)]
        assert "".join(e.text for e in tokens) == done.text


def test_multiturn_reuse_equals_full_reprefill(engine):
    ref = json.load(open(f"{TEXT}/dense-style.json"))["prompts"]
    engine.reset().result()
    history = list(ref["long"]["messages"])  # 203 tokens: 17 windows
    replies = []
    for turn in range(3):
        done, events = _chat(engine, history, block_size="auto", max_tokens=30)
        prefill = events[0]
        assert isinstance(prefill, PrefillDone)
        if turn:
            assert prefill.reused_tokens > 100 and prefill.prefill_tokens < 40
        replies.append(done.token_ids)
        history += [{"role": "assistant", "content": done.text}, {"role": "user", "content": f"Say more, part {turn}."}]
    # the same conversation from an empty cache, drafter off: identical replies
    fresh = Engine()
    try:
        fresh.load(_spec("dense-style", drafter=False), None).result(timeout=120)
        history = list(ref["long"]["messages"])
        for turn in range(3):
            done = fresh.chat(history, GenerationSettings(max_tokens=30), None).result(timeout=120)
            assert done.token_ids == replies[turn]
            history += [
                {"role": "assistant", "content": done.text},
                {"role": "user", "content": f"Say more, part {turn}."},
            ]
    finally:
        fresh.close()


@pytest.mark.parametrize("repeat,reused", [(20, 10), (80, 0)])
def test_edit_history_rolls_back_or_reprefills(engine, repeat, reused):
    # an edited first message leaves a 10-token common prefix; a short conversation rolls the
    # cache back to it, a long one (the sliding cache compacted past it) re-prefills everything
    engine.reset().result()
    _chat(engine, [{"role": "user", "content": "What is a list? " * repeat}], max_tokens=8)
    msgs = [{"role": "user", "content": "What is a dict?"}]
    b, events = _chat(engine, msgs, max_tokens=12, block_size=3)
    assert events[0].reused_tokens == reused
    engine.reset().result()
    c, _ = _chat(engine, msgs, max_tokens=12, block_size=1)
    assert b.token_ids == c.token_ids


def test_cancel_and_live_controls_mid_turn(engine):
    engine.reset().result()
    msgs = [{"role": "user", "content": "Explain how a dictionary lookup works."}]
    rounds = []

    def on_event(e):
        if isinstance(e, RoundEvent):
            rounds.append(e)
            if e.round == 1:
                engine.set_block_size(5)
            elif e.round == 3:
                engine.set_drafter_enabled(False)
            elif e.round == 5:
                engine.cancel()

    done = engine.chat(msgs, GenerationSettings(block_size=2, max_tokens=60, ignore_eos=True), on_event).result(
        timeout=120
    )
    assert done.stats.stop_reason == "cancelled" and done.stats.rounds == 5
    assert [r.block_size for r in rounds] == [2, 5, 5, 1, 1]
    # the cache stayed consistent: a follow-up turn equals the same turn from scratch
    follow = [
        {"role": "user", "content": "Explain how a dictionary lookup works."},
        {"role": "assistant", "content": done.text},
        {"role": "user", "content": "Shorter."},
    ]
    x, _ = _chat(engine, follow, max_tokens=10, block_size=4)
    engine.reset().result()
    y, _ = _chat(engine, follow, max_tokens=10, block_size=1)
    assert x.token_ids == y.token_ids


def test_errors_become_turn_done(engine):
    done, _ = _chat(engine, [{"role": "user", "content": "word " * 40}], max_tokens=5)
    assert done.error is None
    st = engine._state
    saved, st.target.context_length = st.target.context_length, 30
    try:
        done, events = _chat(engine, [{"role": "user", "content": "word " * 40}], max_tokens=5)
    finally:
        st.target.context_length = saved
    assert done.stats.stop_reason == "error" and "context" in done.error and len(events) == 1
    done, _ = _chat(engine, [{"role": "user", "content": ""}], max_tokens=3)  # empty message: still a prompt
    assert done.error is None and len(done.token_ids) >= 1
    done = engine.complete([], GenerationSettings(max_tokens=3), None).result(timeout=60)
    assert done.stats.stop_reason == "error" and "empty" in done.error
    bad = engine.chat([{"role": "user", "content": "x"}], GenerationSettings(max_tokens=0), None).result(timeout=60)
    assert bad.stats.stop_reason == "error" and "max_tokens" in bad.error


def test_complete_without_template(engine):
    done = engine.complete("def reverse(items):", GenerationSettings(max_tokens=6, ignore_eos=True), None).result(
        timeout=60
    )
    assert done.error is None and len(done.token_ids) == 6


def test_load_errors_and_no_model():
    eng = Engine()
    try:
        done = eng.chat([{"role": "user", "content": "hi"}], GenerationSettings(), None).result(timeout=30)
        assert done.stats.stop_reason == "error" and "no model" in done.error
        with pytest.raises(EngineError, match="backbone_hidden_size"):
            eng.load(PairingSpec("bad", f"{PACK}/e-style-target", f"{PACK}/moe-style-assistant"), None).result(
                timeout=60
            )
        with pytest.raises(EngineError, match="not a Gemma 4 assistant"):
            eng.load(PairingSpec("bad", f"{PACK}/e-style-target", f"{PACK}/e-style-target"), None).result(timeout=60)
        with pytest.raises(EngineError, match="no such checkpoint"):
            eng.load(PairingSpec("bad", "/nonexistent/dir", None), None).result(timeout=60)
        assert eng.info is None
    finally:
        eng.close()
    with pytest.raises(EngineError):
        eng.chat([], GenerationSettings(), None).result(timeout=5)


def test_image_chat_matches_hf_reference():
    meta = json.load(open("tests/data/pack/references/images/moe-style.json"))
    eng = Engine()
    try:
        eng.load(_spec("moe-style"), None).result(timeout=120)
        msgs = [
            {
                "role": "user",
                "content": [
                    {"type": "image", "path": "tests/data/pack/references/images/test_image.png"},
                    {"type": "text", "text": "Describe this picture in one sentence."},
                ],
            }
        ]
        done = eng.chat(msgs, GenerationSettings(max_tokens=30, ignore_eos=True, block_size=3), None).result(
            timeout=120
        )
        assert done.error is None
        assert list(done.token_ids) == meta["hf"]["greedy_ids"]
        # a second turn keeps the image in the cache (no vision or prefill work for it)
        events = []
        msgs2 = msgs + [{"role": "assistant", "content": done.text}, {"role": "user", "content": "Again."}]
        eng.chat(msgs2, GenerationSettings(max_tokens=4), events.append).result(timeout=120)
        assert events[0].reused_tokens > 136
    finally:
        eng.close()


def test_callbacks_run_on_one_engine_thread_and_close_is_prompt(engine):
    threads = set()
    engine.chat(
        [{"role": "user", "content": "hi"}],
        GenerationSettings(max_tokens=5),
        lambda e: threads.add(threading.current_thread().name),
    ).result(timeout=60)
    assert threads == {"gemma-chat-engine"}


def test_thinking_and_system_prompt_reach_the_template(engine):
    engine.reset().result()
    msgs = [{"role": "user", "content": "hi"}]
    sizes = {}
    for key, kw in {"plain": {}, "thinking": {"thinking": True}, "system": {"system_prompt": "Be brief."}}.items():
        _, events = _chat(engine, msgs, max_tokens=1, **kw)
        sizes[key] = events[0].prompt_tokens
    assert engine.info.supports_thinking
    assert sizes["thinking"] > sizes["plain"] and sizes["system"] > sizes["plain"]


def test_loaded_pairing_is_frozen_for_the_gc_and_a_replaced_one_is_reclaimed():
    """After a load the long-lived heap is frozen, so full collections (which hold the GIL while the
    UI and the engine share it) only scan young objects; loading another pairing thaws it first, so
    the previous model is reclaimed even where its objects form reference cycles."""
    import gc
    import weakref

    eng = Engine()
    try:
        eng.load(_spec("e-style"), None).result(timeout=120)
        assert gc.get_freeze_count() > 10_000
        first = eng._state.target
        first.cycle = first  # a reference cycle: only the cyclic collector can free it
        gone = weakref.ref(first)
        del first
        eng.load(_spec("dense-style"), None).result(timeout=120)
        assert gone() is None
        assert gc.get_freeze_count() > 10_000
        done, _ = _chat(eng, [{"role": "user", "content": "hi"}], max_tokens=3, ignore_eos=True)
        assert done.error is None and len(done.token_ids) == 3
    finally:
        eng.close()
        gc.unfreeze()
