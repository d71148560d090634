"""Engine.chat with tools on the reference pack's pairings: canonical prompt, streamed calls, stop reason,
history with tool results, and drafted output equal to the target alone.

The pack's models babble docstrings and never call a tool by themselves, so `scripted_call`
(support.scripted_calls) makes the target write one: a large bias on the target's logits for the
script's token at each position of the reply (a function of the absolute position, the same in a
one-token step and a K-token verify), optionally with the drafter proposing the script too (every
draft accepted, so the call's tokens and the stop come out of accepted runs). Everything else is the
real engine.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.tools import GET_CURRENT_TIME as TIME

from core.decode.prompt import encode_chat
from core.engine.contract import PairingSpec
from core.engine.local import Engine
from core.events import TokenEvent, ToolCall, ToolCallDelta, ToolCallError, ToolCallStarted, TurnDone
from core.settings import GenerationSettings

PACK = Path("tests/data/pack/models")
ASK = [{"role": "user", "content": "What time is it in Paris?"}]
CALL_TEXT = 'Checking.<|tool_call>call:get_current_time{timezone:<|"|>Europe/Paris<|"|>}<tool_call|><|tool_response>'


@pytest.fixture(scope="module")
def tokenizer():
    from mlx_lm.tokenizer_utils import load

    return load(PACK / "tokenizer")


def _engine(family: str, drafter: bool = True) -> Engine:
    eng = Engine()
    drafter_dir = str(PACK / f"{family}-assistant") if drafter else None
    eng.load(PairingSpec(family, str(PACK / f"{family}-target"), drafter_dir), None).result(timeout=120)
    return eng


def _chat(eng, messages, tools=None, **kw):
    events: list = []
    done = eng.chat(messages, GenerationSettings(**{"max_tokens": 48, **kw}), events.append, tools=tools)
    done = done.result(timeout=120)
    assert events[-1] is done and isinstance(done, TurnDone)
    return done, events


def scripted_call(monkeypatch, start: int, script: list[int], drafts: bool) -> None:
    from support.scripted_calls import script_reply

    script_reply(monkeypatch, start, script, drafts)


def _prompt_ids(tokenizer, messages, tools, empty_thought, thinking=False):
    return encode_chat(tokenizer, messages, tools=tools, empty_thought=empty_thought, thinking=thinking).ids


@pytest.mark.parametrize("family,drafts", [("dense-style", True), ("e-style", False), ("e-style", True)])
def test_a_call_streams_as_events_and_ends_the_turn(monkeypatch, tokenizer, family, drafts):
    prompt = _prompt_ids(tokenizer, ASK, [TIME], empty_thought=False)  # no pack template has the empty thought
    script = tokenizer._tokenizer.encode(CALL_TEXT, add_special_tokens=False)
    scripted_call(monkeypatch, len(prompt), script, drafts)
    replies = {}
    for with_drafter in (False, True):
        eng = _engine(family, drafter=with_drafter)
        try:
            assert eng.features.tools
            done, events = _chat(eng, ASK, [TIME], block_size=4)
        finally:
            eng.close()
        assert events[0].prompt_tokens == len(prompt)  # the canonical rendering, not the pack's template
        replies[with_drafter] = done
        assert list(done.token_ids) == script
        assert done.stats.stop_reason == "tool_calls"
        assert done.text == "Checking." and not done.tool_errors
        [call] = done.tool_calls
        assert (call.name, call.arguments) == ("get_current_time", {"timezone": "Europe/Paris"})
        assert call.raw == '<|tool_call>call:get_current_time{timezone:<|"|>Europe/Paris<|"|>}<tool_call|>'
        tokens = [e for e in events if isinstance(e, TokenEvent)]
        assert "".join(t.text for t in tokens) == "Checking."  # the call's tokens carry no text
        started = [e for e in events if isinstance(e, ToolCallStarted)]
        assert [(s.index, s.name, s.id) for s in started] == [(0, "get_current_time", call.id)]
        deltas = "".join(e.arguments for e in events if isinstance(e, ToolCallDelta))
        assert deltas == call.arguments_json == '{"timezone": "Europe/Paris"}'
        assert [e for e in events if isinstance(e, ToolCall)] == [call]
        # the call is streamed before the turn ends: Started comes right after the token that names it
        assert events.index(started[0]) < events.index(call) < events.index(done)
    assert replies[True].token_ids == replies[False].token_ids
    if drafts:
        assert replies[True].stats.accepted > len(script) // 2  # the call came out of accepted runs


def test_the_next_turn_reuses_the_call_and_renders_the_result(monkeypatch, tokenizer):
    prompt = _prompt_ids(tokenizer, ASK, [TIME], empty_thought=False)
    script = tokenizer._tokenizer.encode(CALL_TEXT, add_special_tokens=False)
    scripted_call(monkeypatch, len(prompt), script, drafts=False)
    eng = _engine("dense-style")
    try:
        done, _ = _chat(eng, ASK, [TIME])
        [call] = done.tool_calls
        # the text before the call as its own message: the canonical template renders a message's
        # content after its calls and results, so one message would not match what the model wrote
        history = ASK + [
            {"role": "assistant", "content": done.text},
            {"role": "assistant", "content": None, "tool_calls": [call.openai()]},
            {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"datetime": "2026-12-01T10:04:00+01:00"})},
        ]
        monkeypatch.undo()  # the model answers on its own now
        done2, events2 = _chat(eng, history, [TIME], max_tokens=8)
        want = _prompt_ids(tokenizer, history, [TIME], empty_thought=False)
        text = tokenizer._tokenizer.decode(want)
        assert 'response:get_current_time{datetime:<|"|>2026-12-01T10:04:00+01:00<|"|>}<tool_response|>' in text
        assert events2[0].prompt_tokens == len(want)
        # the cache kept the prompt and the model's own call (re-rendered to the same tokens)
        assert events2[0].reused_tokens == len(prompt) + len(script) - 1
        assert done2.error is None and done2.stats.stop_reason in ("eos", "max_tokens")
    finally:
        eng.close()


def test_thinking_after_a_tool_result_starts_the_reply_in_the_thought(tokenizer):
    history = ASK + [
        {
            "role": "assistant",
            "tool_calls": [
                {"id": "c", "function": {"name": "get_current_time", "arguments": '{"timezone": "Europe/Paris"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c", "content": "10:04"},
    ]
    eng = _engine("e-style", drafter=False)
    try:
        done, events = _chat(eng, history, [TIME], thinking=True, max_tokens=6)
    finally:
        eng.close()
    text = tokenizer._tokenizer.decode(_prompt_ids(tokenizer, history, [TIME], False, thinking=True))
    assert text.endswith("<tool_response|><|channel>thought\n")
    assert done.text.startswith("<|channel>thought\n")
    assert "".join(e.text for e in events if isinstance(e, TokenEvent)) == done.text


def test_without_tools_the_reply_is_untouched_and_tool_errors_are_clear():
    eng = _engine("e-style", drafter=False)
    try:
        plain, events = _chat(eng, ASK, max_tokens=12)
        assert not plain.tool_calls and plain.stats.stop_reason in ("eos", "max_tokens")
        assert "".join(e.text for e in events if isinstance(e, TokenEvent)) == plain.text
        bad, _ = _chat(eng, ASK, [{"type": "function", "function": {"name": "two words"}}])
        assert bad.stats.stop_reason == "error" and "tool 1: function.name must be a string" in bad.error
        bad, _ = _chat(
            eng, ASK + [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{"}}]}]
        )
        assert bad.stats.stop_reason == "error" and "message 2, tool call 1: arguments is not valid JSON" in bad.error
    finally:
        eng.close()


def test_a_malformed_call_is_reported_not_shown(monkeypatch, tokenizer):
    prompt = _prompt_ids(tokenizer, ASK, [TIME], empty_thought=False)
    script = tokenizer._tokenizer.encode(
        '<|tool_call>call:get_current_time{timezone:<|"|>Europe/Paris}<tool_call|><|tool_response>',
        add_special_tokens=False,
    )
    scripted_call(monkeypatch, len(prompt), script, drafts=False)
    eng = _engine("e-style")
    try:
        done, events = _chat(eng, ASK, [TIME])
    finally:
        eng.close()
    assert done.text == "" and not done.tool_calls and done.stats.stop_reason == "tool_calls"
    [error] = done.tool_errors
    assert error.message.startswith("the model produced a malformed tool call")
    assert error.raw == '<|tool_call>call:get_current_time{timezone:<|"|>Europe/Paris}<tool_call|>'
    assert [e for e in events if isinstance(e, ToolCallError)] == [error]


def test_the_variant_follows_the_checkpoints_template(factory_checkpoints, tokenizer):
    """A checkpoint whose template adds the empty thought channel (26B/31B-like) gets the canonical 31B variant."""
    target = factory_checkpoints.target("moe-style")
    eng = Engine()
    try:
        eng.load(PairingSpec("moe", str(target), None), None).result(timeout=120)
        _, events = _chat(eng, ASK, [TIME], max_tokens=2)
    finally:
        eng.close()
    want = encode_chat(tokenizer, ASK, tools=[TIME], empty_thought=True).ids
    assert events[0].prompt_tokens == len(want)
    assert tokenizer._tokenizer.decode(want).endswith("<|turn>model\n<|channel>thought\n<channel|>")


def test_audio_in_a_tool_result_reaches_the_model(tokenizer):
    """A tool result's audio clip is expanded into its soft tokens in the canonical prompt, and the reply
    is the same with the drafter as without."""
    audio_target = PACK / "e-style-audio-target"
    clip = "tests/data/pack/references/audio/inputs/sine_1s.pcm16.wav"
    history = [
        {"role": "user", "content": "Play the recording."},
        {"role": "assistant", "tool_calls": [{"id": "r", "function": {"name": "get_current_time", "arguments": "{}"}}]},
        {
            "role": "tool",
            "tool_call_id": "r",
            "content": [{"type": "text", "text": "here"}, {"type": "audio", "path": clip}],
        },
    ]
    ids = {}
    for drafter in (None, str(PACK / "e-style-assistant")):
        eng = Engine()
        try:
            eng.load(PairingSpec("audio", str(audio_target), drafter), None).result(timeout=120)
            done, events = _chat(eng, history, [TIME], max_tokens=8, block_size=3)
        finally:
            eng.close()
        assert done.error is None, done.error
        chat = encode_chat(tokenizer, history, tools=[TIME])
        assert len(chat.audio) == 1 and tokenizer._tokenizer.decode(chat.ids).endswith(
            'response:get_current_time{value:<|"|>here<|"|>}<tool_response|><|audio|>'
        )
        assert events[0].prompt_tokens == len(chat.ids) - 1 + 2 + 25  # <|audio|> -> boa + 25 soft tokens (1 s) + eoa
        ids[drafter is not None] = done.token_ids
    assert ids[True] == ids[False]
