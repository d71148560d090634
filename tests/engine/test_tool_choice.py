"""tool_choice "required" and a named function: the reply's forced start (core.decode.forced).

On the reference pack's trained pairings (float32): the reply starts with `<|tool_call>call:NAME{`,
where two declared names differ the target's own logits choose (checked against the target run
independently), the reply after the forced start is exactly what greedy decoding gives from the
prompt followed by those tokens (so the cache and the hidden state the walk leaves are right), and
greedy output with the drafter equals the target alone. Then the engine: both the solo turn and the
batched rows of `Engine(parallel=2)` return the forced call as a ToolCall.
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import pytest
from support.tools import GET_CURRENT_TIME

from core.decode import chat_format
from core.decode.forced import REQUIRED, forced_prefix, tool_choice_names
from core.decode.spec import Decoder, Prompt
from core.model.drafter import load_drafter
from core.model.target import load_target
from core.settings import GenerationSettings

PACK = Path("tests/data/pack/models")
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TOOLS = [GET_CURRENT_TIME, WEATHER]


@pytest.fixture(scope="module")
def tokenizer():
    from mlx_lm.tokenizer_utils import load

    return load(PACK / "tokenizer")


@pytest.fixture(scope="module")
def pair():
    return load_target(PACK / "e-style-target"), load_drafter(PACK / "e-style-assistant")


def _encode(tokenizer, text: str) -> list[int]:
    return tokenizer._tokenizer.encode(text, add_special_tokens=False)


def _prompt(tokenizer) -> list[int]:
    messages = [{"role": "user", "content": "What time is it in Paris, and is it raining?"}]
    text = chat_format.render(
        chat_format.normalize_messages(messages), chat_format.normalize_tools(TOOLS), bos=tokenizer.bos_token
    ).text
    return _encode(tokenizer, text)


def _run(tg, dr, ids, n, block, forced=None):
    settings = GenerationSettings(max_tokens=n, ignore_eos=True, block_size=block, drafter_enabled=dr is not None)
    prompt = Prompt(list(ids), forced=forced)
    return Decoder(tg, dr, None, frozenset()).run(tg.make_cache(), prompt, settings, lambda e: None)


def _trie(tokenizer, choice):
    call_start = tokenizer._tokenizer.convert_tokens_to_ids("<|tool_call>")
    names = tool_choice_names(chat_format.normalize_tools(TOOLS), choice)
    return forced_prefix(call_start, names, lambda t: _encode(tokenizer, t))


def test_the_opening_tokenizes_as_in_the_whole_text(tokenizer):
    """`<|tool_call>` + encode("call:NAME{") is how the tokenizer splits that text inside a reply."""
    whole = _encode(tokenizer, 'Sure.<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>')
    trie = _trie(tokenizer, "get_weather")
    path, node = [], trie
    while node.children:
        [(tok, node)] = node.children.items()
        path.append(tok)
    start = whole.index(path[0])
    assert whole[start : start + len(path)] == path


@pytest.mark.parametrize("choice", ["get_weather", "get_current_time"])
def test_a_named_function_is_called_and_drafting_stays_exact(tokenizer, pair, choice):
    tg, dr = pair
    prompt = _prompt(tokenizer)
    trie = _trie(tokenizer, choice)
    n = trie.depth + 10
    plain = _run(tg, None, prompt, n, 1, trie)
    forced = _encode(tokenizer, f"call:{choice}{{")
    head = plain.token_ids[: trie.depth]
    assert tokenizer._tokenizer.decode(head, skip_special_tokens=False) == f"<|tool_call>call:{choice}{{"
    assert head[1:] == forced
    # after the forced start: greedy decoding of the prompt followed by it
    rest = _run(tg, None, prompt + head, n - len(head), 1)
    assert plain.token_ids[len(head) :] == rest.token_ids
    for block in (3, "auto"):
        assert _run(tg, dr, prompt, n, block, trie).token_ids == plain.token_ids, block


def test_required_lets_the_target_choose_among_the_names(tokenizer, pair):
    tg, dr = pair
    prompt = _prompt(tokenizer)
    trie = _trie(tokenizer, REQUIRED)
    # the tokens both names share, then the first where they differ
    shared, node = [], trie
    while len(node.children) == 1:
        [(tok, node)] = node.children.items()
        shared.append(tok)
    branch = sorted(node.children)
    assert len(branch) == 2 and shared[0] == tokenizer._tokenizer.convert_tokens_to_ids("<|tool_call>")
    logits, _ = tg.forward(prompt + shared, tg.make_cache(), logits="last")
    want = branch[int(mx.argmax(logits[0][mx.array(branch)]).item())]
    plain = _run(tg, None, prompt, trie.depth + 8, 1, trie)
    assert plain.token_ids[: len(shared) + 1] == shared + [want]
    text = tokenizer._tokenizer.decode(plain.token_ids, skip_special_tokens=False)
    assert text.startswith(("<|tool_call>call:get_weather{", "<|tool_call>call:get_current_time{"))
    assert _run(tg, dr, prompt, trie.depth + 8, 3, trie).token_ids == plain.token_ids


def test_a_name_not_declared_is_refused():
    with pytest.raises(ValueError, match="not among the declared tools"):
        tool_choice_names(chat_format.normalize_tools(TOOLS), "get_stock_price")
    assert tool_choice_names(None, REQUIRED) == [] and tool_choice_names(TOOLS, None) == []


@pytest.mark.parametrize("parallel", [1, 2])
def test_the_engine_returns_the_forced_call(parallel):
    """Solo turns and batched rows: the reply is a call to the named tool (the pack's model, left to
    itself, never calls one), and with "required" a call to one of the declared tools."""
    from core.engine.contract import PairingSpec
    from core.engine.local import Engine

    eng = Engine(parallel=parallel)
    try:
        spec = PairingSpec("e-style", str(PACK / "e-style-target"), str(PACK / "e-style-assistant"))
        eng.load(spec, None).result(600)
        ask = [{"role": "user", "content": "What time is it in Paris?"}]
        for choice in ("get_current_time", REQUIRED, None):
            settings = GenerationSettings(max_tokens=40, tool_choice=choice)
            done = eng.chat(ask, settings, None, tools=TOOLS).result(600)
            assert done.error is None, done.error
            if choice is None:
                assert not done.tool_calls and not done.tool_errors
                continue
            names = [c.name for c in done.tool_calls] + [e.raw for e in done.tool_errors]
            assert names, done
            if done.tool_calls:
                assert done.tool_calls[0].name in (
                    {choice} if choice != REQUIRED else {"get_current_time", "get_weather"}
                )
            else:  # the untrained model may botch the arguments: the call's opening is still the forced one
                assert done.tool_errors[0].raw.startswith("<|tool_call>call:get_")
    finally:
        eng.close()
