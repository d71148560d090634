"""`gemma-chat serve` (core.frontends.server) and `--connect` (core.engine.remote), on loopback servers the tests start.

Real engines on tiny checkpoints for the numbers that must match `generate` (greedy text, token ids,
draft flags); the scripted FakeEngine where timing must be controlled (queueing, disconnects).
"""

from __future__ import annotations

import contextlib
import io
import json
import threading
import time

import httpx2 as httpx
import pytest
from support.fake_engine import FakeEngine
from support.fake_engine import PairingSpec as FakeSpec

from app.cli import main
from core.engine.contract import PairingSpec
from core.engine.local import Engine
from core.engine.remote import RemoteEngine, parse_spec_metrics
from core.events import TokenEvent, TurnDone
from core.frontends.server import BackgroundServer, ServerConfig, StopScanner, create_app
from core.settings import GenerationSettings

PACK = "tests/data/pack/models"
PROMPT = "How do I reverse a list in place?"
TIMEOUT = httpx.Timeout(60.0)


def post(url: str, **kwargs):
    kwargs.setdefault("timeout", TIMEOUT)  # the machine may be loaded: httpx's 5 s default is not a limit to test
    return httpx.post(url, **kwargs)


def get(url: str, **kwargs):
    kwargs.setdefault("timeout", TIMEOUT)
    return httpx.get(url, **kwargs)


def generate_json(argv: list[str]) -> tuple[int, list[dict]]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["generate", *argv, "--json"])
    return rc, [json.loads(line) for line in out.getvalue().splitlines() if line.strip()]


@contextlib.contextmanager
def serving(engine, **config):
    app = create_app(engine, ServerConfig(model_id=config.pop("model_id", "test-model"), **config))
    with BackgroundServer(app) as url:
        yield url


@contextlib.contextmanager
def real_engine(target, drafter):
    engine = Engine()
    try:
        engine.load(PairingSpec("test", str(target), str(drafter) if drafter else None), None).result(timeout=120)
        yield engine
    finally:
        engine.close()


@contextlib.contextmanager
def fake_engine(**kwargs):
    engine = FakeEngine(**kwargs)
    engine.load(FakeSpec("fake", "t", "d"), lambda e: None).result(timeout=5)
    try:
        yield engine
    finally:
        engine.close()


def sse_chunks(response) -> list[dict]:
    chunks = []
    for line in response.iter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            chunks.append(json.loads(line[6:]))
    return chunks


def stream_tokens(chunks: list[dict]) -> list[dict]:
    return [t for c in chunks for t in (c.get("gemma_chat") or {}).get("tokens", [])]


# -- the API over a real engine ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def factory_pair(tmp_path_factory):
    from support.factory import build_pairing

    return build_pairing(tmp_path_factory.mktemp("serve-factory"), "e-style")


def test_serve_greedy_text_equals_generate_streamed_and_not(factory_pair):
    target, drafter = factory_pair
    rc, lines = generate_json(
        [
            "--model",
            str(target),
            "--drafter",
            str(drafter),
            "--prompt",
            PROMPT,
            "--block-size",
            "3",
            "--max-tokens",
            "24",
        ]
    )
    assert rc == 0
    local = lines[:-1]
    text = "".join(t["text"] for t in local)
    body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 24, "temperature": 0, "block_size": 3}
    with real_engine(target, drafter) as engine, serving(engine) as url:
        whole = post(url + "/v1/chat/completions", json=body, timeout=TIMEOUT)
        assert whole.status_code == 200
        answer = whole.json()
        assert answer["object"] == "chat.completion"
        assert answer["choices"][0]["message"] == {"role": "assistant", "content": text}
        assert answer["usage"]["completion_tokens"] == len(local)
        with httpx.stream("POST", url + "/v1/chat/completions", json={**body, "stream": True}, timeout=TIMEOUT) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            chunks = sse_chunks(r)
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == text
    assert [t["id"] for t in stream_tokens(chunks)] == [t["id"] for t in local]
    last = chunks[-1]
    assert last["choices"][0]["finish_reason"] == "length"
    assert last["usage"]["completion_tokens"] == len(local)
    assert last["gemma_chat"]["stats"]["decode_tokens"] == len(local) - 1


def test_stream_draft_flags_and_rounds_equal_the_engine():
    pair = ["--model", f"{PACK}/e-style-target", "--drafter", f"{PACK}/e-style-assistant"]
    rc, lines = generate_json([*pair, "--prompt", PROMPT, "--block-size", "4", "--max-tokens", "40"])
    assert rc == 0
    local, stats = lines[:-1], lines[-1]["stats"]
    assert any(t["from_draft"] for t in local) and not all(t["from_draft"] for t in local)
    body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 40, "block_size": 4, "stream": True}
    with real_engine(f"{PACK}/e-style-target", f"{PACK}/e-style-assistant") as engine, serving(engine) as url:
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=TIMEOUT) as r:
            chunks = sse_chunks(r)
    assert stream_tokens(chunks) == local  # id, text, from_draft and round, token for token
    rounds = [r for c in chunks for r in (c.get("gemma_chat") or {}).get("rounds", [])]
    assert len(rounds) == stats["rounds"] and sum(r["accepted"] for r in rounds) == stats["accepted"]
    served = chunks[-1]["gemma_chat"]["stats"]
    for key in ("accepted", "drafted", "rounds", "decode_tokens", "block_size_counts"):
        assert served[key] == stats[key], key


def test_connect_reproduces_generate_tokens():
    pair = ["--model", f"{PACK}/e-style-target", "--drafter", f"{PACK}/e-style-assistant"]
    args = ["--prompt", PROMPT, "--block-size", "3", "--max-tokens", "32"]
    rc, local = generate_json([*pair, *args])
    assert rc == 0
    with real_engine(f"{PACK}/e-style-target", f"{PACK}/e-style-assistant") as engine, serving(engine) as url:
        rc, remote = generate_json(["--connect", url, *args])
    assert rc == 0
    assert remote[:-1] == local[:-1]
    for key in ("accepted", "drafted", "rounds", "decode_tokens", "prompt_tokens", "stop_reason"):
        assert remote[-1]["stats"][key] == local[-1]["stats"][key], key


def test_images_as_data_and_file_urls_match_generate_with_image():
    import base64
    from pathlib import Path

    image = Path("tests/data/pack/references/images/test_image.png").resolve()
    pair = ["--model", f"{PACK}/e-style-target", "--drafter", f"{PACK}/e-style-assistant"]
    args = ["--prompt", "Describe this image.", "--block-size", "3", "--max-tokens", "12"]
    rc, local = generate_json([*pair, *args, "--image", str(image)])
    assert rc == 0
    text = "".join(t["text"] for t in local[:-1])
    data_url = "data:image/png;base64," + base64.b64encode(image.read_bytes()).decode()

    def body(url: str) -> dict:
        parts = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "Describe this image."}]
        return {"messages": [{"role": "user", "content": parts}], "max_tokens": 12, "block_size": 3}

    with real_engine(f"{PACK}/e-style-target", f"{PACK}/e-style-assistant") as engine:
        with serving(engine) as url:
            for image_url in (data_url, image.as_uri()):
                r = post(url + "/v1/chat/completions", json=body(image_url), timeout=TIMEOUT)
                assert r.status_code == 200, r.text
                assert r.json()["choices"][0]["message"]["content"] == text
            rc, remote = generate_json(["--connect", url, *args, "--image", str(image)])  # sent as a data URL
            assert rc == 0 and remote[:-1] == local[:-1]
            r = post(url + "/v1/chat/completions", json=body("data:image/png;base64,bm90IGFuIGltYWdl"))
            assert r.status_code == 400 and "image" in r.json()["error"]["message"].lower()
        with serving(engine, allow_file_urls=False) as url:  # what a non-loopback `serve` gets
            r = post(url + "/v1/chat/completions", json=body(image.as_uri()), timeout=TIMEOUT)
            assert r.status_code == 400 and "file: image URLs are refused" in r.json()["error"]["message"]


def test_remote_engine_events_equal_the_local_engines_in_order():
    from core.events import PrefillDone, RoundEvent

    def shape(events):
        out = []
        for e in events:
            if isinstance(e, TokenEvent):
                out.append(("token", e.id, e.text, e.from_draft, e.round))
            elif isinstance(e, RoundEvent):
                out.append(("round", e.round, e.drafted, e.accepted, e.block_size, e.emitted))
            elif isinstance(e, (PrefillDone, TurnDone)):
                out.append(type(e).__name__)
        return out

    settings = GenerationSettings(max_tokens=30, block_size=4)
    messages = [{"role": "user", "content": PROMPT}]
    with real_engine(f"{PACK}/e-style-target", f"{PACK}/e-style-assistant") as engine, serving(engine) as url:
        local: list = []
        engine.chat(messages, settings, local.append).result(timeout=60)
        remote_engine = RemoteEngine(url)
        try:
            remote_engine.load(None, None).result(timeout=10)
            remote: list = []
            done = remote_engine.chat(messages, settings, remote.append).result(timeout=60)
        finally:
            remote_engine.close()
    assert shape(remote) == shape(local)
    assert done.token_ids == local[-1].token_ids and done.text == local[-1].text
    assert done.stats.accepted == local[-1].stats.accepted > 0


# -- queueing, disconnects, limits (scripted engine) ------------------------------------------------


def test_second_request_queues_and_one_past_the_limit_gets_429():
    with fake_engine(step=True) as engine, serving(engine, max_waiting=1) as url:
        body = {"messages": [{"role": "user", "content": "first"}], "stream": True}
        results: dict[str, object] = {}
        # per turn, whether every earlier one had ended (emitted its TurnDone: the fake engine does that just
        # before it resolves the turn's future, so the server may start the next turn in between)
        started, ended_before = [0], []
        start_turn = engine.chat

        def chat(*args, **kwargs):
            ended_before.append(len(engine.turns) == started[0])
            started[0] += 1
            return start_turn(*args, **kwargs)

        engine.chat = chat

        def second() -> None:
            r = post(
                url + "/v1/chat/completions",
                json={"messages": [{"role": "user", "content": "second"}]},
                timeout=TIMEOUT,
            )
            results["second"] = (r.status_code, r.json())

        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=TIMEOUT) as first:
            lines = first.iter_lines()
            next(line for line in lines if '"tokens"' in line)  # the first turn is running
            waiter = threading.Thread(target=second)
            waiter.start()
            deadline = time.monotonic() + 10
            while get(url + "/health").json()["waiting"] != 1:
                assert time.monotonic() < deadline, "the second request never queued"
                time.sleep(0.02)
            assert len(engine.chats) == 1  # queued in the server, not in the engine
            third = post(
                url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "3"}]}, timeout=TIMEOUT
            )
            assert third.status_code == 429
            assert "busy" in third.json()["error"]["message"] and third.json()["error"]["type"] == "server_busy"
            assert results == {}  # still waiting
            engine.step = False  # let the rounds run
            engine.allow(1)
            rest = list(lines)
        waiter.join(timeout=30)
    assert [line for line in rest if line][-1] == "data: [DONE]"
    status, answer = results["second"]
    assert status == 200 and answer["choices"][0]["message"]["content"] == engine.replies[0]
    assert ended_before == [True, True]  # the second began once the first had ended
    assert [m[0][-1]["content"] for m in engine.chats] == ["first", "second"]  # arrival order


def test_client_disconnect_cancels_the_turn_and_frees_the_engine():
    with fake_engine(step=True) as engine, serving(engine) as url:
        body = {"messages": [{"role": "user", "content": "hi"}], "stream": True}
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=TIMEOUT) as r:
            next(line for line in r.iter_lines() if '"tokens"' in line)  # prefill token out, rounds held
        deadline = time.monotonic() + 10
        while not engine.turns:
            assert time.monotonic() < deadline, "the turn was not cancelled"
            time.sleep(0.02)
        assert engine.turns[-1].stats.stop_reason == "cancelled"
        assert engine.calls_named("cancel")
        # a client that gives up while queued never reaches the engine
        engine.step = True
        running = httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=TIMEOUT)
        first = running.__enter__()
        lines = first.iter_lines()  # kept: a dropped line iterator closes the connection
        next(line for line in lines if '"tokens"' in line)
        quitter = httpx.Client(timeout=0.5)
        with pytest.raises(httpx.ReadTimeout):
            quitter.post(url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "gone"}]})
        quitter.close()
        deadline = time.monotonic() + 10
        while get(url + "/health").json()["waiting"] != 0:
            assert time.monotonic() < deadline, "the queued request stayed after its client left"
            time.sleep(0.02)
        running.__exit__(None, None, None)
        while len(engine.turns) < 2:
            assert time.monotonic() < deadline + 10
            time.sleep(0.02)
        assert [m[0][-1]["content"] for m in engine.chats] == ["hi", "hi"]  # "gone" never ran
        # the engine is free for the next client
        engine.step = False
        r = post(url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "again"}]})
        assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "stop"


def test_a_non_streamed_client_that_leaves_cancels_its_turn():
    with fake_engine(step=True) as engine, serving(engine) as url:
        with httpx.Client(timeout=0.5) as client, pytest.raises(httpx.ReadTimeout):
            client.post(url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
        deadline = time.monotonic() + 10
        while not engine.turns:
            assert time.monotonic() < deadline, "the turn was not cancelled"
            time.sleep(0.02)
        assert engine.turns[-1].stats.stop_reason == "cancelled"


def test_block_size_keys_reach_a_running_turn_through_the_server():
    with fake_engine(step=True) as engine, serving(engine) as url:
        remote = RemoteEngine(url)
        try:
            remote.load(None, None).result(timeout=10)
            assert remote.features.live_controls and remote.features.token_origins
            events: list = []
            future = remote.chat([{"role": "user", "content": "x"}], GenerationSettings(block_size=4), events.append)
            deadline = time.monotonic() + 10
            while not any(isinstance(e, TokenEvent) for e in events):
                assert time.monotonic() < deadline
                time.sleep(0.02)
            engine.allow(1)
            while engine.rounds_done != 1:
                assert time.monotonic() < deadline
                time.sleep(0.02)
            remote.set_block_size(2)
            remote.set_drafter_enabled(False)
            while not engine.calls_named("set_drafter_enabled"):
                assert time.monotonic() < deadline, "the control never reached the engine"
                time.sleep(0.02)
            assert [(c.arg, c.rounds_done) for c in engine.calls_named("set_block_size")] == [(2, 1)]
            engine.step = False
            engine.allow(1)
            done = future.result(timeout=10)
        finally:
            remote.close()
    assert engine.rounds[0].block_size == 4 and engine.rounds[1].drafted == 0
    assert done.stats.rounds == len(engine.rounds)


def test_non_loopback_bind_without_a_key_is_refused(capsys, monkeypatch):
    monkeypatch.delenv("GEMMA_CHAT_API_KEY", raising=False)
    assert main(["serve", "--demo", "--host", "0.0.0.0", "--port", "8123"]) == 2
    err = capsys.readouterr().err
    assert "refusing to serve on 0.0.0.0 without an API key" in err and "--api-key" in err


def test_api_key_is_required_when_set_and_errors_are_openai_shaped():
    with fake_engine() as engine, serving(engine, api_key="s3cret") as url:
        body = {"messages": [{"role": "user", "content": "hi"}]}
        assert get(url + "/health").status_code == 200  # liveness stays open
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            r = post(url + "/v1/chat/completions", json=body, headers=headers)
            assert r.status_code == 401 and r.json()["error"]["type"] == "invalid_api_key"
        ok = {"Authorization": "Bearer s3cret"}
        assert get(url + "/v1/models", headers=ok).json()["data"][0]["id"] == "test-model"
        bad = [
            ({"messages": []}, "messages"),
            ({"messages": [{"role": "tool", "content": "x"}]}, "role"),
            ({**body, "temperature": "hot"}, "temperature"),
            ({**body, "top_p": 2}, "top_p"),
            ({**body, "n": 2}, "n=1"),
            ({**body, "block_size": 99}, "block_size"),
            (
                {
                    "messages": [
                        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}
                    ]
                },
                "data: or file:",
            ),
        ]
        for payload, words in bad:
            r = post(url + "/v1/chat/completions", json=payload, headers=ok)
            assert r.status_code == 400, payload
            assert words in r.json()["error"]["message"], (payload, r.json())
        r = post(url + "/v1/chat/completions", content=b"{nope", headers={**ok, "Content-Type": "application/json"})
        assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
        assert get(url + "/v2/whatever", headers=ok).json()["error"]["code"] == 404
        for key, works in ((None, False), ("s3cret", True)):
            remote = RemoteEngine(url, key)
            try:
                if works:
                    assert remote.load(None, None).result(timeout=10).name.startswith("test-model (gemma-chat at")
                else:
                    with pytest.raises(Exception, match="HTTP 401.*API key"):
                        remote.load(None, None).result(timeout=10)
            finally:
                remote.close()


def test_stop_strings_end_the_reply_before_the_stop():
    reply = "alpha beta gamma delta epsilon" + " zeta" * 40
    with fake_engine(replies=[reply], delay_s=0.05) as engine, serving(engine) as url:
        body = {"messages": [{"role": "user", "content": "x"}], "stop": [" gam"]}
        whole = post(url + "/v1/chat/completions", json=body).json()
        assert whole["choices"][0] == {
            "index": 0,
            "message": {"role": "assistant", "content": "alpha beta"},
            "logprobs": None,
            "finish_reason": "stop",
        }
        assert whole["usage"]["completion_tokens"] == 2 and whole["usage"]["prompt_tokens"] > 0
        with httpx.stream("POST", url + "/v1/chat/completions", json={**body, "stream": True}) as r:
            chunks = sse_chunks(r)
        assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == "alpha beta"
        assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert [t.stats.stop_reason for t in engine.turns] == ["cancelled", "cancelled"]  # stopped early


def test_stop_scanner_holds_back_a_possible_start_and_cuts_inside_a_token():
    tok = lambda text: TokenEvent(1, text, False, 0)  # noqa: E731
    scanner = StopScanner(["END"])
    assert [t.text for t in scanner.feed([tok("ab"), tok("cE")])] == ["ab"]  # "cE" may start "END"
    assert [t.text for t in scanner.feed([tok("Nx")])] == ["cE", "Nx"]  # it was not "END" after all
    scanner = StopScanner(["END"])
    out = scanner.feed([tok("abE"), tok("NDzz")])
    assert "".join(t.text for t in out) == "ab" and scanner.stopped


# -- --connect against the vLLM stand-in ------------------------------------------------------------


def test_remote_engine_over_vllm_reads_text_and_spec_metrics():
    from vllm_standin import VllmStandIn, recorded_steps

    standin = VllmStandIn(chunk_delay_s=0.01)
    steps = recorded_steps()
    with BackgroundServer(standin.app()) as url:
        engine = RemoteEngine(url + "/v1", metrics_poll_s=0.05)
        try:
            info = engine.load(None, None).result(timeout=10)
            assert engine.kind == "vllm" and info.drafter_path is not None and not engine.features.live_controls
            events: list = []
            done = engine.chat([{"role": "user", "content": "hi"}], GenerationSettings(), events.append).result(10)
        finally:
            engine.close()
    request = standin.requests[-1]
    assert request["model"] == "google/gemma-4-31B-it" and request["stream_options"]["continuous_usage_stats"]
    assert "block_size" not in request  # vLLM gets only what it understands
    tokens = [e for e in events if isinstance(e, TokenEvent)]
    assert all(t.from_draft is None for t in tokens) and len(tokens) == sum(steps)
    assert (
        done.text == "Speculative decoding lets a small drafter propose tokens that the big model checks in one pass."
    )
    s = done.stats
    assert (s.rounds, s.drafted, s.accepted) == (len(steps) - 1, len(steps) - 1, sum(n - 1 for n in steps[1:]))
    assert s.decode_tokens == sum(steps) - 1 and s.stop_reason == "eos" and s.prompt_tokens == 17
    assert done.token_ids == (-1,) * sum(steps)  # ids unknown, the count known
    assert s.tokens_per_round == pytest.approx(1 + s.accepted / s.rounds)


def test_parse_spec_metrics_sums_label_sets_and_ignores_created():
    text = "\n".join(
        [
            "# TYPE vllm:spec_decode_num_drafts_total counter",
            'vllm:spec_decode_num_drafts_total{engine="0"} 10.0',
            'vllm:spec_decode_num_drafts_total{engine="1"} 5.0',
            'vllm:spec_decode_num_drafts_created{engine="0"} 1.7e9',
            'vllm:spec_decode_num_draft_tokens_total{engine="0"} 30.0',
            'vllm:spec_decode_num_accepted_tokens_total{engine="0"} 12.0',
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="0"} 9.0',
        ]
    )
    assert parse_spec_metrics(text) == {"drafts": 15.0, "drafted": 30.0, "accepted": 12.0}
    assert parse_spec_metrics("vllm:generation_tokens_total 5\n") is None


# -- a dead, garbage or slow server -----------------------------------------------------------------


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_dead_server_gets_a_clear_error():
    engine = RemoteEngine(f"http://127.0.0.1:{_free_port()}")
    try:
        with pytest.raises(Exception, match="cannot reach the server at http://127.0.0.1"):
            engine.load(None, None).result(timeout=20)
    finally:
        engine.close()
    rc, lines = generate_json(["--connect", f"http://127.0.0.1:{_free_port()}", "--prompt", "x"])
    assert rc == 1 and "cannot reach the server" in lines[-1]["error"]


def _garbage_app(mode: str):
    from starlette.applications import Starlette
    from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    async def models(request):
        if mode == "html":
            return HTMLResponse("<html><body>It works!</body></html>")
        return JSONResponse({"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "someone"}]})

    async def chat(request):
        if mode == "slow":
            import asyncio

            await asyncio.sleep(5)
            return Response("late")

        async def body():
            yield b'data: {"choices":[{"index":0,"delta":{"content":"Hel"}}]}\n\n'
            yield b"data: {this is not json\n\n"

        return StreamingResponse(body(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/models", models), Route("/v1/chat/completions", chat, methods=["POST"])])


def test_garbage_or_slow_server_gets_a_clear_error():
    with BackgroundServer(_garbage_app("html")) as url:
        engine = RemoteEngine(url)
        try:
            with pytest.raises(Exception, match="not an OpenAI-compatible server"):
                engine.load(None, None).result(timeout=10)
        finally:
            engine.close()
    for mode, words in (("sse", "not JSON"), ("slow", "sent nothing for 0.5 s")):
        with BackgroundServer(_garbage_app(mode)) as url:
            engine = RemoteEngine(url, timeout_s=0.5)
            try:
                engine.load(None, None).result(timeout=10)
                assert engine.kind == "openai"
                done = engine.chat([{"role": "user", "content": "x"}], GenerationSettings(), None).result(timeout=10)
            finally:
                engine.close()
        assert isinstance(done, TurnDone) and done.stats.stop_reason == "error" and words in done.error, done.error


# -- the TUI on a remote engine ---------------------------------------------------------------------


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.mark.anyio
async def test_tui_panels_over_the_vllm_stand_in():
    from pilot import ready, until
    from vllm_standin import VllmStandIn, recorded_steps

    from app.tui.app import GemmaChatApp
    from app.tui.widgets.conversation import UNKNOWN_STYLE

    standin = VllmStandIn(chunk_delay_s=0.03)
    steps = recorded_steps()
    with BackgroundServer(standin.app()) as url:
        engine = RemoteEngine(url, metrics_poll_s=0.05)
        app = GemmaChatApp(engine, PairingSpec("remote", url, None))
        async with app.run_test(size=(110, 34)) as pilot:
            await ready(pilot, app)
            chat = app.chat
            assert "google/gemma-4-31B-it (vLLM at 127.0.0.1" in str(chat.panel.pairing.content)
            assert "origin not reported" in str(chat.legend.content)
            chat.prompt.text = "hello"
            await pilot.press("enter")
            await until(pilot, lambda: chat.last_reply is not None, timeout=15)
            reply = chat.last_reply
            assert reply.plain.startswith("Speculative decoding")
            assert {span.style for span in reply.tokens.text.spans} == {UNKNOWN_STYLE}
            accepted, rounds = sum(n - 1 for n in steps[1:]), len(steps) - 1

            def figures() -> str:
                return str(chat.panel.figures.content)

            # the figures follow /metrics polls and the panel's refresh: wait for the whole reply's
            want_acc = f"Acceptance  {accepted / rounds * 100:.0f} %"
            want_tpr = f"Tok/round   {(sum(steps) - 1) / rounds:.2f}"
            await until(pilot, lambda: want_acc in figures() and want_tpr in figures(), timeout=10)
            assert str(reply.summary.content).startswith(f"{sum(steps)} tokens · ")
            assert "Block size  server" in str(chat.panel.tuning.content)
            chat.conversation.focus()
            await pilot.press("plus")  # block size +1: vLLM fixes it at launch, and the screen says so
            await until(pilot, lambda: any("num_speculative_tokens" in str(n.message) for n in app._notifications))
            assert chat.history[-1] == {"role": "assistant", "content": reply.plain}
            await app.action_quit()


@pytest.mark.anyio
async def test_tui_keeps_the_conversation_when_the_server_dies():
    from pilot import ready, until

    from app.tui.app import GemmaChatApp

    with fake_engine() as local:
        app_server = BackgroundServer(create_app(local, ServerConfig("m")))
        url = app_server.__enter__()
        engine = RemoteEngine(url)
        app = GemmaChatApp(engine, PairingSpec("remote", url, None))
        async with app.run_test(size=(110, 34)) as pilot:
            await ready(pilot, app)
            chat = app.chat
            assert "drafted + accepted" in str(chat.legend.content)  # gemma-chat serve says the origin
            chat.prompt.text = "first"
            await pilot.press("enter")
            await until(pilot, lambda: chat.last_reply is not None, timeout=15)
            spans = {span.style for span in chat.last_reply.tokens.text.spans}
            assert len(spans) == 2  # drafted and target colours, as local
            app_server.__exit__(None, None, None)  # the server goes away
            chat.prompt.text = "second"
            await pilot.press("enter")
            await until(pilot, lambda: chat.reply is None and chat.prompt.text == "second", timeout=15)
            assert [m["role"] for m in chat.history] == ["user", "assistant"]
            # the failure's notification is posted as a message: wait for it rather than race it
            await until(pilot, lambda: any("Generation failed" in str(n.message) for n in app._notifications))
            notes = [str(n.message) for n in app._notifications]
            assert any("cannot reach the server" in n for n in notes), notes
            await app.action_quit()


class _EngineThatFailsSilently(FakeEngine):
    """A broken engine: its turn's future fails and no TurnDone is ever sent."""

    def chat(self, messages, settings, on_event, tools=None):  # type: ignore[override]
        import concurrent.futures

        future: concurrent.futures.Future = concurrent.futures.Future()
        threading.Timer(0.2, future.set_exception, (RuntimeError("engine bug"),)).start()
        return future


@pytest.mark.parametrize("stream", [False, True])
def test_a_turn_that_fails_without_turn_done_ends_the_request_instead_of_hanging_it(stream):
    engine = _EngineThatFailsSilently()
    engine.load(FakeSpec("fake", "t", "d"), lambda e: None).result(timeout=5)
    try:
        with serving(engine) as url:
            t0 = time.monotonic()
            body = {"messages": [{"role": "user", "content": "hi"}], "stream": stream}
            r = post(url + "/v1/chat/completions", json=body, timeout=30)
            assert time.monotonic() - t0 < 10
            # an OpenAI-shaped 500 (the engine's own words stay in the server's log), streamed or not
            assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
            assert get(url + "/health").status_code == 200  # and the server goes on
    finally:
        engine.close()


def test_round_and_prefill_events_go_out_as_all_their_fields():
    """The stream's `rounds` and `prefill` objects are the events' fields, as `dataclasses.asdict` gives them
    (the server copies them flat: an event that grows a nested field must be sent some other way)."""
    import dataclasses

    from core.events import PrefillDone, RoundEvent
    from core.frontends.server import _flat

    for ev in (RoundEvent(3, 2, 1, 3, True, 2, "drafting", "auto → 3"), PrefillDone(40, 12, 28, 0.25)):
        assert _flat(ev) == dataclasses.asdict(ev) and list(_flat(ev)) == list(dataclasses.asdict(ev))
        assert all(not dataclasses.is_dataclass(v) and not isinstance(v, (list, dict)) for v in _flat(ev).values())
