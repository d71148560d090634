"""`--connect` to a server that is not gemma-chat's (vLLM, llama.cpp, any OpenAI-compatible one) with tools.

A small fake OpenAI server (Starlette on loopback) answers as such servers do: vLLM-style streamed
`tool_calls` deltas (the id and name first, then pieces of the arguments), one whole JSON completion
with `message.tool_calls` (a server that does not stream), or a 400 for any request with tools (vLLM
started without --enable-auto-tool-choice). The RemoteEngine sends the tools in OpenAI's shape, with
`tool_choice` when one is forced, and turns what comes back into the engine's ToolCall events; a refusal
is retried once without tools, with a Notice, and tools are then off for that server. Last,
`gemma-chat generate --connect URL --tools FILE --json` as a process prints the server's call.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

from serve_process import GEMMA_CHAT
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from support.tools import GET_CURRENT_TIME

from core.engine.remote import RemoteEngine
from core.events import Notice, ToolCall, ToolCallDelta, ToolCallStarted, TurnDone
from core.frontends.server import BackgroundServer
from core.settings import GenerationSettings

ASK = [{"role": "user", "content": "What time is it in Paris?"}]
ARGS = '{"timezone": "Europe/Paris"}'
REFUSAL = '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'


class FakeOpenAI:
    """mode: "stream" (tool_calls deltas), "json" (one whole completion) or "refuse" (400 for tools)."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.requests: list[dict] = []

    def app(self) -> Starlette:
        async def models(request: Request) -> Response:
            return JSONResponse({"object": "list", "data": [{"id": "some-model", "object": "model"}]})

        async def chat(request: Request) -> Response:
            body = await request.json()
            self.requests.append(body)
            if "tools" in body and self.mode == "refuse":
                return JSONResponse({"error": {"message": REFUSAL, "type": "BadRequestError"}}, status_code=400)
            if "tools" not in body:
                return StreamingResponse(
                    self._sse([{"content": "It is noon."}], "stop"), media_type="text/event-stream"
                )
            if self.mode == "json":
                call = {
                    "id": "call_j1",
                    "type": "function",
                    "function": {"name": "get_current_time", "arguments": ARGS},
                }
                message = {"role": "assistant", "content": None, "tool_calls": [call]}
                usage = {"prompt_tokens": 30, "completion_tokens": 12, "total_tokens": 42}
                choice = {"index": 0, "message": message, "finish_reason": "tool_calls"}
                return JSONResponse({"id": "x", "object": "chat.completion", "choices": [choice], "usage": usage})
            first = {"index": 0, "id": "call_s1", "type": "function"}
            first["function"] = {"name": "get_current_time", "arguments": ""}
            pieces = [
                {"index": 0, "function": {"arguments": ARGS[:9]}},
                {"index": 0, "function": {"arguments": ARGS[9:]}},
            ]
            deltas = [{"content": "Let me check."}, {"tool_calls": [first]}, *({"tool_calls": [p]} for p in pieces)]
            return StreamingResponse(self._sse(deltas, "tool_calls"), media_type="text/event-stream")

        return Starlette(routes=[Route("/v1/models", models), Route("/v1/chat/completions", chat, methods=["POST"])])

    @staticmethod
    async def _sse(deltas: list[dict], finish: str) -> AsyncIterator[str]:
        for d in deltas:
            yield "data: " + json.dumps({"choices": [{"index": 0, "delta": d, "finish_reason": None}]}) + "\n\n"
        yield "data: " + json.dumps({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}) + "\n\n"
        yield "data: [DONE]\n\n"


@contextlib.contextmanager
def connected(mode: str):
    fake = FakeOpenAI(mode)
    with BackgroundServer(fake.app()) as url:
        remote = RemoteEngine(url)
        try:
            remote.load(None, None).result(timeout=30)
            yield fake, remote, url
        finally:
            remote.close()


def test_streamed_tool_call_deltas_become_a_call():
    with connected("stream") as (fake, remote, _):
        assert remote.kind == "openai" and remote.features.tools
        events: list = []
        settings = GenerationSettings(tool_choice="get_current_time")
        done = remote.chat(ASK, settings, events.append, tools=[GET_CURRENT_TIME]).result(60)
    assert isinstance(done, TurnDone) and done.error is None and done.stats.stop_reason == "tool_calls"
    [call] = done.tool_calls
    assert (call.id, call.name, call.arguments) == ("call_s1", "get_current_time", {"timezone": "Europe/Paris"})
    assert done.text == "Let me check."
    kinds = [type(e) for e in events]
    assert kinds.index(ToolCallStarted) < kinds.index(ToolCallDelta) < kinds.index(ToolCall) < kinds.index(TurnDone)
    [sent] = fake.requests
    assert sent["tools"] == [GET_CURRENT_TIME]  # OpenAI's shape, as given
    assert sent["tool_choice"] == {"type": "function", "function": {"name": "get_current_time"}}


def test_a_server_that_answers_with_one_json_completion():
    with connected("json") as (fake, remote, _):
        done = remote.chat(ASK, GenerationSettings(tool_choice="*"), lambda e: None, tools=[GET_CURRENT_TIME]).result(
            60
        )
        assert fake.requests[0]["tool_choice"] == "required"
        history = [
            *ASK,
            {"role": "assistant", "content": None, "tool_calls": [done.tool_calls[0].openai()]},
            {"role": "tool", "tool_call_id": "call_j1", "content": '{"datetime": "12:00"}'},
        ]
        after = remote.chat(history, GenerationSettings(), lambda e: None).result(60)
    assert done.error is None and done.stats.stop_reason == "tool_calls" and done.stats.tokens == 12
    assert [(c.id, c.arguments) for c in done.tool_calls] == [("call_j1", {"timezone": "Europe/Paris"})]
    assert after.text == "It is noon."
    sent = fake.requests[1]["messages"]  # the call and its result go back in OpenAI's shape
    assert sent[1]["tool_calls"][0]["id"] == "call_j1" and sent[2] == history[2]


def test_a_server_that_refuses_tools_answers_without_them_and_tools_go_off():
    with connected("refuse") as (fake, remote, _):
        events: list = []
        done = remote.chat(ASK, GenerationSettings(), events.append, tools=[GET_CURRENT_TIME]).result(60)
        assert done.error is None and done.text == "It is noon."
        [notice] = [e for e in events if isinstance(e, Notice)]
        assert "takes no tools" in notice.text and "--enable-auto-tool-choice" in notice.text
        assert "tools" in fake.requests[0] and "tools" not in fake.requests[1]
        assert not remote.features.tools  # the chat stops offering them to this server
        again = remote.chat(ASK, GenerationSettings(), lambda e: None, tools=[GET_CURRENT_TIME]).result(60)
        assert again.error is not None and "does not take tools" in again.error
        assert len(fake.requests) == 2


def test_generate_connect_with_a_tools_file_prints_the_call(tmp_path: Path):
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps([GET_CURRENT_TIME]))
    with connected("stream") as (fake, _, url):
        run = subprocess.run(
            [
                str(GEMMA_CHAT),
                "generate",
                "--connect",
                url,
                "--tools",
                str(tools),
                "--prompt",
                ASK[0]["content"],
                "--json",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert run.returncode == 0, run.stderr + run.stdout
    lines = [json.loads(line) for line in run.stdout.splitlines() if line.strip()]
    [call] = [line["tool_call"] for line in lines if "tool_call" in line]
    assert call["name"] == "get_current_time" and call["arguments"] == {"timezone": "Europe/Paris"}
    assert lines[-1]["stats"]["stop_reason"] == "tool_calls"
    assert fake.requests[-1]["tools"] == [GET_CURRENT_TIME]
