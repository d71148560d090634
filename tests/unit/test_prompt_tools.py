"""core.decode.prompt with tools: which renderer a request gets, the variant, stop ids, message checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.decode.prompt import (
    check_messages,
    empty_thought_prompt,
    encode_chat,
    encode_messages,
    stop_ids,
    tool_markers,
    tool_stop_ids,
)

PACK = Path(__file__).parents[1] / "data" / "pack" / "models"
TIME = {"type": "function", "function": {"name": "get_current_time", "parameters": {"type": "object"}}}


@pytest.fixture(scope="module")
def tokenizer():
    from mlx_lm.tokenizer_utils import load

    return load(PACK / "tokenizer")


def _text(tokenizer, ids) -> str:
    return tokenizer._tokenizer.decode(ids)


def test_without_tools_the_checkpoints_template_renders(tokenizer):
    messages = [{"role": "user", "content": [{"type": "image", "path": "a.png"}, {"type": "text", "text": "hi"}]}]
    chat = encode_chat(tokenizer, messages)
    assert chat.ids == encode_messages(tokenizer, messages) and not chat.canonical
    assert chat.images == [messages[0]["content"][0]]


def test_tools_or_tool_messages_switch_to_the_canonical_format(tokenizer):
    ask = [{"role": "user", "content": "time?"}]
    with_tools = encode_chat(tokenizer, ask, tools=[TIME])
    assert with_tools.canonical
    assert "<|tool>declaration:get_current_time{" in _text(tokenizer, with_tools.ids)
    history = ask + [
        {"role": "assistant", "tool_calls": [{"id": "1", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "1", "content": "x"},
    ]
    chat = encode_chat(tokenizer, history, thinking=True)
    assert chat.canonical and chat.ends_in_thought
    assert _text(tokenizer, chat.ids).endswith('response:f{value:<|"|>x<|"|>}<tool_response|><|channel>thought\n')
    assert chat.ids[0] == tokenizer.bos_token_id and chat.ids[1] != tokenizer.bos_token_id  # one <bos>


def test_the_empty_thought_variant_is_read_from_the_template(tokenizer):
    from support.factory import chat_template

    assert not empty_thought_prompt(tokenizer)  # the pack's template: E2B-like
    assert empty_thought_prompt(tokenizer, chat_template(thought_channel=True))
    assert not empty_thought_prompt(tokenizer, chat_template(thought_channel=False))


def test_tool_response_stops_by_its_text_not_its_id(tokenizer, tmp_path):
    want = tokenizer._tokenizer.convert_tokens_to_ids("<|tool_response>")
    assert tool_stop_ids(tokenizer) == {want} and want != 50
    # a checkpoint whose configs list only <eos>/<turn|> still stops on it
    (tmp_path / "config.json").write_text('{"eos_token_id": [1, 22]}')
    assert stop_ids(tmp_path, tokenizer) >= {1, 22, want}
    m = tool_markers(tokenizer)
    assert m is not None and want in m.response
    assert m.call_start == tokenizer._tokenizer.convert_tokens_to_ids("<|tool_call>")


@pytest.mark.parametrize(
    "messages,why",
    [
        ([{"role": "user", "tool_calls": []}], "message 1: only an assistant message has tool_calls"),
        ([{"role": "assistant", "content": None}], "message 1: has no content"),
        ([{"role": "assistant", "tool_calls": "f()"}], "message 1: tool_calls must be a list"),
        ([{"role": "assistant", "tool_calls": [{"id": 3, "function": {"name": "f"}}]}], "tool call 1: id must be"),
        ([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]}], "JSON object"),
        ([{"role": "assistant", "tool_calls": [{"function": {}}]}], "message 1, tool call 1: needs function.name"),
        ([{"role": "tool"}], "message 1: has no content"),
        ([{"role": "tool", "content": "x", "tool_call_id": 7}], "message 1: tool_call_id must be a string"),
        ([{"role": "tool", "content": [{"type": "video"}]}], "item 1: type must be text, image or audio"),
        ([{"role": "assistant", "tool_responses": [{"name": "f"}]}], "tool_responses must be a list of objects"),
        ([{"role": "assistant", "content": "x", "reasoning_content": 1}], "reasoning_content must be a string"),
    ],
)
def test_bad_tool_messages_are_named(messages, why):
    with pytest.raises(ValueError, match=why):
        check_messages(messages)


def test_good_tool_messages_pass():
    check_messages(
        [
            {"role": "system", "content": "s"},
            {"role": "user", "content": "time?"},
            {
                "role": "assistant",
                "content": None,
                "reasoning_content": "need the time",
                "tool_calls": [{"id": "c", "type": "function", "function": {"name": "t", "arguments": '{"a": 1}'}}],
            },
            {
                "role": "tool",
                "tool_call_id": "c",
                "content": [{"type": "text", "text": "t"}, {"type": "image", "path": "p"}],
            },
            {"role": "assistant", "tool_calls": [{"function": {"name": "t", "arguments": {}}}], "tool_responses": []},
            {"role": "assistant", "tool_responses": [{"name": "t", "response": {"ok": True}}], "content": "done"},
        ]
    )
