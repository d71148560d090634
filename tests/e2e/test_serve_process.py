"""`gemma-chat serve --demo` started as a process, driven by the official `openai` client, and
`gemma-chat generate --connect` against it: the same greedy ids as `gemma-chat generate --demo`.

This is the test that was missing when serve crashed on main after a merge: everything here goes
through the installed command, its argument parsing and its start-up, as a user's client sees it."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from serve_process import GEMMA_CHAT, ServeProcess

openai = pytest.importorskip("openai")

PROMPT = "What is speculative decoding?"


def generate_ids(*args: str) -> tuple[list[int], str, dict]:
    """`gemma-chat generate ARGS --prompt PROMPT --json` as a process: (ids, text, stats)."""
    run = subprocess.run(
        [str(GEMMA_CHAT), "generate", *args, "--prompt", PROMPT, "--json"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert run.returncode == 0, run.stderr + run.stdout
    lines = [json.loads(line) for line in run.stdout.splitlines() if line.strip()]
    tokens = [line for line in lines if "id" in line]
    return [t["id"] for t in tokens], "".join(t["text"] for t in tokens), lines[-1]["stats"]


@pytest.fixture(scope="module")
def server():
    with ServeProcess(["--demo"]) as s:
        yield s


@pytest.fixture(scope="module")
def local():
    return generate_ids("--demo")


def client(server: ServeProcess):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=120, max_retries=0)


def test_openai_client_non_streamed_completion_matches_generate(server, local):
    ids, text, stats = local
    reply = client(server).chat.completions.create(
        model="demo", messages=[{"role": "user", "content": PROMPT}], temperature=0
    )
    choice = reply.choices[0]
    assert choice.message.content == text  # the end-of-turn token decodes to no text
    assert choice.finish_reason == "stop"
    assert reply.usage is not None and reply.usage.completion_tokens == len(ids)
    extension = reply.model_extra["gemma_chat"]
    assert [t["id"] for t in extension["tokens"]] == ids
    assert extension["stats"]["accepted"] > 0  # the drafter ran behind the API


def test_openai_client_streamed_completion_matches_generate(server, local):
    ids, text, _ = local
    stream = client(server).chat.completions.create(
        model="demo", messages=[{"role": "user", "content": PROMPT}], temperature=0, stream=True
    )
    chunks = list(stream)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    streamed = [t for c in chunks for t in (c.model_extra.get("gemma_chat") or {}).get("tokens", [])]
    assert [t["id"] for t in streamed] == ids
    assert content == "".join(t["text"] for t in streamed)
    assert any(t["from_draft"] for t in streamed) and any(not t["from_draft"] for t in streamed)
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_generate_connect_gives_the_same_greedy_ids_as_generate_demo(server, local):
    ids, text, _ = local
    remote_ids, remote_text, stats = generate_ids("--connect", server.url)
    assert remote_ids == ids
    assert remote_text == text
    assert stats["stop_reason"] == "eos" and stats["accepted"] > 0


def test_tools_are_accepted_and_the_conversation_continues_after_a_tool_message(server):
    """The demo may answer with text or a call (it is being taught the time tool): either is a valid reply
    to a request with tools; then a history holding a call and its result continues the conversation."""
    from support.tools import GET_CURRENT_TIME

    ask = [{"role": "user", "content": "What time is it in Paris?"}]
    reply = client(server).chat.completions.create(
        model="demo", messages=ask, tools=[GET_CURRENT_TIME], temperature=0, max_tokens=48
    )
    choice = reply.choices[0]
    assert choice.finish_reason in ("stop", "length", "tool_calls")
    assert (choice.finish_reason == "tool_calls") == bool(choice.message.tool_calls)
    for call in choice.message.tool_calls or ():
        assert call.function.name == "get_current_time" and isinstance(json.loads(call.function.arguments), dict)
    call = {"name": "get_current_time", "arguments": json.dumps({"timezone": "Europe/Paris"})}
    history = [
        *ask,
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": call}]},
        {"role": "tool", "tool_call_id": "call_1", "content": json.dumps({"datetime": "2026-12-01T14:05:00+01:00"})},
    ]
    after = client(server).chat.completions.create(
        model="demo", messages=history, tools=[GET_CURRENT_TIME], temperature=0, max_tokens=32
    )
    assert after.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert after.usage is not None and after.usage.prompt_tokens > reply.usage.prompt_tokens  # the result is in
    stream = client(server).chat.completions.create(
        model="demo", messages=history, tools=[GET_CURRENT_TIME], temperature=0, max_tokens=32, stream=True
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert chunks[-1].choices[0].finish_reason == after.choices[0].finish_reason
    assert text == (after.choices[0].message.content or "")  # greedy: the same reply streamed and not


TIME_TOOLS = json.loads((Path(__file__).parents[1] / "data" / "mcp_server_time" / "captured.json").read_text())


def _openai_tools() -> list[dict]:
    """mcp-server-time's two tools (as captured from its tools/list) in OpenAI's shape."""
    return [
        {
            "type": "function",
            "function": {"name": t["name"], "description": t["description"], "parameters": t["inputSchema"]},
        }
        for t in TIME_TOOLS["tools"]
    ]


@pytest.mark.parametrize("stream", [False, True])
def test_the_demo_served_calls_the_time_tool_for_the_city_asked_and_answers_with_the_result(server, stream):
    """Issue 26 §5 through `serve`: mcp-server-time's tools as OpenAI `tools`, "What time is it in Tokyo?" gets
    a `get_current_time` call for Asia/Tokyo; with the server's result as the tool message (its JSON text, as
    an MCP client forwards it) the answer is that result's time and zone."""
    ask = [{"role": "user", "content": "What time is it in Tokyo?"}]
    body = {"model": "demo", "messages": ask, "tools": _openai_tools(), "temperature": 0, "max_tokens": 48}
    if stream:
        chunks = list(client(server).chat.completions.create(**body, stream=True))
        assert chunks[-1].choices[0].finish_reason == "tool_calls"
        [delta] = [t for c in chunks for t in (c.choices[0].delta.tool_calls or ())]
        name, arguments = delta.function.name, delta.function.arguments
    else:
        reply = client(server).chat.completions.create(**body)
        assert reply.choices[0].finish_reason == "tool_calls"
        [call] = reply.choices[0].message.tool_calls
        name, arguments = call.function.name, call.function.arguments
    assert name == "get_current_time" and json.loads(arguments) == {"timezone": "Asia/Tokyo"}
    result = {"timezone": "Asia/Tokyo", "datetime": "2026-12-02T07:33:12+09:00", "day_of_week": "Wednesday"}
    history = [
        *ask,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": name, "arguments": arguments}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": json.dumps({**result, "is_dst": False}, indent=2)},
    ]
    after = client(server).chat.completions.create(**{**body, "messages": history})
    assert after.choices[0].finish_reason == "stop"
    assert after.choices[0].message.content.strip() == "It is 07:33 in Asia/Tokyo."


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_current_time"}}])
def test_tool_choice_forces_a_call_even_where_the_demo_would_answer_in_prose(server, stream, choice):
    """The demo answers "What is speculative decoding?" in prose (test above); told it must call a tool
    (required) or get_current_time (named), the reply is a call, whole, finish_reason "tool_calls"."""
    ask = [{"role": "user", "content": PROMPT}]
    body = {"model": "demo", "messages": ask, "tools": _openai_tools(), "tool_choice": choice, "max_tokens": 48}
    if not stream:
        reply = client(server).chat.completions.create(temperature=0, **body)
        finish, calls = reply.choices[0].finish_reason, reply.choices[0].message.tool_calls or []
        names = [c.function.name for c in calls]
        args = [json.loads(c.function.arguments) for c in calls]
    else:
        finish, names, parts = None, [], {}
        for chunk in client(server).chat.completions.create(temperature=0, stream=True, **body):
            finish = chunk.choices[0].finish_reason or finish
            for d in chunk.choices[0].delta.tool_calls or ():
                if d.function.name:
                    names.append(d.function.name)
                parts[d.index] = parts.get(d.index, "") + (d.function.arguments or "")
        args = [json.loads(parts[i]) for i in sorted(parts)]
    assert finish == "tool_calls", (names, args)
    if isinstance(choice, dict):
        assert names[0] == "get_current_time"
    assert set(names) <= {"get_current_time", "convert_time"} and all(isinstance(a, dict) for a in args)


def test_ctrl_c_stops_the_server_with_status_0():
    s = ServeProcess(["--demo", "--no-draft"]).start()
    rc, err = s.stop()
    assert rc == 0, err
    assert "Traceback" not in err


def test_a_bad_pairing_is_refused_before_listening():
    run = subprocess.run(
        [str(GEMMA_CHAT), "serve", "--pairing", "no-such-pairing"], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 2
    assert "unknown pairing 'no-such-pairing'" in run.stderr


def test_a_port_in_use_is_said_at_once_before_the_model_loads(server):
    """A second server on a port in use says so in words, before loading anything (a real model takes
    seconds to minutes to load); it was uvicorn's log line after the load, and status 3."""
    port = server.url.rsplit(":", 1)[1]
    run = subprocess.run(
        [str(GEMMA_CHAT), "serve", "--demo", "--port", port], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 1, run.stderr
    assert f"cannot listen on 127.0.0.1:{port}: the port is in use" in run.stderr
    assert "loading" not in run.stderr and "Traceback" not in run.stderr


def test_port_0_serves_on_a_free_port_and_says_which():
    """`--port 0` was refused ("--port must be 1..65535"); it takes a port the system picks, and the start
    line gives the URL to use."""
    import re
    import signal

    import httpx2 as httpx

    proc = subprocess.Popen([str(GEMMA_CHAT), "serve", "--demo", "--port", "0"], stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        lines = []
        for line in proc.stderr:  # "loading …", then "serving … at http://127.0.0.1:PORT/v1 …"
            lines.append(line)
            if "serving" in line:
                break
        found = re.search(r"at (http://127\.0\.0\.1:(\d+)/v1) ", lines[-1])
        assert found and int(found.group(2)) > 0, lines
        deadline = time.monotonic() + 60
        while True:
            try:
                models = httpx.get(found.group(1) + "/models", timeout=5).json()
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, lines
                time.sleep(0.1)
        assert models["data"][0]["id"] == "demo-tiny-trained-model"
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0


def test_openai_client_gets_a_400_for_audio_on_the_demo(server):
    """The demo has no audio tower: an input_audio part is an OpenAI-shaped 400 before any work."""
    import base64
    from pathlib import Path

    wav = (
        Path(__file__).resolve().parents[1] / "data" / "pack" / "references" / "audio" / "inputs" / "sine_1s.pcm16.wav"
    )
    part = {
        "type": "input_audio",
        "input_audio": {"data": base64.b64encode(wav.read_bytes()).decode(), "format": "wav"},
    }
    with pytest.raises(openai.BadRequestError) as caught:
        client(server).chat.completions.create(
            model="demo", messages=[{"role": "user", "content": [part, {"type": "text", "text": "What is it?"}]}]
        )
    assert caught.value.status_code == 400
    error = caught.value.body
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", "messages", 400)
    assert error["message"].startswith("demo")  # the demo's display name, e.g. "demo (tiny trained model)"
    assert error["message"].endswith(" does not take audio: Gemma 4 E2B, E4B and 12B do (26B-A4B and 31B do not)")
    reply = client(server).chat.completions.create(model="demo", messages=[{"role": "user", "content": PROMPT}])
    assert reply.choices[0].message.content  # the server goes on serving
