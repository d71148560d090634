"""`gemma-chat serve`: an OpenAI-compatible HTTP API over one engine (Starlette on uvicorn).

Routes: GET /health, GET /v1/models, POST /v1/chat/completions (server-sent events or one JSON body),
POST /v1/gemma-chat/control (block size / drafter for the running turn). Errors are OpenAI-shaped:
{"error": {"message", "type", "param", "code"}}.

One engine, one turn at a time, in arrival order: an asyncio lock (FIFO) guards the engine, so the
engine's `cancel()` only ever reaches the turn of the client that went away. At most `max_waiting`
requests wait behind the running one; the next gets 429 at once. A client that disconnects, while
waiting or while its turn runs, cancels its turn (the engine stops within one round).

The stream is standard `chat.completion.chunk` objects plus a "gemma_chat" object per chunk:
  {"tokens": [{"id", "text", "from_draft", "round"}], "rounds": [RoundEvent fields], "prefill": {...}}
(a round's summary may ride on the chunk of the next round's tokens: order events by round)
and on the last chunk (finish_reason set) "usage" and {"stats": TurnStats.as_dict()}. OpenAI clients
ignore the extension; `core.engine.remote.RemoteEngine` rebuilds the engine's events from it.

The HTTP status is decided after the engine's first event (prompt prefilled, or the turn refused),
so a prompt that is too long or an unreadable image is a 400, not an error inside a 200 stream.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import dataclasses
import hmac
import ipaddress
import json
import threading
import time
import uuid
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlparse

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from core.events import PrefillDone, RoundEvent, TokenEvent, TurnDone
from core.settings import GenerationSettings

EXTENSION = "gemma_chat"  # the key of gemma-chat's own object in chunks and responses
DEFAULT_MAX_TOKENS = 2048
MAX_STOPS = 4
FINISH_REASONS = {"eos": "stop", "stop": "stop", "max_tokens": "length", "cancelled": "stop"}


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass
class ServerConfig:
    model_id: str
    api_key: str | None = None
    max_waiting: int = 4  # requests queued behind the running one; the next gets 429
    allow_file_urls: bool = True  # file:// image URLs read the server's disk: loopback only by default
    max_tokens: int = DEFAULT_MAX_TOKENS  # when a request does not say


class ApiError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param = status, message, type_, param

    def response(self) -> JSONResponse:
        return error_response(self.status, self.message, self.type, self.param)


def error_response(status: int, message: str, type_: str, param: str | None = None, headers=None) -> JSONResponse:
    body = {"error": {"message": message, "type": type_, "param": param, "code": status}}
    return JSONResponse(body, status_code=status, headers=headers)


# -- request parsing ---------------------------------------------------------------------------------


@dataclass
class ChatRequest:
    messages: list[dict]
    settings: GenerationSettings
    stream: bool
    stops: list[str]


def _number(body: dict, key: str, kind, default):
    value = body.get(key)
    if value is None:
        return default
    wrong_type = isinstance(value, bool) or not isinstance(value, (int, float))
    if wrong_type or (kind is int and not float(value).is_integer()):
        raise ApiError(400, f"'{key}' must be {'an integer' if kind is int else 'a number'}, got {value!r}", param=key)
    return kind(value)


def _image_item(part: dict, allow_files: bool) -> dict:
    spec = part.get("image_url")
    url = spec.get("url") if isinstance(spec, dict) else spec
    if not isinstance(url, str) or not url:
        raise ApiError(400, "an image_url part needs image_url.url (a data: or file: URL)", param="messages")
    if url.startswith("data:"):
        header, _, payload = url.partition(",")
        if ";base64" not in header:
            raise ApiError(400, "image data URLs must be base64 (data:image/png;base64,...)", param="messages")
        try:
            data = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise ApiError(400, "the image data URL is not valid base64", param="messages") from None
        return {"type": "image", "image": data}
    if url.startswith("file:"):
        if not allow_files:
            raise ApiError(400, "file: image URLs are refused on a server reachable from the network", param="messages")
        return {"type": "image", "path": unquote(urlparse(url).path)}
    raise ApiError(400, "image URLs must be data: or file: URLs (this server does not download)", param="messages")


def parse_messages(raw, allow_files: bool) -> list[dict]:
    if not isinstance(raw, list) or not raw:
        raise ApiError(400, "'messages' must be a non-empty list of {role, content}", param="messages")
    out = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict) or m.get("role") not in ("system", "developer", "user", "assistant"):
            role = m.get("role") if isinstance(m, dict) else None
            message = f"messages[{i}]: role must be system, user or assistant, got {role!r}"
            raise ApiError(400, message, param="messages")
        role = "system" if m["role"] == "developer" else m["role"]
        content = m.get("content")
        if content is None:
            content = ""
        if isinstance(content, list):
            parts = []
            for part in content:
                kind = part.get("type") if isinstance(part, dict) else None
                if kind == "text" and isinstance(part.get("text"), str):
                    parts.append({"type": "text", "text": part["text"]})
                elif kind == "image_url":
                    parts.append(_image_item(part, allow_files))
                else:
                    raise ApiError(400, f"messages[{i}]: content parts must be text or image_url, got {kind!r}")
            content = parts
        elif not isinstance(content, str):
            raise ApiError(400, f"messages[{i}]: content must be a string or a list of parts", param="messages")
        out.append({"role": role, "content": content})
    return out


def parse_chat_request(body, config: ServerConfig) -> ChatRequest:
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    messages = parse_messages(body.get("messages"), config.allow_file_urls)
    if _number(body, "n", int, 1) != 1:
        raise ApiError(400, "only n=1 is supported", param="n")
    stop = body.get("stop")
    stops = [stop] if isinstance(stop, str) else stop or []
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) or len(stops) > MAX_STOPS:
        raise ApiError(400, f"'stop' must be a string or a list of up to {MAX_STOPS} non-empty strings", param="stop")
    block = body.get("block_size", "auto")
    if block != "auto" and (isinstance(block, bool) or not isinstance(block, int)):
        raise ApiError(400, "'block_size' must be an integer 1..16 or 'auto'", param="block_size")
    kwargs = body.get("chat_template_kwargs") or {}
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    settings = GenerationSettings(
        max_tokens=_number({"max_tokens": max_tokens}, "max_tokens", int, config.max_tokens),
        temperature=_number(body, "temperature", float, 0.0),
        top_p=_number(body, "top_p", float, 1.0),
        top_k=_number(body, "top_k", int, 0),
        seed=_number(body, "seed", int, None),
        block_size=block,
        drafter_enabled=bool(body.get("drafter", True)),
        ignore_eos=bool(body.get("ignore_eos", False)),
        thinking=bool(isinstance(kwargs, dict) and kwargs.get("enable_thinking")),
        image_budget=_number(body, "image_budget", int, None),
    )
    try:
        settings.validate()
    except ValueError as e:
        raise ApiError(400, str(e)) from None
    return ChatRequest(messages, settings, bool(body.get("stream", False)), stops)


# -- stop strings ------------------------------------------------------------------------------------


class StopScanner:
    """Holds back tokens while their text could still begin a stop string, so a client never sees
    a stop string (or its start). `feed` returns the tokens that are safe to send, each maybe cut."""

    def __init__(self, stops: list[str]) -> None:
        self.stops = stops
        self.text = ""  # everything generated so far
        self.sent = 0  # chars of `text` released
        self.pending: list[TokenEvent] = []
        self.stopped = False

    def feed(self, tokens: list[TokenEvent]) -> list[TokenEvent]:
        if not self.stops:
            return tokens
        if self.stopped:
            return []
        self.pending.extend(tokens)
        self.text += "".join(t.text for t in tokens)
        longest = max(len(s) for s in self.stops)
        start = max(0, self.sent - longest + 1)
        hits = [i for i in (self.text.find(s, start) for s in self.stops) if i >= 0]
        if hits:
            self.stopped = True
            return self._release(min(hits), cut=True)
        hold = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(self.text)), hold, -1):
                if self.text.endswith(s[:k]):
                    hold = k
                    break
        return self._release(len(self.text) - hold, cut=False)

    def _release(self, end: int, cut: bool) -> list[TokenEvent]:
        out = []
        pos = self.sent
        while self.pending:
            tok = self.pending[0]
            if pos + len(tok.text) <= end:
                out.append(self.pending.pop(0))
                pos += len(tok.text)
            elif cut and pos < end:
                out.append(dataclasses.replace(tok, text=tok.text[: end - pos]))
                pos = end
                break
            else:
                break
        self.sent = pos
        return out

    def flush(self) -> list[TokenEvent]:
        """End of the turn without a stop: what was held back is text after all."""
        if self.stopped:
            return []
        out, self.pending = self.pending, []
        return out


# -- the engine, one turn at a time ------------------------------------------------------------------


class Busy(Exception):
    pass


class EngineGate:
    """Serialises turns on the engine (FIFO) with a bounded wait line."""

    def __init__(self, engine, max_waiting: int) -> None:
        self.engine = engine
        self.max_waiting = max_waiting
        self.waiting = 0
        self.running = False
        self._lock = asyncio.Lock()  # asyncio.Lock wakes waiters in arrival order

    async def turn(self, messages: list[dict], settings: GenerationSettings) -> AsyncGenerator[list, None]:
        """The turn's engine events, in batches of what arrived together. Closing the iterator early
        (client gone) cancels the turn and waits for the engine to finish it before the next starts."""
        if self._lock.locked() and self.waiting >= self.max_waiting:
            raise Busy()
        self.waiting += 1
        try:
            await self._lock.acquire()
        finally:
            self.waiting -= 1
        self.running = True
        try:
            loop = asyncio.get_running_loop()
            events: asyncio.Queue = asyncio.Queue()

            def on_event(ev) -> None:  # engine thread
                with contextlib.suppress(RuntimeError):  # the loop is closed: the server has stopped
                    loop.call_soon_threadsafe(events.put_nowait, ev)

            future = self.engine.chat(messages, settings, on_event)
            finished = False
            try:
                while not finished:
                    batch = [await events.get()]
                    while not events.empty():  # what arrived together leaves together (one SSE chunk)
                        batch.append(events.get_nowait())
                    finished = isinstance(batch[-1], TurnDone)
                    yield batch
            finally:
                if not finished:
                    self.engine.cancel()
                    with contextlib.suppress(Exception):
                        await asyncio.shield(asyncio.wrap_future(future))
        finally:
            self.running = False
            self._lock.release()


# -- responses ---------------------------------------------------------------------------------------


def _token_json(t: TokenEvent) -> dict:
    return {"id": t.id, "text": t.text, "from_draft": t.from_draft, "round": t.round}


def _usage(done: TurnDone, completion_tokens: int) -> dict:
    prompt = done.stats.prompt_tokens
    return {"prompt_tokens": prompt, "completion_tokens": completion_tokens, "total_tokens": prompt + completion_tokens}


def _finish_reason(done: TurnDone, stopped: bool) -> str:
    return "stop" if stopped else FINISH_REASONS.get(done.stats.stop_reason, "stop")


class _Disconnected(Exception):
    pass


async def _no_receive() -> dict[str, Any]:
    """The `receive` handed to a response sent after the request body was read (it never reads)."""
    return {"type": "http.disconnect"}


async def _until_disconnect(receive, work):
    """Run `work` (a coroutine) and cancel it if the client disconnects first."""
    task = asyncio.ensure_future(work)

    async def watch() -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return

    watcher = asyncio.ensure_future(watch())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # the server is shutting down: stop the work (and its turn) first
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        raise
    finally:
        watcher.cancel()
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        raise _Disconnected()
    return task.result()


class ChatCompletion(Response):
    """The ASGI response of one /v1/chat/completions request (streamed or not)."""

    def __init__(self, gate: EngineGate, request: ChatRequest, model_id: str) -> None:
        self.gate, self.request, self.model_id = gate, request, model_id
        self.id = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        self.streaming = False  # the 200 and its headers are out
        self.created = int(time.time())
        self.background = None

    async def __call__(self, scope, receive, send) -> None:
        self.scope = scope
        events = self.gate.turn(self.request.messages, self.request.settings)
        try:
            await _until_disconnect(receive, self._respond(events, send))
        except _Disconnected:
            pass
        except asyncio.CancelledError:  # the server is stopping (Ctrl+C): end the stream cleanly
            if self.streaming:
                with contextlib.suppress(Exception):
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await events.aclose()  # cancels the engine turn if it is still running

    async def _first(self, events) -> list:
        """Wait for the turn to start (PrefillDone) or to be refused (TurnDone)."""
        try:
            return await events.__anext__()
        except Busy:
            raise ApiError(429, "the server is busy: too many requests waiting; retry later", "server_busy") from None

    async def _respond(self, events, send) -> None:
        try:
            head = await self._first(events)
        except ApiError as e:
            await e.response()(self.scope, _no_receive, send)
            return
        done = next((ev for ev in head if isinstance(ev, TurnDone)), None)
        if done is not None and done.error:
            await error_response(400, done.error, "invalid_request_error")(self.scope, _no_receive, send)
            return
        if self.request.stream:
            await self._stream(head, events, send)
        else:
            await self._whole(head, events, send)

    def _chunk(self, delta: dict, ext: dict | None = None, finish: str | None = None, usage=None) -> bytes:
        chunk = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model_id,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
        if usage is not None:
            chunk["usage"] = usage
        if ext:
            chunk[EXTENSION] = ext
        return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"

    async def _stream(self, head: list, events, send) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"text/event-stream; charset=utf-8"),
                    (b"cache-control", b"no-cache"),
                    (b"x-accel-buffering", b"no"),
                ],
            }
        )
        self.streaming = True

        async def write(data: bytes) -> None:
            await send({"type": "http.response.body", "body": data, "more_body": True})

        await write(self._chunk({"role": "assistant", "content": ""}))
        scanner = StopScanner(self.request.stops)
        streamed = []  # tokens sent
        held_rounds: list[dict] = []
        cancelled = False
        queue = list(head)
        done: TurnDone | None = None
        it = events.__aiter__()
        while done is None:
            if not queue:
                queue.extend(await it.__anext__())
            tokens: list[TokenEvent] = []
            ext: dict[str, Any] = {}
            for ev in queue:  # everything that arrived together goes out as one chunk
                if isinstance(ev, TokenEvent):
                    tokens.append(ev)
                elif isinstance(ev, RoundEvent):
                    held_rounds.append(dataclasses.asdict(ev))
                elif isinstance(ev, PrefillDone):
                    ext["prefill"] = dataclasses.asdict(ev)
                elif isinstance(ev, TurnDone):
                    done = ev
            queue.clear()
            tokens = scanner.feed(tokens)
            if done is not None:
                tokens += scanner.flush()
            if tokens:
                ext["tokens"] = [_token_json(t) for t in tokens]
                streamed.extend(tokens)
            # A round's summary comes just after its tokens, often a wake-up later: it rides on the
            # next chunk rather than costing one of its own.
            if held_rounds and (ext or done is not None):
                ext["rounds"], held_rounds = held_rounds, []
            if ext:
                await write(self._chunk({"content": "".join(t.text for t in tokens)} if tokens else {}, ext))
            if scanner.stopped and done is None and not cancelled:
                self.gate.engine.cancel()  # the client has all it asked for; the turn ends within a round
                cancelled = True
        if done.error:
            err = {"error": {"message": done.error, "type": "server_error", "param": None, "code": 500}}
            await write(b"data: " + json.dumps(err).encode() + b"\n\n")
        else:
            text = "".join(t.text for t in streamed)
            tail = ""
            if not scanner.stops and done.text.startswith(text) and len(done.text) > len(text):
                tail = done.text[len(text) :]  # bytes the detokenizer held back until the end
            stats = done.stats.as_dict()
            await write(
                self._chunk(
                    {"content": tail} if tail else {},
                    {"stats": stats},
                    finish=_finish_reason(done, scanner.stopped),
                    usage=_usage(done, len(streamed) if scanner.stopped else len(done.token_ids)),
                )
            )
        await write(b"data: [DONE]\n\n")
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _whole(self, head: list, events, send) -> None:
        scanner = StopScanner(self.request.stops)
        tokens: list[TokenEvent] = []
        pending = list(head)
        done: TurnDone | None = None
        cancelled = False
        it = events.__aiter__()
        while done is None:
            if not pending:
                pending.extend(await it.__anext__())
            ev = pending.pop(0)
            if isinstance(ev, TokenEvent):
                tokens += scanner.feed([ev])
                if scanner.stopped and not cancelled:
                    self.gate.engine.cancel()  # the turn ends within a round; its TurnDone still comes
                    cancelled = True
            elif isinstance(ev, TurnDone):
                done = ev
                tokens += scanner.flush()
        if done.error:
            await error_response(500, done.error, "server_error")(self.scope, _no_receive, send)
            return
        text = "".join(t.text for t in tokens)
        if not scanner.stops and done.text.startswith(text):
            text = done.text
        body = {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model_id,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "logprobs": None,
                    "finish_reason": _finish_reason(done, scanner.stopped),
                }
            ],
            "usage": _usage(done, len(tokens) if scanner.stopped else len(done.token_ids)),
            EXTENSION: {"stats": done.stats.as_dict(), "tokens": [_token_json(t) for t in tokens]},
        }
        await JSONResponse(body)(self.scope, _no_receive, send)


# -- the application ---------------------------------------------------------------------------------


def create_app(engine, config: ServerConfig) -> Starlette:
    """The ASGI app over a loaded engine (an Engine or anything with its chat/cancel API)."""
    gate = EngineGate(engine, config.max_waiting)
    created = int(time.time())

    def authorised(request: Request) -> bool:
        if not config.api_key:
            return True
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), config.api_key.encode())

    def unauthorised() -> JSONResponse:
        return error_response(401, "missing or wrong API key (send 'Authorization: Bearer KEY')", "invalid_api_key")

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "model": config.model_id, "busy": gate.running, "waiting": gate.waiting})

    def model_card() -> dict:
        info = engine.info
        ext = {"controls": True, "token_origin": True}
        if info is not None:
            ext.update(
                pairing=info.name,
                drafter=info.drafter_path is not None,
                demo=info.demo,
                has_vision=info.has_vision,
                context_length=info.context_length,
                dtype=info.dtype,
                supports_thinking=info.supports_thinking,
            )
        return {"id": config.model_id, "object": "model", "created": created, "owned_by": "gemma-chat", EXTENSION: ext}

    async def models(request: Request) -> Response:
        if not authorised(request):
            return unauthorised()
        return JSONResponse({"object": "list", "data": [model_card()]})

    async def chat_completions(request: Request) -> Response:
        if not authorised(request):
            return unauthorised()
        try:
            body = json.loads(await request.body())
        except ValueError:
            return error_response(400, "the request body is not valid JSON", "invalid_request_error")
        try:
            parsed = parse_chat_request(body, config)
        except ApiError as e:
            return e.response()
        if gate.running and gate.waiting >= gate.max_waiting:
            message = "the server is busy: too many requests waiting; retry later"
            return error_response(429, message, "server_busy", None, {"retry-after": "1"})
        return ChatCompletion(gate, parsed, config.model_id)

    async def control(request: Request) -> Response:
        if not authorised(request):
            return unauthorised()
        try:
            body = json.loads(await request.body())
            if not isinstance(body, dict):
                raise ValueError
        except ValueError:
            return error_response(400, "the request body must be a JSON object", "invalid_request_error")
        try:
            if "block_size" in body:
                engine.set_block_size(body["block_size"])
            if "drafter_enabled" in body:
                engine.set_drafter_enabled(bool(body["drafter_enabled"]))
        except ValueError as e:
            return error_response(400, str(e), "invalid_request_error", "block_size")
        return JSONResponse({"ok": True, "running": gate.running})

    async def not_found(request: Request, exc) -> Response:
        return error_response(404, f"no route {request.method} {request.url.path}", "not_found")

    async def method_not_allowed(request: Request, exc) -> Response:
        return error_response(405, f"{request.method} is not allowed on {request.url.path}", "invalid_request_error")

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/gemma-chat/control", control, methods=["POST"]),
    ]
    app = Starlette(routes=routes, exception_handlers={404: not_found, 405: method_not_allowed})
    app.state.gate = gate
    return app


class BackgroundServer:
    """uvicorn on a daemon thread (tests, benchmarks): `with BackgroundServer(app) as url: ...`.
    Port 0 picks a free port; `url` is the base URL, e.g. http://127.0.0.1:53123."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0) -> None:
        import socket

        import uvicorn

        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, port))
        self.url = f"http://{host}:{self._socket.getsockname()[1]}"
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
        self.server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    def __enter__(self) -> str:
        import threading

        thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self._socket]}, name="gemma-chat-serve", daemon=True
        )
        self._thread = thread
        thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError("the server did not start")
            time.sleep(0.01)
        return self.url

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._socket.close()
