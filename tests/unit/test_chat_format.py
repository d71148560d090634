"""core.decode.chat_format against Google's canonical Gemma 4 chat template (2026-07-09), token for token.

Each case of CASES is rendered twice: by `chat_format.render` (after `normalize_messages` /
`normalize_tools`, as the engine does) and by the canonical Jinja template through transformers'
`apply_chat_template` (the Jinja renderer every peer uses), for the E2B file and the 31B file, with
thinking off and on. Both texts are tokenised with the reference pack's tokenizer (Gemma 4's special
tokens at other ids) and must give the same ids and the same text.

The template cannot take OpenAI's JSON-string arguments, so its input has them decoded (that is
the documented contract: "Deserialize arguments before passing to the template"). Where the
renderer deliberately differs (a JSON tool result is rendered as that value, as vLLM and llama.cpp
do), the case gives the template the equivalent native input (`tool_responses` on the assistant
message) in `template_messages`.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from support.tools import GET_CURRENT_TIME as TIME

from core.decode import chat_format
from core.decode.chat_format import ToolFormatError, normalize_messages, normalize_schema, normalize_tools, render

DATA = Path(__file__).parents[1] / "data"
TEMPLATES = {
    "e2b": (DATA / "templates" / "gemma4_e2b_canonical_2026-07-09.jinja").read_text(encoding="utf-8"),
    "31b": (DATA / "templates" / "gemma4_31b_canonical_2026-07-09.jinja").read_text(encoding="utf-8"),
}


@pytest.fixture(scope="module")
def hf_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(DATA / "pack" / "models" / "tokenizer")


# --- tools ----------------------------------------------------------------------------------------

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get weather",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": "City"},
                "days": {"type": "integer"},
                "unit": {"type": "string", "enum": ["c", "f"]},
                "tags": {"type": "array", "items": {"type": "string"}},
                "opts": {"type": "object", "properties": {"detail": {"type": "boolean"}}},
            },
            "required": ["location"],
        },
    },
}
NESTED = {
    "type": "function",
    "function": {
        "name": "search.records",
        "description": 'Search records; "quotes", {braces} and\na newline',
        "parameters": {
            "type": "object",
            "properties": {
                "filters": {
                    "type": "object",
                    "description": "Filters",
                    "properties": {
                        "range": {
                            "type": "object",
                            "properties": {"lo": {"type": "number"}, "hi": {"type": "number", "nullable": True}},
                            "required": ["lo"],
                        },
                        "kind": {"type": "string", "enum": ["a", "b"], "description": "Kind"},
                    },
                    "required": ["range"],
                },
                "rows": {
                    "type": "array",
                    "description": "Rows",
                    "items": {
                        "type": "object",
                        "properties": {"id": {"type": "integer"}, "label": {"type": "string"}},
                        "required": ["id"],
                    },
                },
                "matrix": {"type": "array", "items": {"type": "array", "items": {"type": "number"}}},
                "choices": {"type": "array", "items": {"type": "string", "enum": ["x", "y"]}},
                "meta": {"type": "object", "additionalProperties": True},
                "type": {"type": "string", "description": "a parameter named type"},
                "Zeta": {"type": "boolean"},
                "alpha": {"type": "integer", "minimum": 0, "default": 3},
                "Beta": {"type": "string", "format": "date"},
            },
            "required": ["filters", "type"],
        },
    },
}
NO_DESCRIPTION = {"type": "function", "function": {"name": "ping"}}
EMPTY_PARAMS = {
    "type": "function",
    "function": {"name": "now", "description": "The time", "parameters": {"type": "object", "properties": {}}},
}
WITH_RESPONSE = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look up",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
        "response": {"description": "The hit", "type": "object"},
    },
}


def _call(name: str, args: dict | str | None, call_id: str | None = None) -> dict:
    call: dict = {"type": "function", "function": {"name": name, "arguments": args}}
    if call_id is not None:
        call["id"] = call_id
    return call


def _args(d: dict) -> str:
    return json.dumps(d)


TRICKY_ARGS = {
    "text": 'He said "hi" {not json} [x], a:b\nnew line\ttab',
    "n": 42,
    "neg": -3,
    "x": 2.5,
    "tiny": 1e-05,
    "big": 12345678901234567890,
    "ok": True,
    "no": False,
    "none": None,
    "nested": {"b": [1, {"c": "d"}], "A": {"deep": [[], {}]}},
    "unicode": "café ☕ 日本",
    "empty": "",
}

# (id, messages, tools, extra) ; extra: add_generation_prompt, template_messages
CASES: list[tuple[str, list[dict], list[dict] | None, dict]] = [
    (
        "declarations+system",
        [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "Weather in Paris?"}],
        [WEATHER],
        {},
    ),
    ("declarations, no system", [{"role": "user", "content": "What time is it in Tokyo?"}], [TIME], {}),
    (
        "nested/enum/array/object params, odd keys",
        [{"role": "user", "content": "find"}],
        [NESTED, NO_DESCRIPTION, EMPTY_PARAMS, WITH_RESPONSE],
        {},
    ),
    (
        "system only, no tools",
        [{"role": "system", "content": "  Be brief.  "}, {"role": "user", "content": "hi"}],
        None,
        {},
    ),
    (
        "one call, OpenAI tool message (text result)",
        [
            {"role": "user", "content": "What time is it in Paris?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [_call("get_current_time", _args({"timezone": "Europe/Paris"}), "call_1")],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "14:05 CEST"},
        ],
        [TIME],
        {},
    ),
    (
        "two calls, results resolved by tool_call_id (out of order)",
        [
            {"role": "user", "content": "Weather in Paris and Rome?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    _call("get_weather", _args({"location": "Paris"}), "a"),
                    _call("get_time", _args({"location": "Rome"}), "b"),
                ],
            },
            {"role": "tool", "tool_call_id": "b", "content": "noon"},
            {"role": "tool", "tool_call_id": "a", "content": "rainy"},
        ],
        [WEATHER],
        {},
    ),
    (
        "call with nested/number/bool/null/quoted/newline/brace arguments",
        [
            {"role": "user", "content": "go"},
            {"role": "assistant", "tool_calls": [_call("search.records", _args(TRICKY_ARGS), "t1")]},
            {"role": "tool", "tool_call_id": "t1", "content": "done"},
        ],
        [NESTED],
        {},
    ),
    (
        "arguments already a mapping; null arguments",
        [
            {"role": "user", "content": "go"},
            {
                "role": "assistant",
                "tool_calls": [_call("get_weather", {"location": "Oslo", "days": 3}, "m1"), _call("ping", None, "m2")],
            },
            {"role": "tool", "tool_call_id": "m1", "content": "cold"},
            {"role": "tool", "tool_call_id": "m2", "content": "pong"},
        ],
        [WEATHER, NO_DESCRIPTION],
        {},
    ),
    (
        "full loop, final answer, then a user turn",
        [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "tool_calls": [_call("get_weather", _args({"location": "Paris"}), "w")]},
            {"role": "tool", "tool_call_id": "w", "content": "sunny"},
            {"role": "assistant", "content": "It is sunny."},
            {"role": "user", "content": "Thanks"},
        ],
        [WEATHER],
        {},
    ),
    (
        "tool result followed directly by a user turn",
        [
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "tool_calls": [_call("get_weather", _args({"location": "Paris"}), "w")]},
            {"role": "tool", "tool_call_id": "w", "content": "sunny"},
            {"role": "user", "content": "And tomorrow?"},
        ],
        [WEATHER],
        {},
    ),
    (
        "reasoning replayed after the last user, dropped before it",
        [
            {"role": "user", "content": "first"},
            {"role": "assistant", "content": "<|channel>thought\nold<channel|>Answer one.", "reasoning_content": "old"},
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "reasoning_content": "Need weather.",
                "tool_calls": [_call("get_weather", _args({"location": "Paris"}), "w")],
            },
            {"role": "tool", "tool_call_id": "w", "content": "sunny"},
        ],
        [WEATHER],
        {},
    ),
    (
        "JSON tool result, rendered as its object (template given the native form)",
        [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "tool_calls": [_call("get_weather", _args({"location": "Paris"}), "w")]},
            {"role": "tool", "tool_call_id": "w", "content": '{"temp": 15, "sky": "sunny", "wind": null}'},
        ],
        [WEATHER],
        {
            "template_messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {
                    "role": "assistant",
                    "tool_calls": [_call("get_weather", {"location": "Paris"}, "w")],
                    "tool_responses": [{"name": "get_weather", "response": {"temp": 15, "sky": "sunny", "wind": None}}],
                },
            ]
        },
    ),
    (
        "JSON array tool result",
        [
            {"role": "user", "content": "list"},
            {"role": "assistant", "tool_calls": [_call("ping", "{}", "p")]},
            {"role": "tool", "tool_call_id": "p", "content": '[1, "two", {"three": 3}]'},
        ],
        [NO_DESCRIPTION],
        {
            "template_messages": [
                {"role": "user", "content": "list"},
                {
                    "role": "assistant",
                    "tool_calls": [_call("ping", {}, "p")],
                    "tool_responses": [{"name": "ping", "response": [1, "two", {"three": 3}]}],
                },
            ]
        },
    ),
    (
        "native tool_responses",
        [
            {"role": "user", "content": "Weather?"},
            {
                "role": "assistant",
                "tool_calls": [_call("get_weather", {"location": "Paris"})],
                "tool_responses": [{"name": "get_weather", "response": {"temperature": 15, "weather": "sunny"}}],
                "content": "Sunny, 15 degrees.",
            },
            {"role": "user", "content": "ok"},
        ],
        [WEATHER],
        {},
    ),
    (
        "image in a tool result (content parts)",
        [
            {"role": "user", "content": "Show the chart"},
            {"role": "assistant", "tool_calls": [_call("get_weather", _args({"location": "Paris"}), "img")]},
            {
                "role": "tool",
                "tool_call_id": "img",
                "content": [
                    {"type": "text", "text": "chart for "},
                    {"type": "image", "path": "chart.png"},
                    {"type": "text", "text": "Paris"},
                ],
            },
        ],
        [WEATHER],
        {},
    ),
    (
        "content before the calls; tool message resolved by name",
        [
            {"role": "user", "content": "time?"},
            {
                "role": "assistant",
                "content": "Let me check.",
                "tool_calls": [_call("get_current_time", _args({"timezone": "UTC"}))],
            },
            {"role": "tool", "name": "get_current_time", "content": "12:00"},
        ],
        [TIME],
        {},
    ),
    (
        "trailing call with no result",
        [
            {"role": "user", "content": "time?"},
            {"role": "assistant", "tool_calls": [_call("get_current_time", _args({"timezone": "UTC"}), "c")]},
        ],
        [TIME],
        {},
    ),
    (
        "images and text in user content, developer system, list system content",
        [
            {
                "role": "developer",
                "content": [{"type": "text", "text": " Rule one. "}, {"type": "text", "text": "Two"}],
            },
            {
                "role": "user",
                "content": [
                    {"type": "image", "path": "a.png"},
                    {"type": "text", "text": "  What is this?  "},
                    {"type": "image", "path": "b.png"},
                ],
            },
        ],
        [TIME],
        {},
    ),
    (
        "consecutive assistant messages continue one model turn",
        [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "Part one."},
            {"role": "assistant", "content": "Part two."},
        ],
        [TIME],
        {"add_generation_prompt": False},
    ),
    (
        "no generation prompt after a tool result",
        [
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "tool_calls": [_call("get_weather", _args({"location": "Paris"}), "w")]},
            {"role": "tool", "tool_call_id": "w", "content": "sunny"},
            {"role": "assistant", "content": "Sunny."},
        ],
        [WEATHER],
        {"add_generation_prompt": False},
    ),
]


def _template_input(messages: list[dict]) -> list[dict]:
    """What the canonical template accepts: OpenAI's JSON-string arguments decoded, nothing else changed."""
    out = copy.deepcopy(messages)
    for m in out:
        for call in m.get("tool_calls") or ():
            if isinstance(call["function"].get("arguments"), str):
                call["function"]["arguments"] = json.loads(call["function"]["arguments"])
    return out


def _jinja(hf_tokenizer, variant: str, messages, tools, thinking: bool, add_generation_prompt: bool) -> str:
    return hf_tokenizer.apply_chat_template(
        messages,
        tools=tools,
        chat_template=TEMPLATES[variant],
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
        enable_thinking=thinking,
    )


@pytest.mark.parametrize("variant", ["e2b", "31b"])
@pytest.mark.parametrize("thinking", [False, True], ids=["think-off", "think-on"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_render_equals_canonical_template_token_for_token(hf_tokenizer, case, thinking, variant):
    _, messages, tools, extra = case
    gen = extra.get("add_generation_prompt", True)
    want_messages = extra.get("template_messages") or _template_input(messages)
    want = _jinja(hf_tokenizer, variant, want_messages, normalize_tools(tools) if tools else None, thinking, gen)
    got = render(
        normalize_messages(messages),
        normalize_tools(tools),
        bos=hf_tokenizer.bos_token,
        empty_thought=variant == "31b",
        thinking=thinking,
        add_generation_prompt=gen,
    )
    got_ids = hf_tokenizer.encode(got.text, add_special_tokens=False)
    want_ids = hf_tokenizer.encode(want, add_special_tokens=False)
    assert got_ids == want_ids
    assert got.text == want
    assert got.ends_in_thought == want.endswith("<|channel>thought\n")
    # one image item per placeholder, in prompt order
    assert len(got.images) == got.text.count("<|image|>")


def test_tools_render_as_the_published_example():
    """The rendering documented in reference/tools-and-audio.md A1.3 (executed with transformers there)."""
    got = render(
        [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "Weather in Paris?"}],
        normalize_tools([WEATHER]),
    )
    assert got.text == (
        '<bos><|turn>system\nYou are helpful.<|tool>declaration:get_weather{description:<|"|>Get weather<|"|>,'
        'parameters:{properties:{days:{type:<|"|>INTEGER<|"|>},location:{description:<|"|>City<|"|>,'
        'type:<|"|>STRING<|"|>},opts:{properties:{detail:{type:<|"|>BOOLEAN<|"|>}},type:<|"|>OBJECT<|"|>},'
        'tags:{items:{type:<|"|>STRING<|"|>},type:<|"|>ARRAY<|"|>},unit:{enum:[<|"|>c<|"|>,<|"|>f<|"|>],'
        'type:<|"|>STRING<|"|>}},required:[<|"|>location<|"|>],type:<|"|>OBJECT<|"|>}}<tool|><turn|>\n'
        "<|turn>user\nWeather in Paris?<turn|>\n<|turn>model\n"
    )


def test_history_arguments_render_as_the_published_example():
    args = {"e": 1e-05, "items": [{"id": 1}, {"id": 2}], "n": 1.5, "s": "a,b}c:<d>"}
    got = render(
        normalize_messages(
            [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [_call("arr", _args(args))]}]
        )
    )
    assert got.text.endswith(
        '<|turn>model\n<|tool_call>call:arr{e:1e-05,items:[{id:1},{id:2}],n:1.5,s:<|"|>a,b}c:<d><|"|>}'
        "<tool_call|><|tool_response>"
    )


def test_images_come_in_placeholder_order():
    """A tool result's image is rendered before the assistant content's own image, not in message order."""
    messages = normalize_messages(
        [
            {"role": "user", "content": [{"type": "image", "path": "u.png"}, {"type": "text", "text": "go"}]},
            {
                "role": "assistant",
                "content": [{"type": "text", "text": "here"}, {"type": "image", "path": "own.png"}],
                "tool_calls": [_call("ping", "{}", "p")],
            },
            {"role": "tool", "tool_call_id": "p", "content": [{"type": "image", "path": "tool.png"}]},
        ]
    )
    got = render(messages, normalize_tools([NO_DESCRIPTION]))
    assert [im["path"] for im in got.images] == ["u.png", "tool.png", "own.png"]
    # audio the same way, in its own list (the engine expands each kind in prompt order)
    with_audio = normalize_messages(
        [
            {"role": "user", "content": [{"type": "audio", "path": "q.wav"}, {"type": "image", "path": "u.png"}]},
            {"role": "assistant", "tool_calls": [_call("ping", "{}", "p")]},
            {"role": "tool", "tool_call_id": "p", "content": [{"type": "input_audio", "path": "r.wav"}]},
        ]
    )
    got = render(with_audio, normalize_tools([NO_DESCRIPTION]))
    assert [a["path"] for a in got.audio] == ["q.wav", "r.wav"] and [im["path"] for im in got.images] == ["u.png"]
    assert got.text.count("<|audio|>") == 2


def test_thinking_after_a_tool_result_opens_the_thought_channel():
    messages = normalize_messages(
        [
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "tool_calls": [_call("get_weather", _args({"location": "Paris"}), "w")]},
            {"role": "tool", "tool_call_id": "w", "content": "sunny"},
        ]
    )
    on = render(messages, normalize_tools([WEATHER]), thinking=True, empty_thought=True)
    off = render(messages, normalize_tools([WEATHER]), thinking=False, empty_thought=True)
    assert on.text.endswith("<tool_response|><|channel>thought\n") and on.ends_in_thought
    assert off.text.endswith("<tool_response|>") and not off.ends_in_thought
    # a plain user turn: the 31B variant's empty thought only when thinking is off
    plain = [{"role": "user", "content": "hi"}]
    assert render(plain, empty_thought=True).text.endswith("<|turn>model\n<|channel>thought\n<channel|>")
    assert render(plain, empty_thought=True, thinking=True).text.endswith("<|turn>model\n")
    assert render(plain).text.endswith("<|turn>model\n")


# --- normalization: where the renderer deliberately differs ------------------------------------------


def test_json_tool_results_are_decoded_text_is_not():
    out = normalize_messages(
        [
            {"role": "tool", "content": '{"a": 1}'},
            {"role": "tool", "content": " [1, 2] "},
            {"role": "tool", "content": "15"},  # a scalar stays text
            {"role": "tool", "content": "{not json"},
            {"role": "tool", "content": "sunny"},
        ]
    )
    assert out[0]["response"] == {"a": 1} and out[1]["response"] == [1, 2]
    assert all("response" not in m for m in out[2:])
    block = chat_format.tool_response_block
    assert block("f", out[0]["response"]) == "<|tool_response>response:f{a:1}<tool_response|>"
    assert block("f", "15") == '<|tool_response>response:f{value:<|"|>15<|"|>}<tool_response|>'


def test_openai_arguments_are_decoded_and_checked():
    calls = normalize_messages([{"role": "assistant", "tool_calls": [_call("f", '{"b": 2, "a": [1]}', "i")]}])
    assert calls[0]["tool_calls"] == [
        {"type": "function", "function": {"name": "f", "arguments": {"b": 2, "a": [1]}}, "id": "i"}
    ]
    assert (
        normalize_messages([{"role": "assistant", "tool_calls": [_call("f", "  ")]}])[0]["tool_calls"][0]["function"][
            "arguments"
        ]
        is None
    )
    with pytest.raises(ToolFormatError, match=r"message 1, tool call 1: arguments is not valid JSON"):
        normalize_messages([{"role": "assistant", "tool_calls": [_call("f", "{oops")]}])
    with pytest.raises(ToolFormatError, match=r"message 2, tool call 2: arguments must be a JSON object, got list"):
        normalize_messages(
            [
                {"role": "user", "content": "x"},
                {"role": "assistant", "tool_calls": [_call("f", "{}"), _call("g", "[1]")]},
            ]
        )
    with pytest.raises(ToolFormatError, match="needs function.name"):
        normalize_messages([{"role": "assistant", "tool_calls": [{"function": {"name": "bad name"}}]}])


def test_tools_are_checked_with_clear_messages():
    assert normalize_tools(None) == []
    bare = normalize_tools([{"name": "f", "parameters": {"type": "object"}}])
    assert bare == [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    for bad, why in [
        ({"tools": []}, "tools must be a list"),
        ([1], "tool 1: expected an object"),
        ([{"type": "retrieval"}], 'tool 1: type must be "function"'),
        ([{"function": {"name": "has space"}}], "tool 1: function.name must be a string of"),
        ([{"function": {"name": "f"}}, {"function": {"name": "f"}}], "tool 2: a second tool named 'f'"),
        ([{"function": {"name": "f", "parameters": "x"}}], r"tool 1 \(f\): parameters must be a JSON schema object"),
        ([{"function": {"name": "f", "description": 3}}], r"tool 1 \(f\): description must be a string"),
    ]:
        with pytest.raises(ToolFormatError, match=why):
            normalize_tools(bad)


def test_schema_nullable_forms_become_type_plus_nullable():
    assert normalize_schema({"type": ["string", "null"]}) == {"type": "string", "nullable": True}
    assert normalize_schema({"anyOf": [{"type": "integer"}, {"type": "null"}], "description": "n"}) == {
        "type": "integer",
        "description": "n",
        "nullable": True,
    }
    nested = normalize_schema({"type": "object", "properties": {"x": {"type": ["null", "number"]}}})
    assert nested["properties"]["x"] == {"type": "number", "nullable": True}
    # a real union is left alone (the template drops anyOf; nothing better to say in its format)
    union = {"anyOf": [{"type": "integer"}, {"type": "string"}]}
    assert normalize_schema(union) == union
    rendered = chat_format.format_declaration(
        normalize_tools(
            [{"name": "f", "parameters": {"type": "object", "properties": {"x": {"type": ["string", "null"]}}}}]
        )[0]
    )
    assert 'x:{nullable:true,type:<|"|>STRING<|"|>}' in rendered


def test_uses_tools():
    assert not chat_format.uses_tools([{"role": "user", "content": "x"}], None)
    assert chat_format.uses_tools([{"role": "user", "content": "x"}], [TIME])
    assert chat_format.uses_tools([{"role": "tool", "content": "x"}], [])
    assert chat_format.uses_tools([{"role": "assistant", "tool_calls": [_call("f", "{}")]}], None)
