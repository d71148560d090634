"""Gemma 4 tool calls out of a reply's token stream, as they stream.

The model writes a call as special tokens around a small argument syntax (reference
tools-and-audio.md A2.1):

    <|tool_call>call:NAME{key:value,...}<tool_call|>     several in a row, then <|tool_response> (a stop)
    value := <|"|>text<|"|> | number | true | false | null | {key:value,...} | [value,...]

`ToolCallParser` is fed every emitted token (its id and the detokenizer's text delta) and splits
the reply into content text and calls. Structure is recognised by token id, never by text, so a
reply that writes "<|tool_call>" as plain characters stays text, and a `<|"|>` token can never be
confused with those five characters inside a string. A call's tokens are never content: they come
out as events (see `core.events`):

    ToolCallStarted(index, id, name)      once the name is complete (at "{")
    ToolCallDelta(index, arguments)       fragments of the arguments' JSON text, as soon as they are
                                          certain; one call's fragments concatenate to its
                                          ToolCall.arguments_json (what OpenAI streams as
                                          `tool_calls[].function.arguments`)
    ToolCall(...) | ToolCallError(...)    at `<tool_call|>` (or at the end of the reply): the
                                          decoded call, or "the model produced a malformed tool
                                          call: ..." with the raw text kept

Deltas are provisional: a call that turns out malformed ends in ToolCallError after them.

A closed call's arguments go through a recursive-descent scanner that writes their JSON
(`scan_arguments`): it decides the ToolCall. While a call streams, `ArgumentStream`, the same grammar
as a push parser with an explicit stack, reads each new character once and gives the JSON that no
later text can change (a number or a bare word is held back until a delimiter ends it; a string's
characters stream), so a long call costs time in proportion to its length.

Tolerated, as peers do: keys quoted with `<|"|>` or `"`, JSON-style `"..."` strings, `None`/`nil`
for null, `True`/`False`, bare words as strings (up to the next `,` `}` `]`), trailing commas,
whitespace, a missing `call` (`<|tool_call>:name{...}` or `<|tool_call>name{...}`), a bare
`call:name{...}` right after a thought channel closes or at the start of the reply, a call opened
inside an unclosed thought channel (the channel is closed in the content), a stray `<tool_call|>`
outside a call (dropped), and a final `<tool_call|>` missing before the stop.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from core.decode.chat_format import is_tool_name_char
from core.events import TokenEvent, ToolCall, ToolCallDelta, ToolCallError, ToolCallStarted

QUOTE_TEXT = '<|"|>'
# A `<|"|>` token inside a call's text: a private-use character, so the characters `<|"|>` typed
# as plain text inside a string are never taken for a delimiter.
QUOTE = "\ue000"
MALFORMED = "the model produced a malformed tool call"
_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_NOT_BARE = set('{}[]"' + QUOTE)
_BARE_CALL = "call:"
_JSON = json.JSONDecoder(strict=False)  # a JSON-style string may hold raw newlines
_PROBE_LIMIT = 96  # characters a bare `call:name` may take before "{" (longer: it is text)


# --- the argument scanner ------------------------------------------------------------------------


class _Incomplete(Exception):
    """The text ended before the value did."""


class Malformed(ValueError):
    """Arguments that do not follow the call syntax; the message says where."""


class _Scanner:
    def __init__(self, text: str):
        self.s = text
        self.i = 0
        self.out: list[str] = []

    def peek(self) -> str:
        while self.i < len(self.s) and self.s[self.i].isspace():
            self.i += 1
        if self.i >= len(self.s):
            raise _Incomplete
        return self.s[self.i]

    def fail(self, what: str) -> Malformed:
        near = self.s[max(0, self.i - 12) : self.i + 12].replace(QUOTE, QUOTE_TEXT)
        return Malformed(f"{what} at character {self.i} (near {near!r})")

    def obj(self) -> None:
        self.i += 1  # "{"
        self.out.append("{")
        first = True
        while True:
            c = self.peek()
            if c == "}":  # also a trailing comma's end
                self.i += 1
                self.out.append("}")
                return
            if not first:
                if c != ",":
                    raise self.fail("expected ',' or '}'")
                self.i += 1
                if self.peek() == "}":
                    continue
            key = self.key()
            self.out.append(("" if first else ", ") + json.dumps(key, ensure_ascii=False) + ": ")
            first = False
            self.value()

    def array(self) -> None:
        self.i += 1  # "["
        self.out.append("[")
        first = True
        while True:
            c = self.peek()
            if c == "]":
                self.i += 1
                self.out.append("]")
                return
            if not first:
                if c != ",":
                    raise self.fail("expected ',' or ']'")
                self.i += 1
                if self.peek() == "]":
                    continue
                self.out.append(", ")
            first = False
            self.value()

    def key(self) -> str:
        c = self.peek()
        if c == QUOTE:
            key = self.quoted()
        elif c == '"':
            key = self.json_string()
        else:
            j = self.i
            while j < len(self.s) and self.s[j] != ":":
                if self.s[j] in _NOT_BARE or self.s[j] == ",":
                    self.i = j
                    raise self.fail("expected a key")
                j += 1
            if j >= len(self.s):
                raise _Incomplete
            key = self.s[self.i : j].strip()
            if not key:
                raise self.fail("empty key")
            self.i = j
        if self.peek() != ":":
            raise self.fail("expected ':' after a key")
        self.i += 1
        return key

    def quoted(self) -> str:
        """A `<|"|>...<|"|>` string (no escapes exist)."""
        j = self.s.find(QUOTE, self.i + 1)
        if j < 0:
            raise _Incomplete
        text = self.s[self.i + 1 : j]
        self.i = j + 1
        return text

    def json_string(self) -> str:
        try:
            text, end = _JSON.raw_decode(self.s, self.i)
        except json.JSONDecodeError as e:
            if "Unterminated" in e.msg:
                raise _Incomplete from None
            raise self.fail(f"bad string ({e.msg})") from None
        self.i = end
        return text

    def value(self) -> None:
        c = self.peek()
        if c == "{":
            self.obj()
        elif c == "[":
            self.array()
        elif c == QUOTE:
            self.out.append(json.dumps(self.quoted(), ensure_ascii=False))
        elif c == '"':
            self.out.append(json.dumps(self.json_string(), ensure_ascii=False))
        else:
            self.out.append(json.dumps(self.bare(), ensure_ascii=False))

    def bare(self) -> object:
        """An unquoted scalar, up to the next ',' '}' or ']': true/false, null, a number, else a string."""
        j = self.i
        while j < len(self.s) and self.s[j] not in ",}]":
            if self.s[j] in _NOT_BARE:
                self.i = j
                raise self.fail("unexpected character in a value")
            j += 1
        if j >= len(self.s):
            raise _Incomplete
        word = self.s[self.i : j].strip()
        if not word:
            raise self.fail("a value is missing")
        self.i = j
        return bare_value(word)


def bare_value(word: str) -> object:
    """An unquoted scalar: true/false, null/None/nil, a JSON number, else the word as a string."""
    low = word.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("null", "none", "nil"):
        return None
    if _NUMBER.fullmatch(word):
        if not any(c in word for c in ".eE"):
            return int(word)
        number = float(word)
        if math.isfinite(number):
            return number
    return word


def scan_arguments(text: str) -> tuple[str, int]:
    """Gemma 4 call arguments `{...}` (quote tokens as QUOTE) -> (their JSON text, characters read);
    Malformed unless the whole object is there and well formed."""
    sc = _Scanner(text)
    try:
        if sc.peek() != "{":
            raise sc.fail("expected '{'")
        sc.obj()
    except _Incomplete:
        raise Malformed("the arguments end before their closing '}'") from None
    return "".join(sc.out), sc.i


def _escaped(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)[1:-1]


# the push parser's states, one per open container
_OBJ_KEY, _OBJ_VALUE, _OBJ_AFTER = "obj:key", "obj:value", "obj:after"  # key or "}" / a value / "," or "}"
_ARR_OPEN, _ARR_COMMA, _ARR_VALUE, _ARR_AFTER = "arr:open", "arr:comma", "arr:value", "arr:after"


class ArgumentStream:
    """The argument grammar as a push parser: `feed` text as it arrives, get the JSON it makes certain.

    Every character is read once, but for a key, a JSON-style string or a bare word, which are read
    again from their start until they end (they are short). Gives up (`failed`) on text that breaks
    the grammar; the closed call's `scan_arguments` says why. The JSON it gives is a prefix of what
    `scan_arguments` gives for the whole call (the tests check that on every cut of every case)."""

    def __init__(self) -> None:
        self.buf = ""
        self.pos = 0  # the next character to read
        self.stack: list[str] = []
        self.first: list[bool] = []  # per open object: no key written yet
        self.string_at: int | None = None  # inside a <|"|> value: the first character not written yet
        self.started = self.done = self.failed = False

    def feed(self, text: str) -> str:
        self.buf += text
        out: list[str] = []
        try:
            while not (self.done or self.failed) and self._step(out):
                pass
        except Malformed:
            self.failed = True
        return "".join(out)

    def _step(self, out: list[str]) -> bool:
        """Read one lexeme if all of it is there; False: wait for more text."""
        if self.string_at is not None:
            return self._string(out)
        i = self.pos
        while i < len(self.buf) and self.buf[i].isspace():
            i += 1
        self.pos = i
        if i >= len(self.buf):
            return False
        c = self.buf[i]
        if not self.started:
            if c != "{":
                raise Malformed("expected '{'")
            self.started = True
            return self._open(_OBJ_KEY, "{", out)
        state = self.stack[-1]
        if state in (_OBJ_AFTER, _ARR_AFTER):
            close = "}" if state == _OBJ_AFTER else "]"
            if c == close:
                return self._close(close, out)
            if c != ",":
                raise Malformed("expected ',' or a closing bracket")
            self.pos += 1
            self.stack[-1] = _OBJ_KEY if state == _OBJ_AFTER else _ARR_COMMA
            return True
        if state == _OBJ_KEY:
            return self._close("}", out) if c == "}" else self._key(out)
        if state in (_ARR_OPEN, _ARR_COMMA):
            if c == "]":
                return self._close("]", out)
            if state == _ARR_COMMA:
                out.append(", ")
            self.stack[-1] = _ARR_VALUE
        return self._value(c, out)

    def _open(self, state: str, bracket: str, out: list[str]) -> bool:
        self.stack.append(state)
        self.first.append(True)
        self.pos += 1
        out.append(bracket)
        return True

    def _close(self, bracket: str, out: list[str]) -> bool:
        self.stack.pop()
        self.first.pop()
        self.pos += 1
        out.append(bracket)
        self._value_done()
        return True

    def _value_done(self) -> None:
        if not self.stack:
            self.done = True
        else:
            self.stack[-1] = _OBJ_AFTER if self.stack[-1] == _OBJ_VALUE else _ARR_AFTER

    def _string(self, out: list[str]) -> bool:
        at = self.string_at
        assert at is not None
        j = self.buf.find(QUOTE, at)
        if j < 0:
            if len(self.buf) > at:
                out.append(_escaped(self.buf[at:]))
                self.string_at = len(self.buf)
            return False
        out.append(_escaped(self.buf[at:j]) + '"')
        self.string_at, self.pos = None, j + 1
        self._value_done()
        return True

    def _key(self, out: list[str]) -> bool:
        sc = _Scanner(self.buf)  # a key is short: read it whole, again, until its ":" is there
        sc.i = self.pos
        try:
            key = sc.key()
        except _Incomplete:
            return False
        out.append(("" if self.first[-1] else ", ") + json.dumps(key, ensure_ascii=False) + ": ")
        self.first[-1] = False
        self.pos = sc.i
        self.stack[-1] = _OBJ_VALUE
        return True

    def _value(self, c: str, out: list[str]) -> bool:
        if c == "{":
            return self._open(_OBJ_KEY, "{", out)
        if c == "[":
            return self._open(_ARR_OPEN, "[", out)
        if c == QUOTE:
            out.append('"')
            self.string_at = self.pos + 1
            return True
        sc = _Scanner(self.buf)
        sc.i = self.pos
        try:
            value = sc.json_string() if c == '"' else sc.bare()
        except _Incomplete:
            return False
        out.append(json.dumps(value, ensure_ascii=False))
        self.pos = sc.i
        self._value_done()
        return True


def split_call(text: str) -> tuple[str, int] | None:
    """`call:NAME{...` -> (NAME, index of "{"), None while the name is still coming. Raises Malformed
    for a bad name. Also takes `:NAME{` and `NAME{` (a missing `call`)."""
    j = text.find("{")
    if j < 0:
        return None
    head = text[:j].strip()
    name = head[len(_BARE_CALL) :] if head.startswith(_BARE_CALL) else head[1:] if head.startswith(":") else head
    if not name or not all(is_tool_name_char(c) for c in name):
        raise Malformed(f"bad tool name {head!r}")
    return name, j


def parse_call(text: str) -> tuple[str, dict, str]:
    """A whole call's text (between the markers, quote tokens as QUOTE) -> (name, arguments, JSON)."""
    head = split_call(text)
    if head is None:
        raise Malformed("no '{' after the tool name")
    name, j = head
    arguments_json, end = scan_arguments(text[j:])
    if text[j + end :].strip():
        raise Malformed(f"text after the arguments: {text[j + end :].strip()[:40]!r}")
    return name, json.loads(arguments_json), arguments_json


def parse_call_text(text: str) -> tuple[str, dict, str]:
    """parse_call on text that writes the quote token as `<|"|>` (tests, histories)."""
    return parse_call(text.replace(QUOTE_TEXT, QUOTE))


# --- the stream parser ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolMarkers:
    """The token ids of the markers the parser reacts to (their text is fixed by Gemma 4's vocabulary)."""

    call_start: int  # <|tool_call>
    call_end: int  # <tool_call|>
    quote: int  # <|"|>
    response: frozenset[int]  # <|tool_response>, <tool_response|>: never content
    channel_start: int | None = None  # <|channel>
    channel_end: int | None = None  # <channel|>


MARKER_TEXT = {
    "call_start": "<|tool_call>",
    "call_end": "<tool_call|>",
    "quote": QUOTE_TEXT,
    "response_start": "<|tool_response>",
    "response_end": "<tool_response|>",
    "channel_start": "<|channel>",
    "channel_end": "<channel|>",
}


def tool_markers(vocab: Mapping[str, int]) -> ToolMarkers | None:
    """The markers' ids from a tokenizer's vocabulary (`get_vocab()`); None if it has no tool calls."""
    ids = {k: vocab.get(v) for k, v in MARKER_TEXT.items()}
    if ids["call_start"] is None or ids["call_end"] is None or ids["quote"] is None:
        return None
    return ToolMarkers(
        call_start=ids["call_start"],
        call_end=ids["call_end"],
        quote=ids["quote"],
        response=frozenset(i for i in (ids["response_start"], ids["response_end"]) if i is not None),
        channel_start=ids["channel_start"],
        channel_end=ids["channel_end"],
    )


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


Event = ToolCallStarted | ToolCallDelta | ToolCall | ToolCallError


@dataclass
class _OpenCall:
    index: int
    text: str = ""  # after <|tool_call> (or from "call:" for a bare call), quote tokens as QUOTE
    marker: str = MARKER_TEXT["call_start"]  # what opened it ("" for a bare call)
    id: str | None = None  # set once ToolCallStarted went out
    sent: str = ""  # the argument JSON streamed so far
    stream_ok: bool = True
    args: ArgumentStream | None = None  # streams the arguments once the name is complete
    fed: int = 0  # characters of `text` the stream has read

    def raw(self, closed: bool) -> str:
        return self.marker + self.text.replace(QUOTE, QUOTE_TEXT) + (MARKER_TEXT["call_end"] if closed else "")


@dataclass
class ToolCallParser:
    """One reply's splitter: `feed` each emitted token, `finish` at the end (see the module docstring).

    starts_in_thought: the prompt ends inside an open thought channel (after a tool result with
    thinking on): the content gets the channel's opening text first, so that
    `core.decode.prompt.split_thinking` sees the reply's reasoning as reasoning."""

    markers: ToolMarkers
    starts_in_thought: bool = False
    new_id: Callable[[], str] = new_call_id
    calls: list[ToolCall] = field(default_factory=list)
    errors: list[ToolCallError] = field(default_factory=list)
    _content: list[str] = field(default_factory=list)
    _call: _OpenCall | None = None
    _probe: str | None = ""  # withheld text that may be a bare `call:name{`; None: not probing
    _channel_open: bool = False
    _count: int = 0
    _started: bool = False
    _finished: bool = False
    # what the last fed token added to a call, as a reader sees it (markers left out, QUOTE as '"'); a
    # bare `call:name{` withheld over several tokens comes whole with the token that opens it
    last_call_text: str = ""

    @property
    def content(self) -> str:
        """The reply's content so far (thinking channels kept, calls left out)."""
        return "".join(self._content)

    def feed(self, token_id: int, text: str, last: bool = False) -> tuple[str, list[Event]]:
        """One emitted token -> (its content text, the call events it completes). `last`: it ends the reply."""
        out: list[str] = []
        events: list[Event] = []
        if not self._started:
            self._started = True
            if self.starts_in_thought:
                out.append(MARKER_TEXT["channel_start"] + "thought\n")
                self._channel_open = True
        m = self.markers
        self.last_call_text = ""
        if self._call is not None:
            self._in_call(token_id, text, out, events)
        elif token_id == m.call_start:
            self._release(out)
            self._open(MARKER_TEXT["call_start"], "", out)
        elif token_id in (m.call_end, m.quote) or token_id in m.response:
            self._release(out)  # markup outside a call is never content (a stray <tool_call|>, the stop)
        elif self._probe is not None and token_id not in (m.channel_start, m.channel_end):
            self._probing(text, out, events)
        else:
            self._release(out)
            self._text(token_id, text, out)
        if last:
            self._finish(out, events)
        self._content.extend(out)
        return "".join(out), events

    def finish(self, tail: str = "") -> tuple[str, list[Event]]:
        """The end of the reply (idempotent): `tail` is the detokenizer's flush; an open call ends here."""
        out: list[str] = []
        events: list[Event] = []
        if tail:
            if self._call is not None:
                self._call.text += tail
            elif self._probe is not None:
                self._probe += tail
            else:
                out.append(tail)
        self._finish(out, events)
        self._content.extend(out)
        return "".join(out), events

    # --- content ---------------------------------------------------------------------------------

    def _text(self, token_id: int, text: str, out: list[str]) -> None:
        m = self.markers
        out.append(text)
        if token_id == m.channel_start:
            self._channel_open = True
        elif token_id == m.channel_end:
            self._channel_open = False
            self._probe = ""  # a bare `call:` may follow a closed thought

    def _release(self, out: list[str]) -> None:
        if self._probe:
            out.append(self._probe)
        self._probe = None

    def _probing(self, text: str, out: list[str], events: list[Event]) -> None:
        """Hold back text that may still become `call:NAME{`; let it go as soon as it cannot."""
        assert self._probe is not None
        self._probe += text
        s = self._probe.lstrip()
        if not s or _BARE_CALL.startswith(s):
            return
        if s.startswith(_BARE_CALL) and len(s) < _PROBE_LIMIT:
            rest = s[len(_BARE_CALL) :]
            brace = rest.find("{")
            name = rest if brace < 0 else rest[:brace]
            if all(is_tool_name_char(c) for c in name) and (brace < 0 or name):
                if brace >= 0:
                    self._probe = None
                    self._open("", s, out)
                    self.last_call_text = s
                    self._stream(events)
                return
        self._release(out)

    # --- calls -------------------------------------------------------------------------------------

    def _open(self, marker: str, text: str, out: list[str]) -> None:
        if self._channel_open:  # a call straight out of the thought: close the channel in the content
            out.append(MARKER_TEXT["channel_end"])
            self._channel_open = False
        self._call = _OpenCall(self._count, text, marker)
        self._count += 1

    def _in_call(self, token_id: int, text: str, out: list[str], events: list[Event]) -> None:
        m, call = self.markers, self._call
        assert call is not None
        if token_id == m.call_end:
            self._close(events, closed=True)
            self._probe = None
        elif token_id == m.call_start:  # a new call before this one closed
            self._close(events, closed=False)
            self._open(MARKER_TEXT["call_start"], "", out)
        elif token_id in m.response:
            pass  # the stop (or noise): the call ends with the reply
        else:
            call.text += QUOTE if token_id == m.quote else text
            self.last_call_text = '"' if token_id == m.quote else text
            self._stream(events)

    def _stream(self, events: list[Event]) -> None:
        """Events for what the open call's text now makes certain: its start, then argument JSON."""
        call = self._call
        assert call is not None
        if call.args is None:
            try:
                head = split_call(call.text)
            except Malformed:
                return  # reported when the call ends
            if head is None:
                return
            name, call.fed = head
            call.id = self.new_id()
            call.args = ArgumentStream()
            events.append(ToolCallStarted(call.index, call.id, name))
        if not call.stream_ok or call.args.failed:
            return
        delta = call.args.feed(call.text[call.fed :])
        call.fed = len(call.text)
        if delta:
            self._send(call, call.sent + delta, events)

    def _send(self, call: _OpenCall, so_far: str, events: list[Event]) -> None:
        if not so_far.startswith(call.sent):  # cannot happen for a correct scanner; never send a contradiction
            call.stream_ok = False
            return
        if len(so_far) > len(call.sent):
            events.append(ToolCallDelta(call.index, so_far[len(call.sent) :]))
            call.sent = so_far

    def _close(self, events: list[Event], closed: bool) -> None:
        call = self._call
        assert call is not None
        self._call = None
        raw = call.raw(closed)
        try:
            name, arguments, arguments_json = parse_call(call.text)
        except Malformed as e:
            error = ToolCallError(call.index, f"{MALFORMED}: {e}", raw)
            self.errors.append(error)
            events.append(error)
            return
        if call.id is None:
            call.id = self.new_id()
            events.append(ToolCallStarted(call.index, call.id, name))
        if call.stream_ok:
            self._send(call, arguments_json, events)
        done = ToolCall(call.index, call.id, name, arguments, arguments_json, raw)
        self.calls.append(done)
        events.append(done)

    def _finish(self, out: list[str], events: list[Event]) -> None:
        if self._finished:
            return
        self._finished = True
        self._release(out)
        if self._call is not None:
            text = self._call.text
            try:
                parse_call(text)
            except Malformed:
                call, self._call = self._call, None
                error = ToolCallError(call.index, f"{MALFORMED}: the reply ended inside the call", call.raw(False))
                self.errors.append(error)
                events.append(error)
                return
            self._close(events, closed=False)  # complete but for its <tool_call|>: the stop came first


def parse_reply(
    tokens: Iterable[tuple[int, str]], markers: ToolMarkers, starts_in_thought: bool = False
) -> ToolCallParser:
    """Feed a whole reply [(id, text delta), ...] through a parser (for tests and replays)."""
    parser = ToolCallParser(markers, starts_in_thought)
    for token_id, text in tokens:
        parser.feed(token_id, text)
    parser.finish()
    return parser


class ReplySplitter:
    """A turn's event callback with a parser in front: each TokenEvent's text becomes its content
    only (a call's tokens carry none: their text is in `call_text`, as a reader sees the call), and
    the call events its token completes follow it.

    `last` for the parser is decided as the decoder decides a reply's end (a stop id unless
    ignore_eos, or max_tokens), so text held back for a possible bare call still streams with the
    reply's last token. `finish(full_text)` ends the reply: full_text is the detokenizer's whole text,
    whose tail past the streamed deltas (its flush) goes through the parser too."""

    def __init__(
        self,
        parser: ToolCallParser,
        emit: Callable[[object], None],
        stop_ids: Iterable[int],
        max_tokens: int,
        ignore_eos: bool = False,
    ):
        self.parser = parser
        self.emit = emit
        self.stop_ids = frozenset(stop_ids)
        self.max_tokens = max_tokens
        self.ignore_eos = ignore_eos
        self._tokens = 0
        self._streamed = 0  # characters of detokenizer text seen

    def __call__(self, event: object) -> None:
        if not isinstance(event, TokenEvent):
            self.emit(event)
            return
        self._tokens += 1
        last = (event.id in self.stop_ids and not self.ignore_eos) or self._tokens >= self.max_tokens
        self._streamed += len(event.text)
        content, calls = self.parser.feed(event.id, event.text, last)
        self.emit(dataclasses.replace(event, text=content, call_text=self.parser.last_call_text))
        for e in calls:
            self.emit(e)

    def finish(self, full_text: str) -> list[Event]:
        """End the reply; returns the last call events (to emit before TurnDone)."""
        _, events = self.parser.finish(full_text[self._streamed :])
        return events
