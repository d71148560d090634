"""`gemma-chat serve`: an OpenAI-compatible HTTP API over one engine (Starlette on uvicorn).

Routes: GET /health, GET /v1/models, POST /v1/chat/completions (server-sent events or one JSON body),
POST /v1/completions (a plain prompt, no chat template: `TextCompletion`), POST /v1/gemma-chat/control
(block size / drafter for the running turn). Errors are OpenAI-shaped:
{"error": {"message", "type", "param", "code"}}.

`logprobs` / `top_logprobs` (chat) and `logprobs: N` (completions) are the target's own log-probabilities of
the emitted tokens (core.decode.logprobs: read from each round's verify logits), as OpenAI's
`logprobs.content` items or the legacy lists. `stream_options.include_usage` ends the stream with OpenAI's
usage chunk (empty `choices`). `n` > 1 is refused (one request, one reply: send n requests).

One engine, turns admitted in arrival order (FIFO): as many run at once as the engine's `parallel`
(1: one at a time; N > 1: the engine decodes them together, core.engine.batching). At most
`max_waiting` requests wait behind the running ones; the next gets 429 at once. A client that
disconnects, while waiting or while its turn runs, cancels its own turn only (`cancel_turn`; the
engine stops it within one round).

The stream is standard `chat.completion.chunk` objects plus a "gemma_chat" object per chunk:
  {"tokens": [{"id", "text", "from_draft", "round"[, "call_text"]}], "rounds": [RoundEvent fields], "prefill": {...},
   "notices": ["what the user should know about the input, e.g. an audio clip cut to what the model hears"]}
(a round's summary may ride on the chunk of the next round's tokens: order events by round)
and on the last chunk (finish_reason set) "usage" and {"stats": TurnStats.as_dict()}. OpenAI clients
ignore the extension; `core.engine.remote.RemoteEngine` rebuilds the engine's events from it.

The HTTP status is decided after the engine's first event (prompt prefilled, or the turn refused),
so a prompt that is too long or an unreadable image is a 400, not an error inside a 200 stream.

Outside input is checked before it costs anything (issue 24): `RequestGuard` refuses requests that are
not addressed to this server (Host), come from another site's page (Origin) or POST anything but JSON;
`read_json` bounds the body's size and time; `guarded_protocol` bounds the time to send headers and the
number of connections; the parsers refuse what the engine would misread (strings for booleans, integers
of hundreds of digits, lone surrogates, fields not served yet).

Tools (OpenAI's `tools`, `tool_choice` auto/none/required/a named function, `parallel_tool_calls`;
`required` and a named function force the reply's first tokens, core.decode.forced): the model's calls
come back as `tool_calls`, each whole once the model closed it (streamed as one `tool_calls` delta per call), with
`finish_reason: "tool_calls"`. History may hold assistant `tool_calls` and `role: "tool"` results (JSON
text is rendered as the object, core.decode.chat_format). The server never runs a tool.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import collections
import concurrent.futures
import contextlib
import dataclasses
import hmac
import ipaddress
import json
import logging
import threading
import time
import uuid
from collections.abc import AsyncGenerator, Coroutine
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlparse

from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from core.events import (
    Notice,
    PrefillDone,
    RoundEvent,
    TokenEvent,
    TokenLogprob,
    ToolCall,
    ToolCallError,
    TurnDone,
)
from core.limits import MAX_AUDIO_PER_PROMPT, MAX_IMAGES_PER_PROMPT
from core.settings import GenerationSettings
from core.units import format_bytes

log = logging.getLogger("gemma_chat.serve")

EXTENSION = "gemma_chat"  # the key of gemma-chat's own object in chunks and responses
DEFAULT_MAX_TOKENS = 2048
MAX_STOPS = 4
# the context filled before max_tokens: a reply cut by a length limit all the same (OpenAI's "length")
FINISH_REASONS = {"eos": "stop", "stop": "stop", "max_tokens": "length", "context_full": "length", "cancelled": "stop"}
FINISH_REASONS["tool_calls"] = "stop"  # ended on <|tool_response> with no call decoded (all malformed)
INT_LIMIT = 2**64  # no integer field means anything past this (the seed's own range ends at 2**64 - 1)

# Slow or idle clients and big bodies (`serve` takes the defaults from its options): a request's headers
# must be complete this long after its connection opens (or its keep-alive request begins), its body
# this long after its headers; connections past `max_connections` are answered 503 and closed at once,
# which keeps the process far below its descriptor limit (mlx-lm's import sets it to 2048).
HEADER_TIMEOUT_S = 10.0
BODY_TIMEOUT_S = 30.0
KEEP_ALIVE_S = 5.0
MAX_CONNECTIONS = 256
# asyncio accepts up to `backlog` connections in one loop iteration before any of them can be answered
# and closed; at uvicorn's 2048 a flood held every descriptor at once, and MLX's kernel compiler (popen)
# failed inside the engine. At 128 the peak stays near max_connections + 128.
ACCEPT_BURST = 128
MAX_BODY_BYTES = 64 << 20  # a conversation with a few large images as data URLs fits many times over


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def host_name(value: str) -> str:
    """The name in a Host header or a URL authority, without its port: "[::1]:8000" -> "::1"."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    name, sep, port = value.rpartition(":")
    return name.rstrip(".") if sep and port.isdigit() else value.rstrip(".")


@dataclass
class ServerConfig:
    model_id: str
    api_key: str | None = None
    max_waiting: int = 4  # requests queued behind the running one; the next gets 429
    allow_file_urls: bool = True  # file:// image URLs read the server's disk: loopback only by default
    max_tokens: int = DEFAULT_MAX_TOKENS  # when a request does not say
    # Host names requests may be addressed to besides the loopback ones (DNS rebinding: a web page whose
    # name resolves to 127.0.0.1 sends its own name); None takes any Host (a wildcard bind, where the API
    # key that such a bind requires is what keeps web pages out).
    allowed_hosts: tuple[str, ...] | None = ()
    max_body_bytes: int = MAX_BODY_BYTES
    body_timeout_s: float = BODY_TIMEOUT_S
    header_timeout_s: float = HEADER_TIMEOUT_S
    max_connections: int = MAX_CONNECTIONS

    def host_allowed(self, name: str) -> bool:
        return self.allowed_hosts is None or is_loopback(name) or name in self.allowed_hosts


class ApiError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param = status, message, type_, param

    def response(self) -> JSONResponse:
        # the body was not read to its end (too large, too slow): the connection cannot carry another request
        unread = {"connection": "close"} if self.status in (408, 413) else None
        return error_response(self.status, self.message, self.type, self.param, unread)


def error_response(
    status: int, message: str, type_: str, param: str | None = None, headers: dict[str, str] | None = None
) -> JSONResponse:
    body = {"error": {"message": message, "type": type_, "param": param, "code": status}}
    return JSONResponse(body, status_code=status, headers=headers)


# -- request parsing ---------------------------------------------------------------------------------


@dataclass
class ChatRequest:
    messages: list[dict]
    settings: GenerationSettings
    stream: bool
    stops: list[str]
    tools: list[dict] | None = None  # declared to the model (None: none, or tool_choice "none")
    parallel_tool_calls: bool = True  # False: the reply ends at its first complete call
    include_usage: bool = False  # stream_options.include_usage: a last chunk with the usage and no choices
    prompt: str | list[int] | None = None  # /v1/completions: the plain prompt (no chat template)


def _show(value: Any) -> str:
    """A client's value in a message, cut short (a 400-digit integer is not worth echoing whole)."""
    text = json.dumps(value, ensure_ascii=True) if isinstance(value, (str, bool)) or value is None else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _number(body: dict, key: str, kind: type, default: Any) -> Any:
    value = body.get(key)
    if value is None:
        return default
    what = "an integer" if kind is int else "a number"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ApiError(400, f"'{key}' must be {what}, got {_show(value)}", param=key)
    if kind is int and isinstance(value, float) and not value.is_integer():
        raise ApiError(400, f"'{key}' must be {what}, got {_show(value)}", param=key)
    if abs(value) > INT_LIMIT:  # float() of a 400-digit integer overflows; no field means such a value
        raise ApiError(400, f"'{key}' is out of range, got {_show(value)}", param=key)
    return kind(value)


def _flag(body: dict, key: str, default: bool) -> bool:
    """A JSON boolean: the string "false" is not false (bool("false") is True)."""
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ApiError(400, f"'{key}' must be true or false, got {_show(value)}", param=key)
    return value


def _text(value: str, where: str) -> str:
    """Text the tokenizer can take: JSON can spell a lone surrogate ("\\ud800"), which is not Unicode."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        bad = f"\\u{ord(value[e.start]):04x}"
        raise ApiError(400, f"{where} holds a lone surrogate ({bad}), which is not valid Unicode text") from None
    return value


# Fields of OpenAI's API this server does not serve yet. Refused rather than ignored: a client that asks
# for logprobs or a tool call and gets plain text has no way to tell. Remove an entry when it is served.
UNSERVED = {
    "functions": "function calling is not served (and 'functions' is deprecated: use 'tools')",
    "function_call": "function calling is not served (and 'function_call' is deprecated: use 'tool_choice')",
    "response_format": "response_format (JSON mode, structured output) is not served yet",
}
# what asking for nothing looks like in each of them
_UNSERVED_DEFAULTS: tuple[Any, ...] = (None, False, 0, [], {}, "none", "auto", {"type": "text"})


def refuse_unserved(body: dict) -> None:
    for key, why in UNSERVED.items():
        value = body.get(key)
        if key == "function_call" and not body.get("functions"):
            continue  # a choice among no tools asks for nothing
        if not any(value == d and type(value) is type(d) for d in _UNSERVED_DEFAULTS):
            raise ApiError(400, f"'{key}': {why} by gemma-chat serve; leave it out", param=key)


# an image_url / audio_url part's words: (a data URL example, the noun for its file: URL)
_URL_KINDS = {
    "image": ("data:image/png;base64,...", "an image's file: URL"),
    "audio": ("data:audio/wav;base64,...", "an audio clip's file: URL"),
}


def _url_item(part: dict, kind: str, allow_files: bool) -> dict:
    """An OpenAI image_url or vLLM audio_url part: a base64 data: URL, or a file: URL on loopback."""
    example, file_noun = _URL_KINDS[kind]
    spec = part.get(f"{kind}_url")
    url = spec.get("url") if isinstance(spec, dict) else spec
    if not isinstance(url, str) or not url:
        raise ApiError(400, f"an {kind}_url part needs {kind}_url.url (a data: or file: URL)", param="messages")
    if url.startswith("data:"):
        header, _, payload = url.partition(",")
        if ";base64" not in header:
            raise ApiError(400, f"{kind} data URLs must be base64 ({example})", param="messages")
        what = f"the {kind} data URL"
        if kind == "image":  # an empty image is the decoder's to refuse, with its own words
            try:
                return {"type": kind, kind: base64.b64decode(payload, validate=True)}
            except (binascii.Error, ValueError):
                raise ApiError(400, f"{what} is not valid base64", param="messages") from None
        return {"type": kind, kind: _base64(payload, what)}
    if url.startswith("file:"):
        if not allow_files:
            raise ApiError(
                400, f"file: {kind} URLs are refused on a server reachable from the network", param="messages"
            )
        return {"type": kind, "path": _text(unquote(urlparse(url).path), file_noun)}
    raise ApiError(400, f"{kind} URLs must be data: or file: URLs (this server does not download)", param="messages")


# `input_audio.format` values taken (OpenAI names wav and mp3; the decoder reads the bytes, whatever
# the name, so the name only has to be one of what it reads)
AUDIO_FORMATS = ("wav", "mp3", "flac", "ogg", "opus", "aiff")


def _base64(payload: str, what: str) -> bytes:
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise ApiError(400, f"{what} is not valid base64", param="messages") from None
    if not data:
        raise ApiError(400, f"{what} is empty", param="messages")
    return data


def _input_audio_item(part: dict) -> dict:
    """OpenAI's {"type": "input_audio", "input_audio": {"data": BASE64, "format": "wav"}}."""
    spec = part.get("input_audio")
    data = spec.get("data") if isinstance(spec, dict) else None
    if not isinstance(data, str) or not data:
        raise ApiError(400, "an input_audio part needs input_audio.data (the file, base64)", param="messages")
    fmt = spec.get("format") if isinstance(spec, dict) else None
    if fmt is not None and (not isinstance(fmt, str) or fmt.lower() not in AUDIO_FORMATS):
        message = f"input_audio.format must be one of {', '.join(AUDIO_FORMATS)}, got {_show(fmt)}"
        raise ApiError(400, message, param="messages")
    return {"type": "audio", "audio": _base64(data, "input_audio.data")}


def _content(content: Any, i: int, allow_files: bool) -> str | list[dict]:
    if content is None:
        return ""
    if isinstance(content, str):
        return _text(content, f"messages[{i}].content")
    if not isinstance(content, list):
        raise ApiError(400, f"messages[{i}]: content must be a string or a list of parts", param="messages")
    parts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": _text(part["text"], f"messages[{i}].content")})
        elif kind == "image_url":
            parts.append(_url_item(part, "image", allow_files))
        elif kind == "input_audio":
            parts.append(_input_audio_item(part))
        elif kind == "audio_url":
            parts.append(_url_item(part, "audio", allow_files))
        else:
            message = f"messages[{i}]: content parts must be text, image_url or input_audio, got {_show(kind)}"
            raise ApiError(400, message)
    return parts


ROLES = ("system", "developer", "user", "assistant", "tool")


def _tool_calls(calls: Any, i: int) -> list[dict]:
    """An assistant message's OpenAI `tool_calls`, as the engine takes them (arguments: JSON text)."""
    where = f"messages[{i}].tool_calls"
    if not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls):
        raise ApiError(400, f"{where} must be a list of {{id, type, function}}", param="messages")
    out = []
    for j, call in enumerate(calls):
        fn = call.get("function")
        if call.get("type", "function") != "function" or not isinstance(fn, dict):
            message = f"{where}[{j}] must be {{type: 'function', function: {{name, arguments}}}}"
            raise ApiError(400, message, param="messages")
        name, arguments = fn.get("name"), fn.get("arguments")
        if not isinstance(name, str) or not (arguments is None or isinstance(arguments, (str, dict))):
            raise ApiError(400, f"{where}[{j}].function needs a name and arguments (JSON text)", param="messages")
        clean = {"type": "function", "function": {"name": _text(name, where), "arguments": arguments}}
        if isinstance(call.get("id"), str):
            clean["id"] = _text(call["id"], where)
        out.append(clean)
    return out


def _tool_result(m: dict, i: int, allow_files: bool) -> dict:
    """A `role: "tool"` message: its text (JSON text is rendered as the object, core.decode.chat_format)."""
    content = _content(m.get("content"), i, allow_files)
    if isinstance(content, list) and all(p["type"] == "text" for p in content):
        content = "".join(p["text"] for p in content)  # text parts are one result, parsed as JSON like a string
    out: dict[str, Any] = {"role": "tool", "content": content}
    for key in ("tool_call_id", "name"):
        if isinstance(m.get(key), str):
            out[key] = _text(m[key], f"messages[{i}].{key}")
    return out


def _message(m: Any, i: int, allow_files: bool) -> dict:
    if not isinstance(m, dict) or m.get("role") not in ROLES:
        role = m.get("role") if isinstance(m, dict) else None
        message = f"messages[{i}]: role must be system, user, assistant or tool, got {_show(role)}"
        raise ApiError(400, message, param="messages")
    if m["role"] == "tool":
        return _tool_result(m, i, allow_files)
    role = "system" if m["role"] == "developer" else m["role"]
    out: dict[str, Any] = {"role": role, "content": _content(m.get("content"), i, allow_files)}
    if role == "assistant" and m.get("tool_calls"):
        out["tool_calls"] = _tool_calls(m["tool_calls"], i)
        if m.get("content") is None:
            out["content"] = None
    return out


def _answers_a_call(messages: list[dict], i: int) -> bool:
    """Whether the tool result at `i` follows (across other results) an assistant message with calls."""
    j = i - 1
    while j >= 0 and messages[j]["role"] == "tool":
        j -= 1
    return j >= 0 and messages[j]["role"] == "assistant" and bool(messages[j].get("tool_calls"))


def parse_messages(raw: Any, allow_files: bool) -> list[dict]:
    if not isinstance(raw, list) or not raw:
        raise ApiError(400, "'messages' must be a non-empty list of {role, content}", param="messages")
    out = [_message(m, i, allow_files) for i, m in enumerate(raw)]
    for i, m in enumerate(out):
        if m["role"] == "tool" and not _answers_a_call(out, i):
            message = f"messages[{i}]: a role 'tool' message must follow an assistant message with tool_calls"
            raise ApiError(400, message, param="messages")
    for kind, limit, plural in (
        ("image", MAX_IMAGES_PER_PROMPT, "images"),
        ("audio", MAX_AUDIO_PER_PROMPT, "audio clips"),
    ):
        n = count_parts(out, kind)
        if n > limit:
            message = f"the messages hold {n} {plural}; at most {limit} are taken in one request"
            raise ApiError(400, message, param="messages")
    if any(m["role"] == "tool" or m.get("tool_calls") for m in out):
        from core.decode.chat_format import ToolFormatError, normalize_messages

        try:
            normalize_messages(out)  # the calls' names and JSON arguments, checked as the engine renders them
        except ToolFormatError as e:
            raise ApiError(400, f"'messages': {e}", param="messages") from None
    return out


def count_parts(messages: list[dict], kind: str) -> int:
    """The parsed messages' content items of `kind` ("image", "audio")."""
    return sum(1 for m in messages if isinstance(m["content"], list) for p in m["content"] if p["type"] == kind)


def refuse_unheard_audio(engine: Any, messages: list[dict]) -> None:
    """Audio for a pairing that takes none (26B-A4B, 31B, the demo): a 400 before the engine sees it."""
    if not count_parts(messages, "audio") or engine.features.audio:
        return
    from core.engine.local import no_audio_message

    info = engine.info
    raise ApiError(400, no_audio_message(info.name if info is not None else "this model"), param="messages")


def parse_tools(body: dict) -> tuple[list[dict] | None, bool, str | None]:
    """`tools`, `tool_choice` and `parallel_tool_calls`: (the tools to declare, whether several calls may
    come, GenerationSettings.tool_choice).

    `auto` (the default) declares the tools and the model decides; `none` declares none; `required` and
    a named function declare them and force the reply to start with a call (core.decode.forced)."""
    from core.decode.chat_format import ToolFormatError, normalize_tools
    from core.decode.forced import REQUIRED

    parallel = _flag(body, "parallel_tool_calls", True)
    raw = body.get("tools")
    if not raw:
        return None, parallel, None
    try:
        tools = normalize_tools(raw)
    except ToolFormatError as e:
        raise ApiError(400, f"'tools': {e}", param="tools") from None
    choice = body.get("tool_choice", "auto")
    if choice is None or choice == "auto":
        return tools, parallel, None
    if choice == "none":
        return None, parallel, None
    if choice == "required":
        return tools, parallel, REQUIRED
    if isinstance(choice, dict) and choice.get("type", "function") == "function":
        fn = choice.get("function")
        named = fn.get("name") if isinstance(fn, dict) else None
        if named not in [t["function"]["name"] for t in tools]:
            raise ApiError(400, f"'tool_choice' names {_show(named)}, which is not in 'tools'", param="tool_choice")
        return tools, parallel, named
    raise ApiError(400, f"'tool_choice' must be 'auto', 'none', 'required' or {{type, function}}, got {_show(choice)}")


def _stops(body: dict) -> list[str]:
    stop = body.get("stop")
    stops = [stop] if isinstance(stop, str) else stop or []
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) or len(stops) > MAX_STOPS:
        raise ApiError(400, f"'stop' must be a string or a list of up to {MAX_STOPS} non-empty strings", param="stop")
    return [_text(s, "'stop'") for s in stops]


def _block_size(body: dict) -> int | str:
    block = body.get("block_size", "auto")
    if block != "auto" and (isinstance(block, bool) or not isinstance(block, int)):
        raise ApiError(400, "'block_size' must be an integer 1..16 or 'auto'", param="block_size")
    return block


MAX_TOP_LOGPROBS = 20  # as OpenAI (core.decode.logprobs scores any number; the reply's size is what it costs)


def _chat_logprobs(body: dict) -> int | None:
    """OpenAI's `logprobs` (a boolean) and `top_logprobs` (0..20) as GenerationSettings.logprobs."""
    wanted = _flag(body, "logprobs", False)
    top = _number(body, "top_logprobs", int, None)
    if top is not None and not 0 <= top <= MAX_TOP_LOGPROBS:
        raise ApiError(400, f"'top_logprobs' must be an integer 0..{MAX_TOP_LOGPROBS}, got {top}", param="top_logprobs")
    if top and not wanted:
        raise ApiError(400, "'top_logprobs' needs 'logprobs': true", param="top_logprobs")
    return (top or 0) if wanted else None


def _include_usage(body: dict, stream: bool) -> bool:
    options = body.get("stream_options")
    if options is None:
        return False
    if not isinstance(options, dict):
        message = "'stream_options' must be an object such as {\"include_usage\": true}"
        raise ApiError(400, message, param="stream_options")
    if not stream:
        raise ApiError(400, "'stream_options' is only taken with 'stream': true", param="stream_options")
    return _flag(options, "include_usage", False)


def _one_choice(body: dict) -> None:
    """n > 1 is refused: one request is one reply here. Send n requests instead (with `serve --parallel N`
    they decode together, each with its own seed), which is what n would cost anyway."""
    n = _number(body, "n", int, 1)
    if n != 1:
        message = (
            f"'n': only n=1 is served: one request is one reply (got n={n}); send {n} requests instead "
            "(they decode together with serve --parallel), each with its own seed for different samples"
        )
        raise ApiError(400, message, param="n")


def _settings(body: dict, max_tokens: int, block: int | str, **extra: Any) -> GenerationSettings:
    """The settings both routes read alike (OpenAI's sampling fields and gemma-chat's drafter fields) and
    each route's `extra`, validated: a bad value is a 400."""
    settings = GenerationSettings(
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", float, 0.0),
        top_p=_number(body, "top_p", float, 1.0),
        top_k=_number(body, "top_k", int, 0),
        seed=_number(body, "seed", int, None),
        block_size=block,
        drafter_enabled=_flag(body, "drafter", True),
        ignore_eos=_flag(body, "ignore_eos", False),
        **extra,
    )
    try:
        settings.validate()
    except ValueError as e:
        raise ApiError(400, str(e)) from None
    return settings


def parse_chat_request(body: Any, config: ServerConfig) -> ChatRequest:
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    refuse_unserved(body)
    messages = parse_messages(body.get("messages"), config.allow_file_urls)
    _one_choice(body)
    stops = _stops(body)
    block = _block_size(body)
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise ApiError(400, "'chat_template_kwargs' must be an object", param="chat_template_kwargs")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    settings = _settings(
        body,
        _number({"max_tokens": max_tokens}, "max_tokens", int, config.max_tokens),
        block,
        thinking=_flag(kwargs, "enable_thinking", False),
        image_budget=_number(body, "image_budget", int, None),
        logprobs=_chat_logprobs(body),
    )
    tools, parallel, settings.tool_choice = parse_tools(body)
    stream = _flag(body, "stream", False)
    return ChatRequest(messages, settings, stream, stops, tools, parallel, _include_usage(body, stream))


COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
# /v1/completions fields this server does not serve, with what asking for nothing looks like
COMPLETION_UNSERVED = {"echo": (None, False), "suffix": (None, ""), "best_of": (None, 1)}


def _prompt(body: dict) -> str | list[int]:
    """One prompt: a string, a list holding one string, or token ids (fed as they are, no BOS added)."""
    raw = body.get("prompt")
    if isinstance(raw, list) and len(raw) == 1 and isinstance(raw[0], (str, list)):
        raw = raw[0]  # a batch of one
    if isinstance(raw, str) and raw:
        return _text(raw, "'prompt'")
    if isinstance(raw, list) and raw and all(isinstance(i, int) and not isinstance(i, bool) for i in raw):
        if not all(0 <= i < INT_LIMIT for i in raw):
            raise ApiError(400, "'prompt' token ids must be integers >= 0", param="prompt")
        return list(raw)
    if isinstance(raw, list) and len(raw) > 1 and all(isinstance(p, (str, list)) for p in raw):
        raise ApiError(400, "'prompt': one prompt per request (send one request per prompt)", param="prompt")
    raise ApiError(400, "'prompt' must be a non-empty string (or a list of token ids)", param="prompt")


def parse_completion_request(body: Any, config: ServerConfig) -> ChatRequest:
    """A /v1/completions body: a plain prompt, sampling, `stop`, `max_tokens` (default 16, as OpenAI),
    `logprobs` (an integer 0..20: the alternatives per token), `stream` and `stream_options`."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    for key, nothing in COMPLETION_UNSERVED.items():
        value = body.get(key)
        if not any(value == d and type(value) is type(d) for d in nothing):
            raise ApiError(400, f"'{key}' is not served by gemma-chat serve's /v1/completions; leave it out", param=key)
    prompt = _prompt(body)
    _one_choice(body)
    top = _number(body, "logprobs", int, None)
    if top is not None and not 0 <= top <= MAX_TOP_LOGPROBS:
        raise ApiError(400, f"'logprobs' must be an integer 0..{MAX_TOP_LOGPROBS}, got {top}", param="logprobs")
    block = _block_size(body)
    settings = _settings(body, _number(body, "max_tokens", int, COMPLETION_DEFAULT_MAX_TOKENS), block, logprobs=top)
    stream = _flag(body, "stream", False)
    return ChatRequest([], settings, stream, _stops(body), include_usage=_include_usage(body, stream), prompt=prompt)


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


@dataclass
class TurnHandle:
    """One request's turn on the engine: its future once submitted (the gate stops it by it)."""

    future: Any = None


class EngineGate:
    """Admits turns to the engine in arrival order (FIFO): up to `slots` run at once (the engine's
    `parallel`: its batch decodes them together), at most `max_waiting` wait behind them."""

    def __init__(self, engine: Any, max_waiting: int, slots: int = 1) -> None:
        self.engine = engine
        self.max_waiting = max_waiting
        self.slots = max(1, slots)
        self.active = 0  # turns holding a slot
        self._waiters: collections.deque[asyncio.Future] = collections.deque()

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    @property
    def running(self) -> bool:
        return self.active > 0

    def full(self) -> bool:
        """A new request would be refused (429): every slot taken and the wait line full."""
        return self.active >= self.slots and self.waiting >= self.max_waiting

    async def _acquire(self) -> None:
        if self.active < self.slots and not self._waiters:
            self.active += 1
            return
        if self.full():
            raise Busy()
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter  # a releasing turn hands its slot over (active stays the same)
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self._release()  # the slot was handed over just as this request went away
            else:
                self._waiters.remove(waiter)
            raise

    def _release(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.active -= 1

    def stop(self, handle: TurnHandle) -> None:
        """Cancel this request's turn only (the engine stops it within one round)."""
        if handle.future is None:
            return
        cancel_turn = getattr(self.engine, "cancel_turn", None)
        if cancel_turn is not None:
            cancel_turn(handle.future)
        else:
            self.engine.cancel()

    async def turn(
        self,
        messages: list[dict],
        settings: GenerationSettings,
        handle: TurnHandle | None = None,
        tools: list[dict] | None = None,
        prompt: str | list[int] | None = None,
    ) -> AsyncGenerator[list, None]:
        """The turn's engine events, in batches of what arrived together. Closing the iterator early
        (client gone) cancels the turn and waits for the engine to finish it before its slot is free."""
        handle = handle or TurnHandle()
        await self._acquire()
        try:
            loop = asyncio.get_running_loop()
            events: asyncio.Queue = asyncio.Queue()

            def on_event(ev: object) -> None:  # engine thread
                with contextlib.suppress(RuntimeError):  # the loop is closed: the server has stopped
                    loop.call_soon_threadsafe(events.put_nowait, ev)

            if prompt is not None:  # /v1/completions: no chat template
                future = self.engine.complete(prompt, settings, on_event)
            elif tools:
                future = self.engine.chat(messages, settings, on_event, tools=tools)
            else:
                future = self.engine.chat(messages, settings, on_event)
            handle.future = future
            # an engine whose turn fails without its TurnDone (a bug) must not hang the request forever
            future.add_done_callback(lambda f: on_event(_TurnEnded(f)))
            finished = False
            try:
                while not finished:
                    batch = [await events.get()]
                    while not events.empty():  # what arrived together leaves together (one SSE chunk)
                        batch.append(events.get_nowait())
                    ended = [e for e in batch if isinstance(e, _TurnEnded)]
                    batch = [e for e in batch if not isinstance(e, _TurnEnded)]
                    finished = bool(batch) and isinstance(batch[-1], TurnDone)
                    if batch:
                        yield batch
                    if ended and not finished:
                        finished = True  # nothing is left to cancel
                        raise RuntimeError(
                            f"the engine ended the turn without a reply: {ended[0].future.exception()!r}"
                        )
            finally:
                if not finished:
                    self.stop(handle)
                    with contextlib.suppress(Exception):
                        await asyncio.shield(asyncio.wrap_future(future))
        finally:
            self._release()


@dataclasses.dataclass(frozen=True)
class _TurnEnded:
    """The engine's future for a turn is done (normally after its TurnDone has been delivered)."""

    future: concurrent.futures.Future


# -- responses ---------------------------------------------------------------------------------------


def _flat(ev: RoundEvent | PrefillDone) -> dict:
    """A flat event's fields as a dict: what `dataclasses.asdict` gives for it, without its deep copy
    (6.2 against 0.23 µs here, once per round per stream on the server's event loop)."""
    return dict(vars(ev))


def _token_json(t: TokenEvent) -> dict:
    token = {"id": t.id, "text": t.text, "from_draft": t.from_draft, "round": t.round}
    if t.call_text:  # a tool call's token: a `--connect` chat shows the call as written, in its colours
        token["call_text"] = t.call_text
    return token


def _usage(done: TurnDone, completion_tokens: int) -> dict:
    prompt = done.stats.prompt_tokens
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": done.stats.reused_tokens},  # as OpenAI reports reuse
    }


def _finish_reason(done: TurnDone, stopped: bool, calls: ToolCallsOut | None = None) -> str:
    if calls is not None and calls.sent:
        return "tool_calls"
    return "stop" if stopped else FINISH_REASONS.get(done.stats.stop_reason, "stop")


class ToolCallsOut:
    """The reply's tool calls as OpenAI `tool_calls` items, each whole once the model closed it (as
    Ollama and mlx-lm stream them): a call that turns out malformed is then never half sent. It comes
    back as content instead (its raw text, as vLLM does), with the reason in the gemma_chat object.
    With `parallel_tool_calls: false` only the first call is kept; `full` says the turn may stop."""

    def __init__(self, parallel: bool) -> None:
        self.parallel = parallel
        self.sent: list[dict] = []
        self.errors: list[dict] = []

    @property
    def full(self) -> bool:
        return not self.parallel and bool(self.sent)

    def take(self, ev: ToolCall | ToolCallError) -> tuple[dict | None, str]:
        """(a `tool_calls` item to send, text to send as content)."""
        if self.full:
            return None, ""
        if isinstance(ev, ToolCallError):
            log.warning("%s", ev.message)
            self.errors.append({"message": ev.message, "raw": ev.raw})
            return None, ev.raw
        item = {"index": len(self.sent), **ev.openai()}
        self.sent.append(item)
        return item, ""

    def message_items(self) -> list[dict]:
        return [{k: v for k, v in item.items() if k != "index"} for item in self.sent]


class _Disconnected(Exception):
    pass


async def _no_receive() -> dict[str, Any]:
    """The `receive` handed to a response sent after the request body was read (it never reads)."""
    return {"type": "http.disconnect"}


async def _until_disconnect(receive: Any, work: Coroutine[Any, Any, Any]) -> Any:
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


@dataclass
class _StreamState:
    """What one streamed reply has sent so far."""

    scanner: StopScanner
    calls: ToolCallsOut
    streamed: list[TokenEvent] = dataclasses.field(default_factory=list)  # tokens sent
    held_rounds: list[dict] = dataclasses.field(default_factory=list)
    cancelled: bool = False
    done: TurnDone | None = None
    offset: int = 0  # characters of content sent (a completion's logprobs count their text_offset from 0)
    usage: dict | None = None


class ChatCompletion(Response):
    """The ASGI response of one /v1/chat/completions request (streamed or not)."""

    ID_PREFIX = "chatcmpl-"
    CHUNK_OBJECT = "chat.completion.chunk"

    def __init__(self, gate: EngineGate, request: ChatRequest, model_id: str) -> None:
        self.gate, self.request, self.model_id = gate, request, model_id
        self.handle = TurnHandle()
        self.id = f"{self.ID_PREFIX}{uuid.uuid4().hex[:24]}"
        self.streaming = False  # the 200 and its headers are out
        self.created = int(time.time())
        self.background = None
        self.logprobs = request.settings.logprobs is not None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.scope = scope
        r = self.request
        events = self.gate.turn(r.messages, r.settings, self.handle, r.tools, r.prompt)
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

    async def _first(self, events: AsyncGenerator[list, None]) -> list:
        """Wait for the turn to start (PrefillDone) or to be refused (TurnDone); what came before (notices) with it."""
        head: list = []
        try:
            while not any(isinstance(ev, (PrefillDone, TurnDone)) for ev in head):
                head += await events.__anext__()
            return head
        except Busy:
            raise ApiError(429, "the server is busy: too many requests waiting; retry later", "server_busy") from None

    async def _respond(self, events: AsyncGenerator[list, None], send: Any) -> None:
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

    def _choice(self, delta: dict, finish: str | None, tokens: list[TokenEvent], state: _StreamState | None) -> dict:
        """A chunk's choice: the delta, and the logprobs of its tokens when asked for."""
        logprobs = {"content": logprob_content(tokens)} if self.logprobs and tokens else None
        return {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}

    def _chunk(
        self,
        delta: dict,
        ext: dict | None = None,
        finish: str | None = None,
        usage: dict | None = None,
        tokens: list[TokenEvent] | None = None,
        state: _StreamState | None = None,
    ) -> bytes:
        chunk: dict[str, Any] = {
            "id": self.id,
            "object": self.CHUNK_OBJECT,
            "created": self.created,
            "model": self.model_id,
            "choices": [self._choice(delta, finish, tokens or [], state)],
        }
        if self.request.include_usage:
            chunk["usage"] = None  # as OpenAI: null on every chunk but the last, which has no choices
        elif usage is not None:
            chunk["usage"] = usage
        if ext:
            chunk[EXTENSION] = ext
        return _sse(chunk)

    def _usage_chunk(self, usage: dict) -> bytes:
        """stream_options.include_usage: the last chunk, with the usage and an empty `choices`."""
        chunk = {"id": self.id, "object": self.CHUNK_OBJECT, "created": self.created, "model": self.model_id}
        return _sse({**chunk, "choices": [], "usage": usage})

    def _opening(self) -> bytes:
        return self._chunk({"role": "assistant", "content": ""})

    async def _stream(self, head: list, events: AsyncGenerator[list, None], send: Any) -> None:
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

        if opening := self._opening():
            await write(opening)
        state = _StreamState(StopScanner(self.request.stops), ToolCallsOut(self.request.parallel_tool_calls))
        queue = list(head)
        it = events.__aiter__()
        while state.done is None:
            if not queue:
                queue.extend(await it.__anext__())
            delta, ext, tokens = self._stream_batch(queue, state)
            queue.clear()
            if ext or delta:
                await write(self._chunk(delta, ext, tokens=tokens, state=state))
                state.offset += len(delta.get("content") or "")
            if (state.scanner.stopped or state.calls.full) and state.done is None and not state.cancelled:
                self.gate.stop(self.handle)  # the client has all it asked for; the turn ends within a round
                state.cancelled = True
        await write(self._last_chunk(state.done, state))
        if self.request.include_usage and state.usage is not None:
            await write(self._usage_chunk(state.usage))
        await write(b"data: [DONE]\n\n")
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    def _stream_batch(self, batch: list, state: _StreamState) -> tuple[dict, dict, list[TokenEvent]]:
        """One chunk's delta, gemma_chat object and released tokens from the events that arrived together."""
        tokens: list[TokenEvent] = []
        ext: dict[str, Any] = {}
        items: list[dict] = []
        extra = ""  # malformed calls' raw text, sent as content
        for ev in batch:
            if isinstance(ev, TokenEvent):
                tokens.append(ev)
            elif isinstance(ev, RoundEvent):
                state.held_rounds.append(_flat(ev))
            elif isinstance(ev, PrefillDone):
                ext["prefill"] = _flat(ev)
            elif isinstance(ev, Notice):
                ext.setdefault("notices", []).append(ev.text)
            elif isinstance(ev, (ToolCall, ToolCallError)):
                item, raw = state.calls.take(ev)
                items += [item] if item is not None else []
                extra += raw
            elif isinstance(ev, TurnDone):
                state.done = ev
        tokens = state.scanner.feed(tokens)
        if state.done is not None:
            tokens += state.scanner.flush()
        if tokens:
            ext["tokens"] = [_token_json(t) for t in tokens]
            state.streamed.extend(tokens)
        # A round's summary comes just after its tokens, often a wake-up later: it rides on the
        # next chunk rather than costing one of its own.
        if state.held_rounds and (ext or state.done is not None):
            ext["rounds"], state.held_rounds = state.held_rounds, []
        if extra:
            ext["tool_errors"] = state.calls.errors[-1:]
        delta: dict[str, Any] = {}
        if tokens or extra:
            delta["content"] = "".join(t.text for t in tokens) + extra
        if items:
            delta["tool_calls"] = items
        return delta, ext, tokens

    def _last_chunk(self, done: TurnDone | None, state: _StreamState) -> bytes:
        assert done is not None
        if done.error:
            err = {"error": {"message": done.error, "type": "server_error", "param": None, "code": 500}}
            return b"data: " + json.dumps(err).encode() + b"\n\n"
        scanner, streamed = state.scanner, state.streamed
        text = "".join(t.text for t in streamed)
        tail = ""
        if not scanner.stops and done.text.startswith(text) and len(done.text) > len(text):
            tail = done.text[len(text) :]  # bytes the detokenizer held back until the end
        cut = scanner.stopped or state.calls.full
        state.usage = _usage(done, len(streamed) if cut else len(done.token_ids))
        return self._chunk(
            {"content": tail} if tail else {},
            {"stats": done.stats.as_dict()},
            finish=_finish_reason(done, scanner.stopped, state.calls),
            usage=state.usage,
            state=state,
        )

    async def _whole(self, head: list, events: AsyncGenerator[list, None], send: Any) -> None:
        scanner = StopScanner(self.request.stops)
        calls = ToolCallsOut(self.request.parallel_tool_calls)
        tokens: list[TokenEvent] = []
        notices: list[str] = []
        extra = ""  # malformed calls' raw text
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
            elif isinstance(ev, Notice):
                notices.append(ev.text)
            elif isinstance(ev, (ToolCall, ToolCallError)):
                extra += calls.take(ev)[1]
            elif isinstance(ev, TurnDone):
                done = ev
                tokens += scanner.flush()
            if (scanner.stopped or calls.full) and done is None and not cancelled:
                self.gate.stop(self.handle)  # the turn ends within a round; its TurnDone still comes
                cancelled = True
        if done.error:
            await error_response(500, done.error, "server_error")(self.scope, _no_receive, send)
            return
        body = self._whole_body(done, tokens, scanner, calls, extra)
        if notices:
            body[EXTENSION]["notices"] = notices
        await JSONResponse(body)(self.scope, _no_receive, send)

    def _whole_choice(self, text: str, calls: ToolCallsOut, tokens: list[TokenEvent], finish: str) -> dict:
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if calls.sent:
            message["tool_calls"] = calls.message_items()
            message["content"] = text or None
        logprobs = {"content": logprob_content(tokens), "refusal": None} if self.logprobs else None
        return {"index": 0, "message": message, "logprobs": logprobs, "finish_reason": finish}

    def _whole_body(
        self, done: TurnDone, tokens: list[TokenEvent], scanner: StopScanner, calls: ToolCallsOut, extra: str
    ) -> dict:
        text = "".join(t.text for t in tokens)
        if not scanner.stops and done.text.startswith(text):
            text = done.text
        text += extra
        ext: dict[str, Any] = {"stats": done.stats.as_dict(), "tokens": [_token_json(t) for t in tokens]}
        if calls.errors:
            ext["tool_errors"] = calls.errors
        cut = scanner.stopped or calls.full
        return {
            "id": self.id,
            "object": self.CHUNK_OBJECT.removesuffix(".chunk"),
            "created": self.created,
            "model": self.model_id,
            "choices": [self._whole_choice(text, calls, tokens, _finish_reason(done, scanner.stopped, calls))],
            "usage": _usage(done, len(tokens) if cut else len(done.token_ids)),
            EXTENSION: ext,
        }


class TextCompletion(ChatCompletion):
    """The ASGI response of one /v1/completions request: the same turn as a chat completion, prompted
    without the chat template, answered as OpenAI's `text_completion` objects (`choices[].text`, the
    legacy `logprobs` lists)."""

    ID_PREFIX = "cmpl-"
    CHUNK_OBJECT = "text_completion"

    def _choice(self, delta: dict, finish: str | None, tokens: list[TokenEvent], state: _StreamState | None) -> dict:
        offset = state.offset if state is not None else 0
        logprobs = legacy_logprobs(tokens, offset) if self.logprobs and tokens else None
        return {"index": 0, "text": delta.get("content") or "", "logprobs": logprobs, "finish_reason": finish}

    def _opening(self) -> bytes:
        return b""  # a completion's stream has no role chunk

    def _whole_choice(self, text: str, calls: ToolCallsOut, tokens: list[TokenEvent], finish: str) -> dict:
        logprobs = legacy_logprobs(tokens, 0) if self.logprobs else None
        return {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}


def _sse(chunk: dict) -> bytes:
    return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"


# -- logprobs ----------------------------------------------------------------------------------------

LOGPROB_FLOOR = -9999.0  # OpenAI's stand-in for a probability of 0 (JSON has no -Infinity)


def token_string(data: bytes) -> str:
    """A token's text as OpenAI shows it: its UTF-8 text, or for a token that is part of a character
    (byte fallback) its bytes escaped ("\\xe2"); `bytes` carries them exactly."""
    return data.decode("utf-8", "backslashreplace")


def _logprob(value: float) -> float:
    return value if value > LOGPROB_FLOOR else LOGPROB_FLOOR  # also turns NaN into the floor


def _scored(tokens: list[TokenEvent]) -> list[TokenLogprob]:
    """The tokens' logprobs, for the tokens that are text of the reply (not its end-of-turn token)."""
    return [t.logprob for t in tokens if t.logprob is not None and t.logprob.token]


def logprob_content(tokens: list[TokenEvent]) -> list[dict]:
    """Chat completions' `logprobs.content`: per token {token, logprob, bytes, top_logprobs}."""
    out = []
    for lp in _scored(tokens):
        top = [{"token": token_string(b), "logprob": _logprob(v), "bytes": list(b)} for _, b, v in lp.top]
        out.append({"token": token_string(lp.token), "logprob": _logprob(lp.logprob), "bytes": list(lp.token)})
        out[-1]["top_logprobs"] = top
    return out


def legacy_logprobs(tokens: list[TokenEvent], offset: int) -> dict:
    """/v1/completions' `logprobs`: {tokens, token_logprobs, top_logprobs, text_offset}, the offsets
    counted in characters of the whole reply (`offset`: where these tokens' text starts)."""
    out: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for t in tokens:
        lp = t.logprob
        if lp is not None and lp.token:
            out["tokens"].append(token_string(lp.token))
            out["token_logprobs"].append(_logprob(lp.logprob))
            out["top_logprobs"].append({token_string(b): _logprob(v) for _, b, v in lp.top})
            out["text_offset"].append(offset)
        offset += len(t.text)
    return out


# -- requests from outside: host, origin, body ----------------------------------------------------------


class _ClientGone(Exception):
    """The client closed the connection before its request body was complete."""


async def read_json(request: Request, config: ServerConfig) -> Any:
    """The request's JSON body, read within `body_timeout_s` and `max_body_bytes` (413 past it, before
    reading when Content-Length says so); nesting too deep for the parser is a 400 like any bad JSON."""
    limit = config.max_body_bytes
    too_big = f"this server takes request bodies up to {format_bytes(limit)}"
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"the request body is {format_bytes(int(declared))}; {too_big}", "request_too_large")
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(config.body_timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise ApiError(413, f"the request body is larger than {format_bytes(limit)}; {too_big}")
                chunks.append(chunk)
    except TimeoutError:
        message = f"the request body did not arrive within {config.body_timeout_s:g} s"
        raise ApiError(408, message, "timeout") from None
    except ClientDisconnect:
        raise _ClientGone() from None
    try:
        return json.loads(b"".join(chunks))
    except RecursionError:
        raise ApiError(400, "the request body nests arrays or objects too deeply to be a request") from None
    except ValueError:  # JSONDecodeError, UnicodeDecodeError, an integer of more than 4300 digits
        raise ApiError(400, "the request body is not valid JSON") from None


class RequestGuard:
    """ASGI middleware in front of every route: a request must be addressed to this server (Host: a
    loopback name or a configured one, against DNS rebinding), come from no web page of another site
    (Origin, when a browser sends one, names the same host), and POST JSON as JSON (a page's form or
    `text/plain` fetch needs no CORS preflight; `application/json` does). An exception that escapes a
    route is one log line and an OpenAI-shaped 500, not a traceback."""

    def __init__(self, app: Any, config: ServerConfig) -> None:
        self.app, self.config = app, config

    def refusal(self, scope: dict) -> JSONResponse | None:
        headers = Headers(scope=scope)
        host = headers.get("host")
        name = host_name(host) if host is not None else None
        if name is not None and not self.config.host_allowed(name):
            message = (
                f"requests addressed to {_show(host)} are refused: this server answers requests for 127.0.0.1 "
                "or localhost (a web page that makes its own name point here must not use it)"
            )
            return error_response(400, message, "invalid_request_error")
        origin = headers.get("origin")
        if origin is not None:
            origin_host = urlparse(origin).hostname if origin != "null" else None
            if origin_host is None or origin_host.rstrip(".") != name or not self.config.host_allowed(origin_host):
                message = f"cross-origin requests are refused (Origin: {_show(origin)}): web pages cannot use this API"
                return error_response(403, message, "forbidden")
        if scope["method"] == "POST":
            kind = headers.get("content-type", "")
            if kind.split(";")[0].strip().lower() != "application/json":
                message = f"the request body must be sent as Content-Type: application/json, got {_show(kind)}"
                return error_response(415, message, "invalid_request_error")
        return None

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refused = self.refusal(scope)
        if refused is not None:
            await refused(scope, receive, send)
            return
        started = False

        async def tracked(message: dict) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as e:  # the route's bug: one line here, the client gets a 500 it can read
            log.error("internal error answering %s %s: %s: %s", scope["method"], scope["path"], type(e).__name__, e)
            if not started:
                await error_response(500, f"internal error: {type(e).__name__}", "server_error")(scope, receive, send)


# -- the application ---------------------------------------------------------------------------------


def create_app(engine: Any, config: ServerConfig) -> RequestGuard:
    """The ASGI app over a loaded engine (an Engine or anything with its chat/cancel API)."""
    gate = EngineGate(engine, config.max_waiting, getattr(engine, "parallel", 1))
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
        body = {"status": "ok", "model": config.model_id, "busy": gate.running, "waiting": gate.waiting}
        return JSONResponse({**body, "running": gate.active, "parallel": gate.slots})

    async def models(request: Request) -> Response:
        if not authorised(request):
            return unauthorised()
        return JSONResponse({"object": "list", "data": [model_card(engine, config, created)]})

    async def chat_completions(request: Request) -> Response:
        if not authorised(request):
            return unauthorised()
        try:
            parsed = parse_chat_request(await read_json(request, config), config)
            refuse_unheard_audio(engine, parsed.messages)
        except ApiError as e:
            return e.response()
        except _ClientGone:
            return _client_gone(request)
        if parsed.tools and not engine.features.tools:
            message = "'tools': this model cannot call tools (its vocabulary has no tool-call tokens)"
            return error_response(400, message, "invalid_request_error", "tools")
        return _busy() if gate.full() else ChatCompletion(gate, parsed, config.model_id)

    async def completions(request: Request) -> Response:
        if not authorised(request):
            return unauthorised()
        return await _completion(request, engine, config, gate)

    async def control(request: Request) -> Response:
        if not authorised(request):
            return unauthorised()
        try:
            body = await read_json(request, config)
            if not isinstance(body, dict):
                raise ApiError(400, "the request body must be a JSON object")
            drafter = _flag(body, "drafter_enabled", True) if "drafter_enabled" in body else None
        except ApiError as e:
            return e.response()
        except _ClientGone:
            return _client_gone(request)
        try:
            if "block_size" in body:
                engine.set_block_size(body["block_size"])
        except ValueError as e:
            return error_response(400, str(e), "invalid_request_error", "block_size")
        if drafter is not None:
            engine.set_drafter_enabled(drafter)
        return JSONResponse({"ok": True, "running": gate.running})

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/gemma-chat/control", control, methods=["POST"]),
    ]
    handlers = {404: not_found, 405: method_not_allowed, Exception: internal_error}
    app = Starlette(routes=routes, exception_handlers=handlers)
    app.state.gate = gate
    return RequestGuard(app, config)


async def _completion(request: Request, engine: Any, config: ServerConfig, gate: EngineGate) -> Response:
    """POST /v1/completions, once authorised."""
    try:
        parsed = parse_completion_request(await read_json(request, config), config)
    except ApiError as e:
        return e.response()
    except _ClientGone:
        return _client_gone(request)
    if getattr(engine, "complete", None) is None:
        return error_response(404, "this server's engine does not serve plain completions", "not_found")
    vocab = engine.info.vocab_size if engine.info is not None else 0
    if isinstance(parsed.prompt, list) and vocab and max(parsed.prompt) >= vocab:
        message = f"'prompt' holds token id {max(parsed.prompt)}; this model's ids are 0..{vocab - 1}"
        return error_response(400, message, "invalid_request_error", "prompt")
    return _busy() if gate.full() else TextCompletion(gate, parsed, config.model_id)


def _busy() -> JSONResponse:
    message = "the server is busy: too many requests waiting; retry later"
    return error_response(429, message, "server_busy", None, {"retry-after": "1"})


def model_card(engine: Any, config: ServerConfig, created: int) -> dict:
    info = engine.info
    ext = {"controls": True, "token_origin": True}
    if info is not None:
        ext["tools"] = engine.features.tools
        ext.update(
            pairing=info.name,
            drafter=info.drafter_path is not None,
            demo=info.demo,
            has_vision=info.has_vision,
            has_audio=info.has_audio,
            context_length=info.context_length,
            dtype=info.dtype,
            supports_thinking=info.supports_thinking,
        )
    return {"id": config.model_id, "object": "model", "created": created, "owned_by": "gemma-chat", EXTENSION: ext}


async def not_found(request: Request, exc: Exception) -> Response:
    return error_response(404, f"no route {request.method} {request.url.path}", "not_found")


async def method_not_allowed(request: Request, exc: Exception) -> Response:
    return error_response(405, f"{request.method} is not allowed on {request.url.path}", "invalid_request_error")


async def internal_error(request: Request, exc: Exception) -> Response:
    return error_response(500, f"internal error: {type(exc).__name__}", "server_error")


def _client_gone(request: Request) -> Response:
    client = request.client
    log.warning("a client%s left before its request body was complete", f" ({client.host})" if client else "")
    return Response(status_code=400)  # nobody reads it


# -- uvicorn: slow and idle connections, too many of them ---------------------------------------------


def _raw_response(status: int, reason: str, message: str, type_: str) -> bytes:
    """A whole HTTP/1.1 error response with its OpenAI-shaped body, for the connection layer (no ASGI)."""
    body = json.dumps({"error": {"message": message, "type": type_, "param": None, "code": status}}).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    )
    return head.encode() + body


def guarded_protocol(header_timeout_s: float, max_connections: int) -> type[asyncio.Protocol]:
    """uvicorn's h11 protocol with what it lacks against slow clients: a connection must complete its
    request's headers within `header_timeout_s` (uvicorn times out only the idle keep-alive gap), and a
    connection past `max_connections` is answered 503 and closed at once instead of held open."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class GuardedH11Protocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                message = f"the server has {max_connections} connections open; retry later"
                transport.write(_raw_response(503, "Service Unavailable", message, "server_busy"))
                transport.close()
                return
            self._header_timer = self.loop.call_later(header_timeout_s, self._headers_late)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.conn.their_state is not h11.IDLE:  # the request's headers are in
                self._stop_header_timer()
            elif self._header_timer is None and not self.transport.is_closing():  # a keep-alive request begins
                self._header_timer = self.loop.call_later(header_timeout_s, self._headers_late)

        def connection_lost(self, exc: Exception | None) -> None:
            self._stop_header_timer()
            super().connection_lost(exc)

        def _stop_header_timer(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_late(self) -> None:
            self._header_timer = None
            if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
                return
            if self.cycle is None or self.cycle.response_complete:  # between requests: nothing half sent
                message = f"the request headers did not arrive within {header_timeout_s:g} s"
                self.transport.write(_raw_response(408, "Request Timeout", message, "timeout"))
            self.transport.close()

    return GuardedH11Protocol


class _OnceAMinute(logging.Filter):
    """asyncio logs a traceback for every accept() that fails for want of file descriptors, thousands a
    second while they are short: one line a minute says it as well."""

    def __init__(self) -> None:
        super().__init__()
        self.last = -1e9

    def filter(self, record: logging.LogRecord) -> bool:
        if "out of system resource" not in str(record.msg):
            return True
        now = time.monotonic()
        if now - self.last < 60:
            return False
        self.last = now
        record.msg, record.args, record.exc_info = "cannot accept connections: out of file descriptors", (), None
        return True


def quiet_accept_errors() -> None:
    logger = logging.getLogger("asyncio")
    if not any(isinstance(f, _OnceAMinute) for f in logger.filters):
        logger.addFilter(_OnceAMinute())


def uvicorn_config(app: Any, config: ServerConfig, **kwargs: Any) -> Any:
    """The uvicorn.Config `serve` and BackgroundServer run `app` with (`kwargs`: host, port, ...)."""
    import uvicorn

    quiet_accept_errors()
    return uvicorn.Config(
        app,
        http=guarded_protocol(config.header_timeout_s, config.max_connections),
        timeout_keep_alive=int(KEEP_ALIVE_S),
        backlog=ACCEPT_BURST,
        log_level="warning",
        access_log=False,
        **kwargs,
    )


class BackgroundServer:
    """uvicorn on a daemon thread (tests, benchmarks): `with BackgroundServer(app) as url: ...`.
    Port 0 picks a free port; `url` is the base URL, e.g. http://127.0.0.1:53123."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, config: ServerConfig | None = None) -> None:
        import socket

        import uvicorn

        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, port))
        self.url = f"http://{host}:{self._socket.getsockname()[1]}"
        if config is None:  # the app's own limits when it is gemma-chat's; the defaults for a test's stand-in
            config = app.config if isinstance(app, RequestGuard) else ServerConfig("background")
        self.server = uvicorn.Server(uvicorn_config(app, config, lifespan="off"))
        self._thread: threading.Thread | None = None

    def __enter__(self) -> str:
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

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._socket.close()
