"""`RemoteEngine`: the engine's public API over an OpenAI-compatible server (`--connect URL`).

The chat screen, its history and panels, and `generate` use it exactly like `core.engine.local.Engine`:
`load`/`chat` return futures, events arrive through `on_event` on the remote engine's own thread
(one asyncio loop on a daemon thread, so `cancel` can interrupt a request at any await, including
while the server has not answered yet), turns run one at a time in submission order.

What the events carry depends on the server (found out by `load` from GET /v1/models):
  gemma-chat   the stream's "gemma_chat" extension: token ids, per-token origin and round, round
               summaries, prefill and the engine's own TurnStats. Same events as a local engine.
  vllm         text deltas only: tokens get `from_draft=None` (origin unknown) and `id=-1`. The
               speculative figures come from vLLM's Prometheus /metrics counters (accepted, drafted
               tokens and drafts), polled during the turn and turned into round events: the
               acceptance and tokens/round are exact over the turn, the per-round spread is the
               average of each poll interval. The counters are server-wide: other users' requests
               running at the same time are counted too. A vLLM started with
               `--per-request-spec-decode-metrics summary|detailed` also sends the reply's own counts
               (`metrics.speculative_decoding` on the last chunk): the turn's figures are then those,
               every round exact with `detailed`, and later turns stop polling /metrics.
  llama.cpp    llama.cpp's server (`owned_by: "llamacpp"`): text deltas; its `timings` object (on the
               last chunk) gives the reply's own `draft_n` / `draft_n_accepted`. It does not count its
               drafting steps: the rounds are its decode steps (tokens after the first, less the
               accepted drafts), the drafts spread over them.
  openai       any other OpenAI-compatible server: text deltas, no speculative figures.
Block size and drafter switches reach the running turn only on a gemma-chat server
(`live_controls`); vLLM fixes num_speculative_tokens at launch.

Tools go to every server in OpenAI's shape (`tools`, `tool_choice`) and come back as OpenAI `tool_calls`
(streamed deltas, or a whole `message.tool_calls` from a server that answers a stream request with one
JSON completion). A server that refuses a request for its tools (vLLM started without
--enable-auto-tool-choice, llama.cpp without --jinja) gets the turn again without them, once: the
turn's Notice says so, and `features.tools` is off for that server from then on.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import json
import math
import mimetypes
import re
import threading
import time
import types
from collections.abc import AsyncGenerator, Callable, Coroutine
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Union, cast, get_args, get_origin, get_type_hints
from urllib.parse import unquote, urlparse

from core.engine.contract import EngineError, EngineFeatures, PairingInfo
from core.events import (
    LoadProgress,
    Notice,
    PrefillDone,
    PrefillStarted,
    RoundEvent,
    TokenEvent,
    ToolCall,
    ToolCallDelta,
    ToolCallError,
    ToolCallStarted,
    TurnDone,
    TurnStats,
)
from core.settings import GenerationSettings

EXTENSION = "gemma_chat"
SPEC_COUNTERS = {
    "drafts": "vllm:spec_decode_num_drafts",
    "drafted": "vllm:spec_decode_num_draft_tokens",
    "accepted": "vllm:spec_decode_num_accepted_tokens",
}
_METRIC_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
# What the client reads from a server before it gives up on it as not a chat server: one event-stream
# line (a chunk of a few tokens is a few hundred bytes) and one JSON answer (a model list, an error).
MAX_LINE_BYTES = 4 << 20
MAX_BODY_BYTES = 8 << 20
# Once the reply is complete (finish_reason, or every token asked for), what a server that keeps the
# connection open without "[DONE]" gets to send the usage chunk that may follow.
FINISH_GRACE_S = 5.0


class RemoteError(EngineError):
    """The server cannot be reached, refused the request or answered something unreadable."""


class Refused(RemoteError):
    """The server answered the request with an HTTP error status (its message in the text)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class ServerURL:
    """A --connect URL taken apart: `base` (scheme, host, port, path without /v1) and `shown` (the URL as
    given) carry no user name or password, so neither can reach a message, the screen or the history;
    `credentials` are sent as HTTP Basic auth."""

    base: str
    shown: str
    credentials: tuple[str, str] | None


def parse_server_url(url: str) -> ServerURL:
    parsed = urlparse(url if "://" in url else f"http://{url}")
    userinfo, at, hostport = parsed.netloc.rpartition("@")
    shown_netloc = hostport if at else parsed.netloc
    shown = parsed._replace(netloc=shown_netloc).geturl()
    example = "an http(s) URL such as http://127.0.0.1:8000"
    if parsed.scheme not in ("http", "https") or not hostport:
        raise RemoteError(f"--connect needs {example}, got {shown!r}")
    try:
        port = parsed.port
        host = parsed.hostname
    except ValueError:  # ":99999", ":abc", "::::"
        raise RemoteError(f"--connect URL {shown!r}: the port must be a number from 1 to 65535") from None
    if not host or port == 0:
        raise RemoteError(f"--connect needs {example}, got {shown!r}")
    path = parsed.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[:-3]
    credentials = None
    if at:
        user, _, password = userinfo.partition(":")
        credentials = (unquote(user), unquote(password))
    return ServerURL(f"{parsed.scheme}://{shown_netloc}{path}", shown, credentials)


def parse_spec_metrics(text: str) -> dict[str, float] | None:
    """vLLM's speculative-decoding counters from a Prometheus text page, summed over label sets
    (one per engine / model); None when the page has none (no speculative decoding configured)."""
    totals: dict[str, float] = {}
    wanted = {f"{name}_total": key for key, name in SPEC_COUNTERS.items()}
    wanted.update({name: key for key, name in SPEC_COUNTERS.items()})
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _METRIC_LINE.match(line)
        if not m or m.group(1) not in wanted:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        key = wanted[m.group(1)]
        totals[key] = totals.get(key, 0.0) + value
    if not totals:
        return None
    return {key: totals.get(key, 0.0) for key in SPEC_COUNTERS}


def split_rounds(drafts: int, drafted: int, accepted: int, first_round: int) -> list[RoundEvent]:
    """`drafts` rounds that together drafted `drafted` and accepted `accepted` tokens, spread evenly."""
    out = []
    for i in range(drafts):
        d = drafted // drafts + (1 if i < drafted % drafts else 0)
        a = min(d, accepted // drafts + (1 if i < accepted % drafts else 0))
        out.append(RoundEvent(first_round + i, d, a, d + 1, False, a + 1))
    return out


@dataclass(frozen=True)
class ReplySpec:
    """One reply's own speculative figures, as a server reported them (vLLM's per-request metrics,
    llama.cpp's timings); `steps` per round (drafted, accepted) when the server lists them."""

    drafted: int
    accepted: int
    rounds: int | None = None  # None: not reported (llama.cpp)
    steps: tuple[tuple[int, int], ...] = ()

    def round_events(self, tokens: int, first_round: int = 0) -> list[RoundEvent]:
        """The reply's rounds: listed, or `rounds` (else the decode steps of a `tokens` reply) spread evenly."""
        if self.steps:
            return [RoundEvent(first_round + i, d, a, d + 1, False, a + 1) for i, (d, a) in enumerate(self.steps)]
        rounds = self.rounds if self.rounds is not None else tokens - 1 - self.accepted
        if self.drafted <= 0:
            return []
        return split_rounds(max(1, min(rounds, self.drafted)), self.drafted, self.accepted, first_round)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def reply_spec(chunk: dict) -> ReplySpec | None:
    """A response or chunk's own speculative counts: vLLM's `metrics.speculative_decoding`
    (num_spec_steps, num_draft_tokens, num_accepted_draft_tokens, and with `detailed` per_step_drafted /
    per_step_accepted) or llama.cpp's `timings` (draft_n, draft_n_accepted); None when it has neither."""
    metrics = chunk.get("metrics")
    spec = metrics.get("speculative_decoding") if isinstance(metrics, dict) else None
    if isinstance(spec, dict):
        drafted, accepted = _int(spec.get("num_draft_tokens")), _int(spec.get("num_accepted_draft_tokens"))
        if drafted is None or accepted is None or accepted > drafted:
            return None
        per_d, per_a = spec.get("per_step_drafted"), spec.get("per_step_accepted")
        steps: tuple[tuple[int, int], ...] = ()
        if isinstance(per_d, list) and isinstance(per_a, list) and len(per_d) == len(per_a):
            pairs = [(_int(d), _int(a)) for d, a in zip(per_d, per_a)]
            if all(d is not None and a is not None and a <= d for d, a in pairs):
                steps = tuple((cast(int, d), cast(int, a)) for d, a in pairs)
        return ReplySpec(drafted, accepted, _int(spec.get("num_spec_steps")), steps)
    timings = chunk.get("timings")
    if isinstance(timings, dict) and "draft_n" in timings:
        drafted, accepted = _int(timings.get("draft_n")), _int(timings.get("draft_n_accepted"))
        if drafted is not None and accepted is not None and accepted <= drafted:
            return ReplySpec(drafted, accepted)
    return None


def image_data_url(item: dict) -> str:
    """An engine image item ({"type": "image", "path" | "image"}) as a base64 data URL."""
    data = item.get("image")
    mime = "image/png"
    if not isinstance(data, (bytes, bytearray)):
        source = item.get("path") or item.get("url") or data
        path = Path(str(source)).expanduser()
        try:
            data = path.read_bytes()
        except OSError as e:
            raise RemoteError(f"cannot read image {path}: {e.strerror or e}") from e
        mime = mimetypes.guess_type(path.name)[0] or mime
    return f"data:{mime};base64,{base64.b64encode(bytes(data)).decode()}"


# OpenAI's input_audio.format names, by file suffix; gemma-chat's and vLLM's servers decode any of them
AUDIO_FORMATS = {".wav": "wav", ".wave": "wav", ".mp3": "mp3", ".flac": "flac", ".ogg": "ogg", ".oga": "ogg"}
AUDIO_FORMATS |= {".opus": "opus", ".aif": "aiff", ".aiff": "aiff"}


def input_audio_part(item: dict) -> dict:
    """An engine audio item ({"type": "audio", "path" | "audio": bytes}) as OpenAI's input_audio part:
    the file's own bytes, base64, with the format its name says (raw samples are not sent)."""
    data = item.get("audio")
    fmt = "wav"
    if not isinstance(data, (bytes, bytearray)):
        source = item.get("path") or item.get("url") or data
        if not isinstance(source, str):
            raise RemoteError("an audio clip for a server must be a file or its bytes (not raw samples)")
        path = Path(source.removeprefix("file://")).expanduser()
        try:
            data = path.read_bytes()
        except OSError as e:
            raise RemoteError(f"cannot read audio file {path}: {e.strerror or e}") from e
        fmt = AUDIO_FORMATS.get(path.suffix.lower(), fmt)
    return {"type": "input_audio", "input_audio": {"data": base64.b64encode(bytes(data)).decode(), "format": fmt}}


def openai_messages(messages: list[dict], system_prompt: str | None) -> list[dict]:
    out = []
    if system_prompt and not (messages and messages[0].get("role") == "system"):
        out.append({"role": "system", "content": system_prompt})
    for m in messages:
        content = m.get("content", "")
        if isinstance(content, list):
            parts = []
            for item in content:
                if not isinstance(item, dict):
                    continue
                if item.get("type") == "text":
                    parts.append({"type": "text", "text": item.get("text", "")})
                elif item.get("type") == "image":
                    parts.append({"type": "image_url", "image_url": {"url": image_data_url(item)}})
                elif item.get("type") == "audio":
                    parts.append(input_audio_part(item))
            content = parts
        message = {"role": m.get("role", "user"), "content": content}
        for key in ("tool_calls", "tool_call_id", "name"):  # OpenAI's tool use, passed on as it is
            if m.get(key) is not None:
                message[key] = m[key]
        out.append(message)
    return out


@dataclass
class _Job:
    cancellable: bool = True  # chat turns; a load is not cut short by the Stop key
    cancelled: bool = False
    task: asyncio.Task | None = None


class RemoteEngine:
    """Engine API over HTTP. `url` is the server's base (with or without /v1)."""

    prefilling: PrefillStarted | None = None  # a server does not report its prefill's progress

    def __init__(
        self,
        url: str,
        api_key: str | None = None,
        *,
        model: str | None = None,
        timeout_s: float = 120.0,
        metrics_poll_s: float = 1.0,
    ) -> None:
        server = parse_server_url(url)
        if server.credentials is not None and api_key:
            raise RemoteError(
                f"the --connect URL carries a user name and password and an API key is given too: both would "
                f"be the request's Authorization header; keep one (the URL's are sent as HTTP Basic auth): "
                f"{server.shown}"
            )
        self.base = server.base
        self.url = server.shown  # what the screen, the history and messages show: no credentials
        self._credentials = server.credentials
        self.api_key = api_key
        self.model = model
        self.timeout_s = timeout_s
        self.metrics_poll_s = metrics_poll_s
        self.kind: str | None = None  # "gemma-chat" | "vllm" | "llama.cpp" | "openai", after load
        self._reply_spec = False  # the vLLM server reports each reply's own counts: no /metrics polling
        self.model_id: str | None = None
        self._info: PairingInfo | None = None
        self._tools = False  # the server takes `tools` (gemma-chat serve says so in its model card)
        self._jobs: list[_Job] = []
        self._block: int | str | None = None  # the user's latest choice, for the next turns
        self._drafter: bool | None = None
        self._closed = False
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run_loop, name="gemma-chat-remote", daemon=True)
        self._thread.start()
        self._ready.wait()

    # -- what the screen asks about the server ------------------------------------------------------
    @property
    def info(self) -> PairingInfo | None:
        return self._info

    @property
    def features(self) -> EngineFeatures:
        """gemma-chat's server says where every token came from and takes live controls; others do not
        (vLLM fixes the drafts per round at launch). No server switches pairings from here."""
        ours = self.kind == "gemma-chat"
        if ours:
            note = ""
        elif self.kind == "vllm":
            note = "vLLM fixes the number of drafts per round at launch (--speculative-config num_speculative_tokens)"
        elif self.kind == "llama.cpp":
            note = "llama.cpp's server fixes its drafting at launch (--draft-max, --draft-min)"
        else:
            note = "this server does not take block size or drafter changes"
        images = self._info is not None and self._info.has_vision
        audio = self._info is not None and self._info.has_audio
        return EngineFeatures(
            live_controls=ours,
            controls_note=note,
            token_origins=ours,
            prefill_progress=False,
            choose_pairing=False,
            images=images,
            audio=audio,
            tools=self._tools,
        )

    # -- the Engine API ----------------------------------------------------------------------------
    def load(self, spec: Any, on_event: Callable | None) -> concurrent.futures.Future:
        return self._submit(self._load_checked(spec, on_event), _Job(cancellable=False))

    def chat(
        self,
        messages: list[dict],
        settings: GenerationSettings,
        on_event: Callable,
        tools: list[dict] | None = None,
    ) -> concurrent.futures.Future:
        if tools and not self.features.tools:
            why = "this server does not take tools (it refused them before, or its model has no tool-call tokens)"
            return self._refuse(on_event, why)
        job = _Job()
        messages = [dict(m) for m in messages]
        settings = GenerationSettings(**{f.name: getattr(settings, f.name) for f in fields(GenerationSettings)})
        return self._submit(self._chat(job, messages, settings, on_event, tools), job)

    def complete(self, prompt: Any, settings: GenerationSettings, on_event: Callable) -> concurrent.futures.Future:
        return self._refuse(on_event, "raw completion (no chat template) is local only")

    def _refuse(self, on_event: Callable, why: str) -> concurrent.futures.Future:
        done = TurnDone(TurnStats(stop_reason="error"), "", (), error=why)
        _emit(on_event, done)
        future: concurrent.futures.Future = concurrent.futures.Future()
        future.set_result(done)
        return future

    def reset(self) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        future.set_result(None)  # the server keeps (or not) its own cache
        return future

    def cancel(self) -> None:
        for job in list(self._jobs):
            if not job.cancellable:
                continue
            job.cancelled = True
            if job.task is not None:
                self._loop.call_soon_threadsafe(job.task.cancel)

    def set_block_size(self, k: int | str) -> None:
        if k != "auto" and not (isinstance(k, int) and 1 <= k <= 16):
            raise ValueError("block size must be 1..16 or 'auto'")
        self._block = k
        if self.kind == "gemma-chat" and self._jobs:
            asyncio.run_coroutine_threadsafe(self._control({"block_size": k}), self._loop)

    def set_drafter_enabled(self, on: bool) -> None:
        self._drafter = bool(on)
        if self.kind == "gemma-chat" and self._jobs:
            asyncio.run_coroutine_threadsafe(self._control({"drafter_enabled": bool(on)}), self._loop)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.cancel()

        async def shutdown() -> None:
            await self._client.aclose()

        with _suppress():
            asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(timeout=5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    # -- plumbing ----------------------------------------------------------------------------------
    def _run_loop(self) -> None:
        import httpx2 as httpx

        asyncio.set_event_loop(self._loop)
        timeout = httpx.Timeout(connect=10.0, read=self.timeout_s, write=60.0, pool=10.0)
        self._httpx = httpx
        auth = httpx.BasicAuth(*self._credentials) if self._credentials else None
        self._client = httpx.AsyncClient(timeout=timeout, headers=self._headers(), auth=auth)
        self._turn_lock = asyncio.Lock()
        self._control_lock = asyncio.Lock()
        self._ready.set()
        self._loop.run_forever()

    def _headers(self) -> dict:
        # identity: the size caps count what the server sent, not what a small gzip bomb inflates to
        headers = {"Accept-Encoding": "identity"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def _submit(self, coro: Coroutine[Any, Any, Any], job: _Job) -> concurrent.futures.Future:
        if self._closed:
            coro.close()
            future: concurrent.futures.Future = concurrent.futures.Future()
            future.set_exception(EngineError("the engine is closed"))
            return future
        self._jobs.append(job)

        async def run() -> Any:
            async with self._turn_lock:  # FIFO, like the engine's request queue
                try:
                    job.task = asyncio.current_task()
                    return await coro
                finally:
                    self._jobs.remove(job)

        return asyncio.run_coroutine_threadsafe(run(), self._loop)

    def _describe(self, exc: Exception) -> str:
        httpx = self._httpx
        if isinstance(exc, httpx.ConnectError) and _is_tls_failure(exc):
            hint = " (is it plain http://?)" if self.base.startswith("https:") else ""
            return f"the TLS handshake with {self.base} failed{hint}: {exc}"
        if isinstance(exc, httpx.ConnectError):
            return f"cannot reach the server at {self.base}: connection refused or no such host (is it running?)"
        if isinstance(exc, httpx.InvalidURL):
            return f"{self.base} is not a URL the client can use: {exc}"
        if isinstance(exc, httpx.ConnectTimeout):
            return f"cannot reach the server at {self.base}: the connection timed out"
        if isinstance(exc, httpx.ReadTimeout):
            return f"the server at {self.base} sent nothing for {self.timeout_s:g} s (too slow or stuck)"
        if isinstance(exc, httpx.RemoteProtocolError):
            return f"the server at {self.base} broke the connection or does not speak HTTP ({exc})"
        if isinstance(exc, httpx.HTTPError):
            return f"talking to {self.base} failed: {type(exc).__name__}: {exc}"
        return str(exc)

    async def _get_json(self, path: str) -> Any:
        url = self.base + path
        try:
            async with self._client.stream("GET", url) as resp:
                text = await _read_capped(resp, MAX_BODY_BYTES, url)
        except self._httpx.HTTPError as e:
            raise RemoteError(self._describe(e)) from e
        if resp.status_code != 200:
            raise RemoteError(_http_error(url, resp.status_code, text))
        try:
            return json.loads(text)
        except (ValueError, RecursionError):
            raise RemoteError(f"{url} is not an OpenAI-compatible server: {_garbage(text)}") from None

    async def _metrics(self) -> dict[str, float] | None:
        try:
            async with self._client.stream("GET", self.base + "/metrics", timeout=5.0) as resp:
                if resp.status_code != 200:
                    return None
                return parse_spec_metrics(await _read_capped(resp, MAX_BODY_BYTES, self.base + "/metrics"))
        except (self._httpx.HTTPError, RemoteError):
            return None

    async def _control(self, body: dict) -> None:
        async with self._control_lock:  # one at a time, in the order the keys were pressed
            with _suppress():
                await self._client.post(self.base + "/v1/gemma-chat/control", json=body, timeout=5.0)

    # -- load: which server, which model -------------------------------------------------------------
    async def _load_checked(self, spec: Any, on_event: Callable | None) -> PairingInfo:
        """`_load`, whose every failure is a RemoteError (an EngineError): a server's odd answer is a sentence."""
        try:
            return await self._load(spec, on_event)
        except RemoteError:
            raise
        except self._httpx.HTTPError as e:
            raise RemoteError(self._describe(e)) from e
        except Exception as e:
            raise RemoteError(f"{self.base} answered something unreadable ({type(e).__name__}: {e})") from e

    async def _load(self, spec: Any, on_event: Callable | None) -> PairingInfo:
        _emit(on_event, LoadProgress("target", 0.0, f"connecting to {self.base}"))
        target = getattr(spec, "target", None)
        if self._info is not None and target not in (None, self.url, self.base):
            raise RemoteError(f"connected to {self.base}: the model is chosen on the server, not here")
        listing = await self._get_json("/v1/models")
        cards = listing.get("data") if isinstance(listing, dict) else None
        if not isinstance(cards, list) or not cards or not all(_is_card(c) for c in cards):
            raise RemoteError(f"{self.base}/v1/models lists no models: {_garbage(json.dumps(listing))}")
        if self.model:
            card = next((c for c in cards if str(c["id"]) == self.model), None)
            if card is None:
                names = ", ".join(str(c["id"]) for c in cards)
                raise RemoteError(f"the server has no model {self.model!r} (it serves: {_garbage(names, 300)})")
        else:
            card = cards[0]
        ext = card.get(EXTENSION) if isinstance(card.get(EXTENSION), dict) else None
        self.model_id = str(card["id"])
        metrics = None
        if ext is not None:
            self.kind = "gemma-chat"
            drafter = bool(ext.get("drafter"))
        else:
            self.kind = _server_kind(card)
            metrics = await self._metrics() if self.kind != "llama.cpp" else None
            drafter = metrics is not None
        self._info = self._pairing_info(card, ext or {}, drafter)
        # gemma-chat serve says whether it takes tools. Other servers are sent them until they refuse a
        # request for them (vLLM without its tool parser refuses every one): see _chat.
        self._tools = _flag_or(ext.get("tools"), False) if ext is not None else True
        _emit(on_event, LoadProgress("ready", 1.0, self._info.name))
        return self._info

    def _pairing_info(self, card: dict, ext: dict, drafter: bool) -> PairingInfo:
        """What the panels show, from the model card; a field of the wrong type counts as not given."""
        assert self.kind is not None and self.model_id is not None
        label = {"gemma-chat": "gemma-chat", "vllm": "vLLM", "llama.cpp": "llama.cpp", "openai": "server"}[self.kind]
        ours = self.kind == "gemma-chat"
        meta = card["meta"] if isinstance(card.get("meta"), dict) else {}  # llama.cpp's
        context = _count(ext.get("context_length")) or _count(card.get("max_model_len")) or _count(meta.get("n_ctx"))
        dtype = ext.get("dtype")
        served_by = f"{label} at {urlparse(self.base).netloc}"
        return PairingInfo(
            name=f"{self.model_id} ({served_by})",
            target_path=self.base,
            drafter_path=(f"{label} drafter" if drafter else None),
            has_vision=_flag_or(ext.get("has_vision"), True) if ours else True,
            # another server is asked as for images: it refuses a clip its model cannot hear (a 400, shown)
            has_audio=_flag_or(ext.get("has_audio"), False) if ours else True,
            demo=_flag_or(ext.get("demo"), False) if ours else False,
            context_length=context,
            vocab_size=0,
            sliding_window=0,
            dtype=dtype if isinstance(dtype, str) and dtype else "remote",
            supports_thinking=_flag_or(ext.get("supports_thinking"), self.kind == "vllm"),
            served_by=served_by,
        )

    # -- one turn ----------------------------------------------------------------------------------
    def _body(self, messages: list[dict], s: GenerationSettings, tools: list[dict] | None = None) -> dict:
        body: dict = {
            "model": self.model_id,
            "messages": openai_messages(messages, s.system_prompt),
            "stream": True,
            "max_tokens": s.max_tokens,
            "temperature": s.temperature,
            "top_p": s.top_p,
            "stream_options": {"include_usage": True},
        }
        if tools:
            body["tools"] = tools
            if s.tool_choice is not None:
                from core.decode.forced import choice_to_openai

                body["tool_choice"] = choice_to_openai(s.tool_choice)
        if s.seed is not None:
            body["seed"] = s.seed
        if s.top_k > 0:  # not part of OpenAI's API, but vLLM and gemma-chat take it
            body["top_k"] = s.top_k
        if self.kind in ("gemma-chat", "vllm", "llama.cpp"):
            if s.ignore_eos:
                body["ignore_eos"] = True
            if s.thinking:
                body["chat_template_kwargs"] = {"enable_thinking": True}
        if self.kind == "vllm":
            body["stream_options"]["continuous_usage_stats"] = True  # a token count per chunk
        if self.kind == "gemma-chat":
            body["block_size"] = self._block if self._block is not None else s.block_size
            body["drafter"] = self._drafter if self._drafter is not None else s.drafter_enabled
            if s.image_budget is not None:
                body["image_budget"] = s.image_budget
        return body

    async def _chat(
        self,
        job: _Job,
        messages: list[dict],
        settings: GenerationSettings,
        on_event: Callable | None,
        tools: list[dict] | None = None,
    ) -> TurnDone:
        turn = _Turn(on_event, time.perf_counter())
        poller = None
        try:
            if job.cancelled:
                raise asyncio.CancelledError
            if self._info is None:
                raise RemoteError("not connected: load() has not succeeded")
            body = self._body(messages, settings, tools)
            if self.kind == "vllm" and not self._reply_spec:
                turn.metrics_start = await self._metrics()
                if turn.metrics_start is not None:
                    poller = asyncio.ensure_future(self._poll_metrics(turn))
            await self._stream_or_without_tools(body, turn)
            if poller is not None:
                poller.cancel()
                if turn.spec is None:
                    await self._rounds_from_metrics(turn)
            self._reply_spec = self._reply_spec or (self.kind == "vllm" and turn.spec is not None)
            done = turn.finish()
        except asyncio.CancelledError:
            done = turn.finish(stop_reason="cancelled")
        except RemoteError as e:
            done = turn.fail(str(e))
        except self._httpx.HTTPError as e:
            done = turn.fail(self._describe(e))
        except Exception as e:  # the contract: a turn never raises into the caller
            done = turn.fail(f"{type(e).__name__}: {e}")
        finally:
            if poller is not None and not poller.done():
                poller.cancel()
        _emit(on_event, done)
        return done

    async def _stream_or_without_tools(self, body: dict, turn: _Turn) -> None:
        """The turn; a server other than gemma-chat's that refuses it for its tools gets it again without."""
        try:
            await self._stream(body, turn)
        except Refused as e:
            if "tools" not in body or self.kind == "gemma-chat" or e.status not in (400, 422) or turn.count:
                raise
            if "tool" not in str(e).lower():
                raise
            self._tools = False
            body = {k: v for k, v in body.items() if k not in ("tools", "tool_choice", "parallel_tool_calls")}
            why = str(e).removeprefix("the server refused the request ")
            _emit(turn.on_event, Notice(f"this server takes no tools {why}; they are off for it: answering without"))
            await self._stream(body, turn)

    async def _stream(self, body: dict, turn: _Turn) -> None:
        url = self.base + "/v1/chat/completions"
        turn.max_tokens = int(body["max_tokens"])
        async with self._client.stream("POST", url, json=body) as resp:
            if resp.status_code != 200:
                text = await _read_capped(resp, MAX_BODY_BYTES, url)
                raise Refused(_http_error(url, resp.status_code, text), resp.status_code)
            kind = resp.headers.get("content-type", "")
            if kind.startswith("application/json"):  # a server that does not stream: one whole completion
                text = await _read_capped(resp, MAX_BODY_BYTES, url)
                turn.on_chunk(_completion_as_chunk(text, url), False)
                turn.done_seen = True
                return
            if not kind.startswith("text/event-stream"):
                text = await _read_capped(resp, MAX_BODY_BYTES, url)
                raise RemoteError(f"{url} did not answer with an event stream: {_garbage(text)}")
            lines = _event_lines(resp, url)
            try:
                await self._read_events(lines, url, turn)
            finally:
                await lines.aclose()
        if turn.finish_reason is None and not turn.complete:
            if turn.count == 0 and not turn.text:
                raise RemoteError(f"{url} ended the stream without a reply (no text and no finish reason)")
            if not turn.done_seen:
                raise RemoteError(f"{url} closed the stream before the reply was finished")

    async def _read_events(self, lines: AsyncGenerator[str, None], url: str, turn: _Turn) -> None:
        """Feed the stream's chunks to `turn` until "[DONE]", the end of the stream or a complete reply.
        Keep-alive comments do not count as progress: only data resets the `timeout_s` clock."""
        last_data = time.monotonic()
        while True:
            wait = FINISH_GRACE_S if turn.complete else None  # the reply is whole: the rest is a courtesy
            try:
                line = await asyncio.wait_for(anext(lines), wait)
            except (StopAsyncIteration, TimeoutError):
                return
            if not line or line.startswith(":"):
                if time.monotonic() - last_data > self.timeout_s:
                    message = f"the server at {self.base} sent only keep-alive comments for {self.timeout_s:g} s"
                    raise RemoteError(message + " (too slow or stuck)")
                continue
            field, _, value = line.partition(":")
            if field in ("event", "id", "retry"):
                continue
            if field != "data":
                raise RemoteError(f"{url} sent a malformed event stream: {_garbage(line)}")
            last_data = time.monotonic()
            value = value.strip()
            if value == "[DONE]":
                turn.done_seen = True
                return
            try:
                chunk = json.loads(value)
            except (ValueError, RecursionError):
                raise RemoteError(f"{url} sent something that is not JSON: {_garbage(value)}") from None
            if not isinstance(chunk, dict):
                raise RemoteError(f"{url} sent an unexpected chunk: {_garbage(value)}")
            if "error" in chunk:
                err = chunk["error"]
                failure = err.get("message") if isinstance(err, dict) else err
                raise RemoteError(str(failure)[:2000])
            turn.on_chunk(chunk, self.kind == "gemma-chat")
            if turn.overflow:  # tokens past max_tokens: this server does not stop where it was asked to
                return

    async def _poll_metrics(self, turn: _Turn) -> None:
        while True:
            await asyncio.sleep(self.metrics_poll_s)
            await self._rounds_from_metrics(turn)

    async def _rounds_from_metrics(self, turn: _Turn) -> None:
        now = await self._metrics()
        if now is None or turn.metrics_start is None:
            return
        seen = turn.metrics_seen or turn.metrics_start
        drafts = int(now["drafts"] - seen["drafts"])
        if drafts <= 0:
            return
        drafted = int(now["drafted"] - seen["drafted"])
        accepted = int(now["accepted"] - seen["accepted"])
        turn.metrics_seen = now
        for ev in split_rounds(drafts, drafted, accepted, turn.stats.rounds):
            turn.stats.add_round(ev)  # decode_tokens is recounted from the tokens at the end
            _emit(turn.on_event, ev)


class _Turn:
    """Rebuilds the engine's events for one streamed reply."""

    def __init__(self, on_event: Callable | None, t_start: float) -> None:
        self.on_event = on_event
        self.t_start = t_start
        self.stats = TurnStats()
        self.text: list[str] = []
        self.ids: list[int] = []
        self.count = 0  # tokens seen (ids, or usage counts where the server has no ids)
        self.max_tokens: int | None = None  # what was asked for: more is not emitted
        self.overflow = False  # the server sent more tokens than that
        self.done_seen = False  # "[DONE]"
        self.first_at: float | None = None
        self.last_at: float | None = None
        self.finish_reason: str | None = None
        self.server_stats: dict | None = None
        self.usage: dict | None = None
        self.metrics_start: dict | None = None
        self.metrics_seen: dict | None = None
        self.calls: dict[int, dict] = {}  # streamed tool_calls by index: {"id", "name", "arguments"}
        self.spec: ReplySpec | None = None  # the reply's own speculative counts, when the server sends them

    @property
    def complete(self) -> bool:
        """The reply is whole: the server said why it ended, or sent every token asked for."""
        full = self.max_tokens is not None and self.count >= self.max_tokens
        return self.finish_reason is not None or full

    def _token(self, ev: TokenEvent) -> None:
        if self.max_tokens is not None and self.count >= self.max_tokens:
            self.overflow = True
            self.finish_reason = "length"
            return
        now = time.perf_counter()
        if self.first_at is None:
            self.first_at = now
        self.last_at = now
        self.count += 1
        self.text.append(ev.text)
        if ev.id >= 0:
            self.ids.append(ev.id)
        _emit(self.on_event, ev)

    def on_chunk(self, chunk: dict, extended: bool) -> None:
        choices = chunk.get("choices") or []
        choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
        delta = choice.get("delta") or {}
        content = delta.get("content") if isinstance(delta, dict) else None
        if content is not None and not isinstance(content, str):
            raise RemoteError(f"the server sent a chunk whose content is not text: {_garbage(repr(content))}")
        usage = chunk["usage"] if isinstance(chunk.get("usage"), dict) else None
        if isinstance(delta, dict) and isinstance(delta.get("tool_calls"), list):
            self._tool_deltas(delta["tool_calls"])
        ext = chunk.get(EXTENSION) if extended else None
        if not extended:
            self.spec = reply_spec(chunk) or self.spec
        if isinstance(ext, dict):
            self._extension(ext, content)
        elif content:
            before = self.count
            total = usage.get("completion_tokens") if usage else None
            self._token(TokenEvent(-1, content, None, -1))  # origin unknown
            if isinstance(total, int) and not isinstance(total, bool):
                for _ in range(min(total, self.max_tokens or total) - before - 1):  # more tokens in this chunk
                    self._token(TokenEvent(-1, "", None, -1))
        if usage is not None:
            self.usage = usage
        reason = choice.get("finish_reason")
        if reason and isinstance(reason, str) and not self.overflow:
            self.finish_reason = reason

    def _tool_deltas(self, deltas: list) -> None:
        """OpenAI's streamed `tool_calls`: a call's id and name, then pieces of its arguments' JSON."""
        for d in deltas:
            fn = d.get("function") if isinstance(d, dict) else None
            index = d.get("index") if isinstance(d, dict) else None
            if not isinstance(index, int) or isinstance(index, bool) or not isinstance(fn, dict):
                raise RemoteError(f"the server sent a malformed tool call: {_garbage(repr(d))}")
            call = self.calls.setdefault(index, {"id": "", "name": "", "arguments": "", "started": False})
            call["id"] = d["id"] if isinstance(d.get("id"), str) else call["id"]
            call["name"] += fn["name"] if isinstance(fn.get("name"), str) else ""
            if call["name"] and not call["started"]:
                call["started"] = True
                _emit(self.on_event, ToolCallStarted(index, call["id"], call["name"]))
            piece = fn.get("arguments")
            if isinstance(piece, str) and piece:
                call["arguments"] += piece
                _emit(self.on_event, ToolCallDelta(index, piece))

    def _tool_results(self) -> tuple[tuple[ToolCall, ...], tuple[ToolCallError, ...]]:
        """The streamed calls, decoded (their events sent), in index order."""
        calls, errors = [], []
        for index, c in sorted(self.calls.items()):
            try:
                arguments = json.loads(c["arguments"] or "{}")
            except (ValueError, RecursionError):
                arguments = None
            if not isinstance(arguments, dict) or not c["name"]:
                raw = f"{c['name']}({c['arguments']})"
                errors.append(ToolCallError(index, f"the server sent a malformed tool call: {_garbage(raw)}", raw))
                _emit(self.on_event, errors[-1])
                continue
            calls.append(ToolCall(index, c["id"], c["name"], arguments, c["arguments"] or "{}", ""))
            _emit(self.on_event, calls[-1])
        return tuple(calls), tuple(errors)

    def _extension(self, ext: dict, content: str | None) -> None:
        """gemma-chat's own object: the tokens with their origins, the rounds, the prefill, the stats."""
        notices = ext.get("notices") or []
        for text in notices if isinstance(notices, list) else []:
            if isinstance(text, str):  # what the server's engine said about the input, before its prefill
                _emit(self.on_event, Notice(_shown(text)))
        if isinstance(ext.get("prefill"), dict):
            _emit(self.on_event, _typed(PrefillDone, ext["prefill"], "prefill summary"))
        tokens, rounds = ext.get("tokens") or [], ext.get("rounds") or []
        if not isinstance(tokens, list) or not isinstance(rounds, list):
            raise RemoteError(f"the server sent malformed tokens or rounds: {_garbage(repr(ext)[:200])}")
        events: list = [_typed(TokenEvent, t, "token") for t in tokens]
        events += [_typed(RoundEvent, r, "round summary") for r in rounds]
        # the engine's order: a round's tokens, then its summary (stable sort keeps token order)
        events.sort(key=lambda ev: (ev.round, isinstance(ev, RoundEvent)))
        for ev in events:
            if isinstance(ev, TokenEvent):
                self._token(ev)
            elif not self.overflow:
                _emit(self.on_event, ev)
        if isinstance(ext.get("stats"), dict):
            self.server_stats = ext["stats"]
        if content and not tokens:
            self.text.append(content)  # the detokenizer's held-back tail: text without a token

    def finish(self, stop_reason: str | None = None) -> TurnDone:
        ids = tuple(self.ids)
        if self.server_stats is not None and stop_reason is None and not self.overflow:
            stats = _typed(TurnStats, self.server_stats, "turn summary")
            try:
                stats.block_size_counts = {int(k): int(v) for k, v in (stats.block_size_counts or {}).items()}
            except (TypeError, ValueError):
                raise RemoteError("the server sent malformed block size counts") from None
        else:
            stats = self.stats
            n = self.count
            completion = self.usage.get("completion_tokens") if self.usage else None
            if _count(completion) and stop_reason is None and not self.overflow:
                n = min(_count(completion), self.max_tokens or _count(completion))
            if self.usage and _count(self.usage.get("prompt_tokens")):
                stats.prompt_tokens = stats.prefill_tokens = _count(self.usage["prompt_tokens"])
            stats.tokens = n  # TurnStats' one definition: every token of the reply
            stats.decode_tokens = max(n - 1, 0)  # the first token comes from the prefill
            if self.first_at is not None and self.last_at is not None:
                stats.ttft_s = self.first_at - self.t_start
                stats.decode_s = self.last_at - self.first_at
            if self.spec is not None and stop_reason is None:
                self._spec_rounds(stats, n)
            stats.drafter_enabled = self.stats.drafted > 0
            full = self.max_tokens is not None and n >= self.max_tokens
            reason = {"length": "max_tokens"}.get(self.finish_reason or "", "max_tokens" if full else "eos")
            stats.stop_reason = stop_reason or reason
            if not ids:  # the server sends no ids: one -1 per token, so counts still add up
                ids = (-1,) * n
        calls, errors = self._tool_results()
        if calls and stats.stop_reason == "eos" and self.finish_reason == "tool_calls":
            stats.stop_reason = "tool_calls"
        return TurnDone(stats, "".join(self.text), ids, tool_calls=calls, tool_errors=errors)

    def _spec_rounds(self, stats: TurnStats, tokens: int) -> None:
        """The reply's own speculative counts replace what /metrics said (server-wide); their rounds are
        sent as events unless the /metrics polling already sent some this turn (they cannot be taken back)."""
        assert self.spec is not None
        emit = stats.rounds == 0
        stats.rounds = stats.drafted = stats.accepted = 0
        stats.block_size_counts = {}
        decode_tokens = stats.decode_tokens  # counted from the tokens, not from the rounds
        for ev in self.spec.round_events(tokens):
            stats.add_round(ev)
            if emit:
                _emit(self.on_event, ev)
        stats.decode_tokens = decode_tokens

    def fail(self, message: str) -> TurnDone:
        return TurnDone(TurnStats(stop_reason="error"), "".join(self.text), tuple(self.ids), error=message)


def _server_kind(card: dict) -> str:
    """Which kind of server lists this model card (not gemma-chat's, which says so in its extension)."""
    if card.get("owned_by") == "llamacpp":
        return "llama.cpp"
    return "vllm" if card.get("owned_by") == "vllm" or "max_model_len" in card else "openai"


def _known(cls: type, data: dict) -> dict:
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}


def _fits(value: Any, hint: Any) -> bool:
    """Whether a JSON value has the type a dataclass field declares (bool is not an int, NaN no float)."""
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if hint is str:
        return isinstance(value, str)
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        return any(_fits(value, a) for a in get_args(hint))
    if hint is type(None):
        return value is None
    return isinstance(value, origin or hint)


def _typed(cls: type, data: Any, what: str) -> Any:
    """`cls` built from a server's JSON object, every known field checked against its declared type."""
    if not isinstance(data, dict):
        raise RemoteError(f"the server sent a malformed {what}: {_garbage(repr(data))}")
    hints = get_type_hints(cls)
    known = _known(cls, data)
    bad = [k for k, v in known.items() if not _fits(v, hints[k])]
    if bad:
        raise RemoteError(f"the server sent a malformed {what}: {bad[0]} is {_garbage(repr(known[bad[0]]))}")
    try:
        return cls(**known)
    except TypeError:  # a required field missing
        raise RemoteError(f"the server sent an incomplete {what}: {_garbage(json.dumps(data))}") from None


def _count(value: Any) -> int:
    """A non-negative integer field of a model card, or 0 when it is not one ("lots", -1, 1e400)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _flag_or(value: Any, default: bool) -> bool:
    return value if isinstance(value, bool) else default


def _is_card(card: Any) -> bool:
    return isinstance(card, dict) and isinstance(card.get("id"), (str, int)) and not isinstance(card["id"], bool)


def _is_tls_failure(exc: BaseException) -> bool:
    import ssl

    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLError) or "SSL" in str(seen) or "TLS" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


async def _read_capped(resp: Any, limit: int, url: str) -> str:
    """A response body as text, refused past `limit` bytes (by Content-Length before reading it)."""
    declared = resp.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise RemoteError(f"{url} answered with {int(declared):,} bytes; a chat server's answer is under {limit:,}")
    chunks: list[bytes] = []
    size = 0
    async for chunk in resp.aiter_bytes():
        size += len(chunk)
        if size > limit:
            raise RemoteError(f"{url} answered with more than {limit:,} bytes; a chat server's answer is smaller")
        chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", "replace")


async def _event_lines(resp: Any, url: str) -> AsyncGenerator[str, None]:
    """The event stream's lines (\\n or \\r\\n), each at most MAX_LINE_BYTES: httpx's own line reader
    would hold a server's endless line in memory."""
    buf = bytearray()
    async for chunk in resp.aiter_bytes():
        start = len(buf)
        buf += chunk
        cut = buf.find(b"\n", start)
        while cut >= 0:
            line = bytes(buf[:cut])
            del buf[: cut + 1]
            yield line.removesuffix(b"\r").decode("utf-8", "replace")
            cut = buf.find(b"\n")
        if len(buf) > MAX_LINE_BYTES:
            raise RemoteError(
                f"{url} sent an event-stream line of more than {MAX_LINE_BYTES:,} bytes: not a chat stream"
            )
    if buf:
        yield bytes(buf).removesuffix(b"\r").decode("utf-8", "replace")


def _emit(on_event: Callable | None, event: object) -> None:
    if on_event is None:
        return
    try:
        on_event(event)
    except Exception:  # a listener's bug must not kill the turn
        import logging

        logging.getLogger(__name__).exception("event callback failed")


def _shown(text: str, limit: int = 300) -> str:
    """A server's sentence for the user: printable characters only (no terminal escapes), at most `limit`."""
    text = "".join(ch if ch.isprintable() else " " for ch in text).strip()
    return text[:limit] + ("…" if len(text) > limit else "")


def _garbage(text: str, limit: int = 120) -> str:
    text = " ".join(text.split())
    return repr(text[:limit] + ("…" if len(text) > limit else "")) if text else "an empty body"


def _completion_as_chunk(text: str, url: str) -> dict:
    """A non-streamed chat completion as the one stream chunk that says the same (content, tool calls with
    their index, finish reason, usage)."""
    try:
        body = json.loads(text)
        choice = body["choices"][0]
        message = choice["message"]
    except (ValueError, RecursionError, KeyError, IndexError, TypeError):
        raise RemoteError(f"{url} answered with JSON that is not a chat completion: {_garbage(text)}") from None
    if not isinstance(message, dict):
        raise RemoteError(f"{url} answered with a malformed message: {_garbage(text)}")
    delta: dict = {"content": message.get("content")}
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        delta["tool_calls"] = [{**c, "index": i} if isinstance(c, dict) else c for i, c in enumerate(calls)]
    chunk: dict = {"choices": [{"delta": delta, "finish_reason": choice.get("finish_reason") or "stop"}]}
    if isinstance(body.get("usage"), dict):
        chunk["usage"] = body["usage"]
    return chunk


def _http_error(url: str, status: int, text: str) -> str:
    try:
        err = json.loads(text).get("error")
        message = err.get("message") if isinstance(err, dict) else err
    except (ValueError, AttributeError):
        message = None
    if isinstance(message, str) and message:
        return f"the server refused the request (HTTP {status}): {message}"
    return f"HTTP {status} from {url}: {_garbage(text)}"


class _suppress:
    def __enter__(self) -> _suppress:
        return self

    def __exit__(self, *exc: Any) -> bool:
        return exc[0] is not None and issubclass(exc[0], Exception)
