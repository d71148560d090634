"""OpenAI tool calling through `gemma-chat serve` (issue 26 §2), with the official `openai` client.

The wire format is driven by the scripted FakeEngine (its replies write calls as the model does), on the
real server in-process: what a client sends (`tools`, `tool_choice`, `parallel_tool_calls`, assistant
`tool_calls` and `role: "tool"` messages) and what it gets back (`tool_calls`, streamed deltas,
`finish_reason: "tool_calls"`). tests/e2e/test_serve_process.py drives `serve --demo` as a process.
"""

from __future__ import annotations

import contextlib
import json

import pytest
from support.fake_engine import FakeEngine
from support.fake_engine import PairingSpec as FakeSpec
from support.tools import GET_CURRENT_TIME

from core.frontends.server import BackgroundServer, ServerConfig, create_app
from core.settings import GenerationSettings

openai = pytest.importorskip("openai")

CALL_PARIS = '<|tool_call>call:get_current_time{timezone:<|"|>Europe/Paris<|"|>}<tool_call|>'
CALL_TOKYO = '<|tool_call>call:get_current_time{timezone:<|"|>Asia/Tokyo<|"|>}<tool_call|>'
ASK = [{"role": "user", "content": "What time is it in Paris?"}]


@contextlib.contextmanager
def served(replies: list[str], **kwargs):
    engine = FakeEngine(replies=replies, **kwargs)
    engine.load(FakeSpec("fake", "t", "d"), lambda e: None).result(timeout=5)
    app = create_app(engine, ServerConfig(model_id="fake"))
    try:
        with BackgroundServer(app) as url:
            yield engine, openai.OpenAI(base_url=url + "/v1", api_key="unused", timeout=60, max_retries=0)
    finally:
        engine.close()


def streamed(client, **kwargs) -> tuple[str, dict[int, dict], list[str | None]]:
    """A streamed completion: (content, tool calls by index rebuilt from the deltas, finish reasons)."""
    content, calls, finishes = "", {}, []
    for chunk in client.chat.completions.create(model="fake", stream=True, **kwargs):
        choice = chunk.choices[0]
        finishes.append(choice.finish_reason)
        content += choice.delta.content or ""
        for d in choice.delta.tool_calls or ():
            call = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
            call["id"] = d.id or call["id"]
            if d.function is not None:
                call["name"] += d.function.name or ""
                call["arguments"] += d.function.arguments or ""
    return content, calls, finishes


def test_a_call_comes_back_as_tool_calls_with_finish_reason_tool_calls():
    with served(["Let me check." + CALL_PARIS + "<|tool_response>"]) as (engine, client):
        reply = client.chat.completions.create(model="fake", messages=ASK, tools=[GET_CURRENT_TIME])
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me check."
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_current_time"
    assert json.loads(call.function.arguments) == {"timezone": "Europe/Paris"}
    [tools] = engine.tools  # the engine was given the tools, as the renderer takes them
    assert [t["function"]["name"] for t in tools] == ["get_current_time"]


def test_streamed_call_deltas_rebuild_the_call():
    with served([CALL_PARIS + CALL_TOKYO]) as (_, client):
        content, calls, finishes = streamed(client, messages=ASK, tools=[GET_CURRENT_TIME])
    assert content == ""
    assert sorted(calls) == [0, 1]
    assert [json.loads(calls[i]["arguments"])["timezone"] for i in (0, 1)] == ["Europe/Paris", "Asia/Tokyo"]
    assert all(c["name"] == "get_current_time" and c["id"].startswith("call_") for c in calls.values())
    assert calls[0]["id"] != calls[1]["id"]
    assert finishes[-1] == "tool_calls" and all(f is None for f in finishes[:-1])


def test_a_connected_engine_gets_each_call_tokens_text_and_origin():
    """gemma-chat's own extension carries a call's tokens with their call text and origin, so a chat over
    `--connect` shows the call as the model writes it, in its colours, as a local one does."""
    from core.engine.remote import RemoteEngine
    from core.events import TokenEvent

    with served(["Checking." + CALL_PARIS]) as (_, client):
        url = str(client.base_url).removesuffix("/v1/")
        remote = RemoteEngine(url)
        remote.load(None, None).result(timeout=30)
        events: list = []
        done = remote.chat(ASK, GenerationSettings(), events.append, tools=[GET_CURRENT_TIME]).result(60)
        remote.close()
    assert done.error is None and done.stats.stop_reason == "tool_calls"
    got = [(e.call_text, e.from_draft) for e in events if isinstance(e, TokenEvent) and e.call_text]
    assert "".join(c for c, _ in got) == 'call:get_current_time{timezone:"Europe/Paris"}'
    assert {d for _, d in got} == {True, False}  # the fake drafted some of the call's tokens: origins kept
    assert [e.text for e in events if isinstance(e, TokenEvent) and e.call_text] == [""] * len(got)


@pytest.mark.parametrize("stream", [False, True])
def test_parallel_tool_calls_false_keeps_the_first_call_only(stream):
    with served([CALL_PARIS + CALL_TOKYO], step=False) as (_, client):
        kwargs = {"messages": ASK, "tools": [GET_CURRENT_TIME], "parallel_tool_calls": False}
        if stream:
            _, calls, finishes = streamed(client, **kwargs)
            names = [json.loads(c["arguments"])["timezone"] for c in calls.values()]
            finish = finishes[-1]
        else:
            choice = client.chat.completions.create(model="fake", **kwargs).choices[0]
            names = [json.loads(c.function.arguments)["timezone"] for c in choice.message.tool_calls]
            finish = choice.finish_reason
    assert names == ["Europe/Paris"] and finish == "tool_calls"


def test_the_conversation_continues_after_the_tool_message():
    history = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_current_time", "arguments": '{"timezone": "Europe/Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"datetime": "2026-12-01T14:05:00+01:00"}'},
    ]
    with served(["It is 14:05 in Paris."]) as (engine, client):
        reply = client.chat.completions.create(model="fake", messages=history, tools=[GET_CURRENT_TIME])
        content, calls, finishes = streamed(client, messages=history, tools=[GET_CURRENT_TIME])
    assert reply.choices[0].message.content == "It is 14:05 in Paris." and reply.choices[0].finish_reason == "stop"
    assert (content, calls, finishes[-1]) == ("It is 14:05 in Paris.", {}, "stop")
    messages, _ = engine.chats[0]
    assert messages[1]["tool_calls"][0]["function"]["name"] == "get_current_time"
    assert messages[2] == {"role": "tool", "tool_call_id": "call_1", "content": history[2]["content"]}


def test_tool_message_text_parts_are_one_result():
    history = [
        *ASK,
        {
            "role": "assistant",
            "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
        },
        {
            "role": "tool",
            "tool_call_id": "c",
            "content": [{"type": "text", "text": '{"a":'}, {"type": "text", "text": "1}"}],
        },
    ]
    with served(["ok"]) as (engine, client):
        client.chat.completions.create(model="fake", messages=history)
    assert engine.chats[0][0][2]["content"] == '{"a":1}'


def test_tool_choice_none_declares_no_tools():
    with served(["Noon." + CALL_PARIS]) as (engine, client):
        reply = client.chat.completions.create(model="fake", messages=ASK, tools=[GET_CURRENT_TIME], tool_choice="none")
    assert engine.tools == [None]
    assert reply.choices[0].message.tool_calls is None and reply.choices[0].finish_reason == "stop"


@pytest.mark.parametrize(
    ("choice", "forced"),
    [("required", "*"), ({"type": "function", "function": {"name": "get_current_time"}}, "get_current_time")],
)
def test_required_and_a_named_function_reach_the_engine_as_its_tool_choice(choice, forced):
    """The engine forces the call's opening (tests/engine/test_tool_choice.py; serve --demo as a process in
    test_serve_process.py): the server passes the choice on in the turn's settings, tools declared."""
    with served([CALL_PARIS]) as (engine, client):
        reply = client.chat.completions.create(model="fake", messages=ASK, tools=[GET_CURRENT_TIME], tool_choice=choice)
    [(_, settings)] = engine.chats
    assert settings.tool_choice == forced and engine.tools[0] is not None
    assert reply.choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize(
    ("choice", "says"),
    [
        ({"type": "function", "function": {"name": "nope"}}, "not in 'tools'"),
        ({"type": "function"}, "not in 'tools'"),
        ("sometimes", "must be 'auto', 'none'"),
    ],
)
def test_bad_tool_choices_are_refused(choice, says):
    with served(["x"]) as (engine, client):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="fake", messages=ASK, tools=[GET_CURRENT_TIME], tool_choice=choice)
        assert engine.chats == []  # refused before it reached the engine
    assert e.value.status_code == 400 and says in e.value.body["message"]


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "'tools': tool 1"),
        ({"tools": "get_current_time"}, "tools must be a list"),
        ({"parallel_tool_calls": "no"}, "'parallel_tool_calls' must be true or false"),
        ({"messages": [*ASK, {"role": "tool", "content": 3}]}, "content must be a string"),
        ({"messages": [*ASK, {"role": "tool", "content": "x"}]}, "must follow an assistant message with tool_calls"),
        (
            {
                "messages": [
                    *ASK,
                    {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f"}}]},
                ]
            },
            None,  # no arguments: an empty call, accepted
        ),
        (
            {"messages": [*ASK, {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{1"}}]}]},
            "message 2, tool call 1",
        ),
    ],
)
def test_bad_tool_fields_are_400s_that_name_them(extra, says):
    body = {"model": "fake", "messages": ASK, "tools": [GET_CURRENT_TIME], **extra}
    with served(["fine"]) as (_, client):
        if says is None:
            assert client.chat.completions.create(**body).choices[0].message.content == "fine"
            return
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(**body)
    assert says in e.value.body["message"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_malformed_call_is_content_with_the_reason(stream):
    bad = "<|tool_call>call:get_current_time{timezone:[<tool_call|>"
    with served(["Hm." + bad]) as (_, client):
        if stream:
            content, calls, finishes = streamed(client, messages=ASK, tools=[GET_CURRENT_TIME])
            finish = finishes[-1]
        else:
            reply = client.chat.completions.create(model="fake", messages=ASK, tools=[GET_CURRENT_TIME])
            choice = reply.choices[0]
            content, calls, finish = choice.message.content, choice.message.tool_calls or {}, choice.finish_reason
            [error] = reply.model_extra["gemma_chat"]["tool_errors"]
            assert "malformed tool call" in error["message"] and error["raw"] == bad
    assert content == "Hm." + bad and calls == {} and finish == "stop"


def test_a_model_without_tool_tokens_refuses_tools():
    with served(["x"], tools_enabled=False) as (_, client):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="fake", messages=ASK, tools=[GET_CURRENT_TIME])
    assert "cannot call tools" in e.value.body["message"]


def test_connect_passes_tools_and_turns_streamed_calls_into_tool_call_events():
    from core.engine.remote import RemoteEngine
    from core.events import ToolCall as ToolCallEvent
    from core.events import ToolCallStarted, TurnDone
    from core.settings import GenerationSettings

    engine = FakeEngine(replies=["On it." + CALL_PARIS, "It is noon."])
    engine.load(FakeSpec("fake", "t", "d"), lambda e: None).result(timeout=5)
    app = create_app(engine, ServerConfig(model_id="fake"))
    try:
        with BackgroundServer(app) as url:
            remote = RemoteEngine(url)
            try:
                remote.load(None, None).result(timeout=30)
                assert remote.features.tools
                events: list = []
                done = remote.chat(ASK, GenerationSettings(), events.append, tools=[GET_CURRENT_TIME]).result(60)
                assert isinstance(done, TurnDone) and done.stats.stop_reason == "tool_calls"
                [call] = done.tool_calls
                assert (call.name, call.arguments) == ("get_current_time", {"timezone": "Europe/Paris"})
                kinds = [type(e) for e in events]
                assert kinds.index(ToolCallStarted) < kinds.index(ToolCallEvent) < kinds.index(TurnDone)
                assert done.text == "On it."
                history = [
                    *ASK,
                    {"role": "assistant", "content": None, "tool_calls": [call.openai()]},
                    {"role": "tool", "tool_call_id": call.id, "content": '{"time": "12:00"}'},
                ]
                after = remote.chat(history, GenerationSettings(), lambda e: None, tools=[GET_CURRENT_TIME]).result(60)
                assert after.text == "It is noon." and after.tool_calls == ()
            finally:
                remote.close()
    finally:
        engine.close()
    sent = engine.chats[1][0]  # the server got the call and its result back, as the client sent them
    assert sent[1]["tool_calls"][0]["id"] == call.id and sent[2]["tool_call_id"] == call.id
