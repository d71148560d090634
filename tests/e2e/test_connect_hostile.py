"""`--connect` against servers that lie, stall or flood (issue 24, items 5, 6, 7 and 11).

Each hostile server is a few lines of Starlette on a loopback port (BackgroundServer); the client is the
real one: `RemoteEngine`, `gemma-chat generate --connect` in-process, and the chat app over it. A turn
must end within seconds with one clear sentence (never a traceback, a hang or a silent success), and a
password in the URL must never be shown or stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import sqlite3
import stat
from collections.abc import AsyncIterator, Callable

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from app.cli import main
from core.engine import remote as remote_module
from core.engine.contract import PairingSpec
from core.engine.remote import RemoteEngine
from core.frontends.server import BackgroundServer
from core.settings import GenerationSettings

CARD = {"id": "m", "object": "model", "owned_by": "someone"}
MB = 1 << 20


def chunk(content: object = None, finish: str | None = None) -> bytes:
    delta = {} if content is None else {"content": content}
    body = {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def hostile_app(
    events: Callable[[], AsyncIterator[bytes]] | None = None,
    *,
    models: Callable[[Request], Response] | None = None,
    chat: Callable[[Request], Response] | None = None,
) -> Starlette:
    async def list_models(request: Request) -> Response:
        return models(request) if models else JSONResponse({"object": "list", "data": [CARD]})

    async def completions(request: Request) -> Response:
        if chat is not None:
            return chat(request)
        assert events is not None
        return StreamingResponse(events(), media_type="text/event-stream")

    return Starlette(
        routes=[Route("/v1/models", list_models), Route("/v1/chat/completions", completions, methods=["POST"])]
    )


def turn(url: str, settings: GenerationSettings | None = None, timeout: float = 20, **kwargs):
    """One chat turn through RemoteEngine: (TurnDone, events). A turn that does not end is a failure."""
    engine = RemoteEngine(url, **kwargs)
    try:
        engine.load(None, None).result(timeout=timeout)
        events: list = []
        done = engine.chat([{"role": "user", "content": "hi"}], settings or GenerationSettings(), events.append)
        return done.result(timeout=timeout), events
    finally:
        engine.close()


def generate(capsys, *argv: str) -> tuple[int, list[dict], str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["generate", *argv, "--json"])
    err = capsys.readouterr().err
    return rc, [json.loads(line) for line in out.getvalue().splitlines() if line.strip()], err


# --- 11. what the server sends is not what it should be ------------------------------------------------
def test_11_content_that_is_not_text_is_an_error_not_a_crash(capsys):
    async def events():
        yield chunk("Hel")
        yield chunk(5)
        yield chunk(None, "stop")
        yield b"data: [DONE]\n\n"

    with BackgroundServer(hostile_app(events)) as url:
        done, _ = turn(url)
        assert done.error and "not text" in done.error
        rc, lines, err = generate(capsys, "--connect", url, "--prompt", "hi")
    assert rc == 1 and "not text" in lines[-1]["error"] and "Traceback" not in err


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.mark.anyio
async def test_11_chat_app_survives_content_that_is_not_text():
    from pilot import ready, until

    from app.tui.app import GemmaChatApp

    async def events():
        yield chunk(5)
        yield chunk(None, "stop")

    with BackgroundServer(hostile_app(events)) as url:
        engine = RemoteEngine(url)
        app = GemmaChatApp(engine, PairingSpec("remote", url, None))
        async with app.run_test(size=(110, 34)) as pilot:
            await ready(pilot, app)
            app.chat.prompt.text = "hello"
            await pilot.press("enter")
            await until(pilot, lambda: any("not text" in str(n.message) for n in app._notifications), timeout=15)
            assert app.is_running and app.chat.prompt.text == "hello"  # the unsent message is back
            await app.action_quit()


@pytest.mark.parametrize("port", [":99999", ":abc", "::::"])
def test_11_bad_port_is_one_sentence_also_in_json(capsys, port):
    rc, lines, err = generate(capsys, "--connect", f"http://127.0.0.1{port}", "--prompt", "hi")
    assert rc == 1 and "port" in lines[-1]["error"] and "Traceback" not in err


def test_11_model_card_fields_of_the_wrong_type_are_not_a_crash(capsys):
    card = {**CARD, "owned_by": "vllm", "max_model_len": "lots"}

    async def events():
        yield chunk("Hi")
        yield chunk(None, "stop")
        yield b"data: [DONE]\n\n"

    app = hostile_app(events, models=lambda r: JSONResponse({"object": "list", "data": [card]}))
    with BackgroundServer(app) as url:
        rc, lines, err = generate(capsys, "--connect", url, "--prompt", "hi")
    assert rc == 0 and lines[0]["text"] == "Hi" and "Traceback" not in err


def test_11_keep_alive_comments_forever_time_out():
    async def events():
        while True:
            yield b": keep-alive\n\n"
            await asyncio.sleep(0.05)

    with BackgroundServer(hostile_app(events)) as url:
        done, _ = turn(url, timeout_s=1.0)
    assert done.error and "keep-alive" in done.error


def test_11_a_server_that_ignores_max_tokens_is_cut_off_at_the_count():
    async def events():
        while True:
            yield chunk("x")
            await asyncio.sleep(0.005)

    with BackgroundServer(hostile_app(events)) as url:
        done, events_seen = turn(url, GenerationSettings(max_tokens=5))
    assert done.error is None and done.text == "xxxxx" and done.stats.tokens == 5
    assert done.stats.stop_reason == "max_tokens"


def test_11_a_finished_reply_on_an_idle_connection_is_kept(monkeypatch):
    monkeypatch.setattr(remote_module, "FINISH_GRACE_S", 0.5, raising=False)

    async def events():
        yield chunk("Done.")
        yield chunk(None, "stop")
        await asyncio.sleep(60)  # no [DONE], connection open

    with BackgroundServer(hostile_app(events)) as url:
        done, _ = turn(url, timeout=15, timeout_s=30.0)
    assert done.error is None and done.text == "Done." and done.stats.stop_reason == "eos"


def test_11_a_stream_of_only_done_is_an_error(capsys):
    async def events():
        yield b"data: [DONE]\n\n"

    with BackgroundServer(hostile_app(events)) as url:
        done, _ = turn(url)
        assert done.error and "without a reply" in done.error
        rc, lines, err = generate(capsys, "--connect", url, "--prompt", "hi")
    assert rc == 1 and "without a reply" in lines[-1]["error"]


def test_11_https_to_a_plain_http_port_says_tls():
    async def events():
        yield chunk(None, "stop")

    with BackgroundServer(hostile_app(events)) as url:
        engine = RemoteEngine(url.replace("http://", "https://"))
        try:
            with pytest.raises(Exception, match="TLS") as caught:
                engine.load(None, None).result(timeout=20)
        finally:
            engine.close()
    assert "connection refused" not in str(caught.value)


# --- 5. sizes the client does not trust -------------------------------------------------------------------
def test_05_an_endless_event_line_is_refused_at_its_cap():
    async def events():
        yield b'data: {"choices": [{"delta": {"content": "'
        for _ in range(64):  # 64 MB of one line
            yield b"a" * MB

    with BackgroundServer(hostile_app(events)) as url:
        done, _ = turn(url, timeout=60)
    assert done.error and "line of more than" in done.error


def test_05_a_huge_error_body_is_refused_at_its_cap():
    with BackgroundServer(hostile_app(chat=lambda r: Response(b"x" * (64 * MB), status_code=500))) as url:
        done, _ = turn(url, timeout=60)
    assert done.error and "bytes" in done.error and "xxxx" not in done.error


def test_05_a_huge_model_list_is_refused_at_its_cap():
    def models(request: Request) -> Response:
        return Response(b'{"object": "list", "data": [' + b" " * (64 * MB) + b"]}", media_type="application/json")

    with BackgroundServer(hostile_app(models=models, chat=lambda r: Response(b""))) as url:
        engine = RemoteEngine(url)
        try:
            with pytest.raises(Exception, match="bytes"):
                engine.load(None, None).result(timeout=60)
        finally:
            engine.close()


# --- 6. credentials in the URL ------------------------------------------------------------------------
SECRET = "s3cret-Pa55"


def basic_auth_app() -> Starlette:
    import base64

    want = "Basic " + base64.b64encode(f"user:{SECRET}".encode()).decode()

    async def events():
        yield chunk("Hi")
        yield chunk(None, "stop")
        yield b"data: [DONE]\n\n"

    def guarded(inner: Callable[[Request], Response]) -> Callable[[Request], Response]:
        def check(request: Request) -> Response:
            if request.headers.get("authorization") != want:
                return JSONResponse({"error": {"message": "who are you?"}}, status_code=401)
            return inner(request)

        return check

    models = guarded(lambda r: JSONResponse({"object": "list", "data": [CARD]}))
    chat = guarded(lambda r: StreamingResponse(events(), media_type="text/event-stream"))
    return hostile_app(models=models, chat=chat)


def test_06_url_credentials_authenticate_and_are_never_shown():
    with BackgroundServer(basic_auth_app()) as url:
        with_creds = url.replace("http://", f"http://user:{SECRET}@")
        engine = RemoteEngine(with_creds)
        try:
            info = engine.load(None, None).result(timeout=20)
            done = engine.chat([{"role": "user", "content": "hi"}], GenerationSettings(), None).result(timeout=20)
            shown = [engine.url, engine.base, info.name, info.target_path]
        finally:
            engine.close()
    assert done.error is None and done.text == "Hi"
    assert all(SECRET not in s and "user:" not in s for s in shown), shown


def test_06_url_credentials_never_reach_an_error_message(capsys):
    from serve_process import free_port

    url = f"http://user:{SECRET}@127.0.0.1:{free_port()}"
    rc, lines, err = generate(capsys, "--connect", url, "--prompt", "hi")
    assert rc == 1 and "cannot reach" in lines[-1]["error"]
    assert SECRET not in json.dumps(lines) + err
    rc, lines, err = generate(capsys, "--connect", "ftp://user:" + SECRET + "@x", "--prompt", "hi")
    assert rc == 1 and SECRET not in json.dumps(lines) + err


def test_06_url_credentials_and_an_api_key_are_refused_together(capsys, monkeypatch):
    monkeypatch.setenv("GEMMA_CHAT_API_KEY", "k")
    with BackgroundServer(basic_auth_app()) as url:
        with_creds = url.replace("http://", f"http://user:{SECRET}@")
        rc, lines, err = generate(capsys, "--connect", with_creds, "--prompt", "hi")
    assert rc == 1 and "API key" in lines[-1]["error"] and SECRET not in json.dumps(lines) + err


@pytest.mark.anyio
async def test_06_url_credentials_are_not_stored_in_the_history_or_exports(tmp_path, monkeypatch):
    from pilot import ready, until

    from app.tui.app import GemmaChatApp
    from app.tui.history import HistoryRecorder

    monkeypatch.setenv("GEMMA_CHAT_DATA_DIR", str(tmp_path / "data"))
    with BackgroundServer(basic_auth_app()) as url:
        remote = RemoteEngine(url.replace("http://", f"http://user:{SECRET}@"))
        # the spec `gemma-chat --connect URL` opens (app/commands/tui.py)
        spec = PairingSpec(name=f"server at {remote.base}", target=remote.url, drafter=None)
        history = HistoryRecorder(export_dir=tmp_path / "exports")
        app = GemmaChatApp(remote, spec, history=history)
        async with app.run_test(size=(110, 34)) as pilot:
            await ready(pilot, app)
            app.chat.prompt.text = "hello"
            await pilot.press("enter")
            await until(pilot, lambda: app.chat.last_reply is not None, timeout=15)
            await pilot.press("ctrl+s")
            await until(pilot, lambda: any((tmp_path / "exports").glob("*.md")), timeout=15)
            await app.action_quit()
        history.close()
    db = tmp_path / "data" / "history.sqlite3"
    rows = sqlite3.connect(db).execute("select * from chats").fetchall()
    assert rows and SECRET not in repr(rows)
    assert all(SECRET not in p.read_text() for p in (tmp_path / "exports").glob("*.md"))


# --- 7. the API key on the command line ------------------------------------------------------------------
def test_07_api_key_flag_warns_about_the_process_list(capsys):
    from serve_process import free_port

    rc, lines, err = generate(capsys, "--connect", f"http://127.0.0.1:{free_port()}", "--api-key", "k", "--prompt", "x")
    assert "GEMMA_CHAT_API_KEY" in err and "process" in err
    assert main(["serve", "--demo", "--api-key", "k", "--port", "70000"]) == 2  # refused after the warning
    assert "GEMMA_CHAT_API_KEY" in capsys.readouterr().err


def test_07_api_key_file_is_read_and_must_be_a_file(capsys, tmp_path):
    from support.fake_engine import FakeEngine
    from support.fake_engine import PairingSpec as FakeSpec

    from core.frontends.server import ServerConfig, create_app

    key_file = tmp_path / "key"
    key_file.write_text("k3y\n")
    engine = FakeEngine()
    engine.load(FakeSpec("fake", "t", "d"), lambda e: None).result(timeout=5)
    try:
        with BackgroundServer(create_app(engine, ServerConfig("m", api_key="k3y"))) as url:
            rc, lines, err = generate(capsys, "--connect", url, "--api-key-file", str(key_file), "--prompt", "hi")
            assert rc == 0 and "stats" in lines[-1], (lines, err)
            os.mkfifo(tmp_path / "fifo")
            rc, lines, err = generate(
                capsys, "--connect", url, "--api-key-file", str(tmp_path / "fifo"), "--prompt", "x"
            )
            assert rc == 1 and "not a regular file" in lines[-1]["error"]
    finally:
        engine.close()


def test_07_readme_recommends_the_environment_not_the_flag():
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert '--api-key "$KEY"' not in readme and "GEMMA_CHAT_API_KEY" in readme


def test_07_exports_are_private(tmp_path):
    from core.user.export import export_chat
    from core.user.store import Store

    store = Store(tmp_path / "h.sqlite3")
    chat_id = store.create_chat(title="private")
    store.append_user_message(chat_id, "a secret")
    path = export_chat(store.load_chat(chat_id), tmp_path / "new-folder")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
