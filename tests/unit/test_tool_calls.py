"""core.decode.tool_calls: the streaming tool-call parser on Gemma 4 replies.

Replies are written as text with the markers spelled out; `_stream` turns one into tokens the way
the engine feeds them: each marker is its own token (the pack tokenizer's id), with the text the
detokenizer gives it (nothing for the tool markers, which it leaves out; the channel markers' own
text), and the plain text between markers split into pieces (one piece, single characters, or
random cuts). Whatever the cuts, content, calls and the streamed argument JSON must be the same.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from core.decode import chat_format
from core.decode.tool_calls import (
    MALFORMED,
    ArgumentStream,
    Malformed,
    ToolCall,
    ToolCallDelta,
    ToolCallError,
    ToolCallParser,
    ToolCallStarted,
    parse_call_text,
    scan_arguments,
    tool_markers,
)

PACK_TOKENIZER = Path(__file__).parents[1] / "data" / "pack" / "models" / "tokenizer"
MARKERS = ["<|tool_call>", "<tool_call|>", '<|"|>', "<|tool_response>", "<tool_response|>", "<|channel>", "<channel|>"]
KEPT = {"<|channel>", "<channel|>"}  # the detokenizer's text for these is the marker; the others give ""
PLAIN = 9999  # an id that is no marker


@pytest.fixture(scope="module")
def vocab() -> dict[str, int]:
    data = json.loads((PACK_TOKENIZER / "tokenizer.json").read_text(encoding="utf-8"))
    return {t["content"]: t["id"] for t in data["added_tokens"]}


@pytest.fixture(scope="module")
def markers(vocab):
    m = tool_markers(vocab)
    assert m is not None
    return m


def _pieces(text: str, cut: str, rng: random.Random) -> list[str]:
    if cut == "whole" or not text:
        return [text] if text else []
    if cut == "chars":
        return list(text)
    out, i = [], 0
    while i < len(text):
        n = rng.randint(1, 4)
        out.append(text[i : i + n])
        i += n
    return out


def _stream(reply: str, vocab: dict[str, int], cut: str = "whole", seed: int = 0) -> list[tuple[int, str]]:
    rng = random.Random(seed)
    out: list[tuple[int, str]] = []
    rest = reply
    while rest:
        hits = [(rest.find(m), m) for m in MARKERS if rest.find(m) >= 0]
        at, marker = min(hits) if hits else (len(rest), "")
        out += [(PLAIN, p) for p in _pieces(rest[:at], cut, rng)]
        if marker:
            out.append((vocab[marker], marker if marker in KEPT else ""))
        rest = rest[at + len(marker) :]
    return out


def _run(reply: str, vocab, markers, cut="whole", seed=0, starts_in_thought=False):
    ids = iter(range(100))
    parser = ToolCallParser(markers, starts_in_thought, new_id=lambda: f"call_{next(ids)}")
    streamed, events = [], []
    tokens = _stream(reply, vocab, cut, seed)
    for k, (tid, text) in enumerate(tokens):
        content, evs = parser.feed(tid, text, last=k == len(tokens) - 1)
        streamed.append(content)
        events += evs
    tail, evs = parser.finish()
    streamed.append(tail)
    events += evs
    assert "".join(streamed) == parser.content  # what streamed is what the reply's text says
    return parser, events


Q = '<|"|>'
TRICKY = (
    "call:search{filters:{range:{lo:1,hi:null}},rows:[{id:1,label:" + Q + "a,b}c:[d]" + Q + "},{id:2}],"
    "ok:true,no:false,x:-2.5,tiny:1e-05,big:12345678901234567890,empty:" + Q + Q + ","
    "text:" + Q + 'He said "hi" {x}\nnew line\ttab <not a marker>' + Q + ",unicode:" + Q + "café ☕" + Q + "}"
)
TRICKY_ARGS = {
    "filters": {"range": {"lo": 1, "hi": None}},
    "rows": [{"id": 1, "label": "a,b}c:[d]"}, {"id": 2}],
    "ok": True,
    "no": False,
    "x": -2.5,
    "tiny": 1e-05,
    "big": 12345678901234567890,
    "empty": "",
    "text": 'He said "hi" {x}\nnew line\ttab <not a marker>',
    "unicode": "café ☕",
}

# (id, reply, content, [(name, arguments)])
WELL_FORMED = [
    (
        "one call",
        f"<|tool_call>call:get_current_time{{timezone:{Q}Europe/Paris{Q}}}<tool_call|><|tool_response>",
        "",
        [("get_current_time", {"timezone": "Europe/Paris"})],
    ),
    ("content before the call", "Let me check.<|tool_call>call:ping{}<tool_call|>", "Let me check.", [("ping", {})]),
    ("nested values, tricky strings", f"<|tool_call>{TRICKY}<tool_call|>", "", [("search", TRICKY_ARGS)]),
    (
        "several calls in a row",
        f"<|tool_call>call:w{{city:{Q}Paris{Q}}}<tool_call|><|tool_call>call:w{{city:{Q}Rome{Q}}}<tool_call|>"
        "<|tool_call>call:t{n:3}<tool_call|><|tool_response>",
        "",
        [("w", {"city": "Paris"}), ("w", {"city": "Rome"}), ("t", {"n": 3})],
    ),
    (
        "quoted keys",
        f"<|tool_call>call:w{{{Q}city{Q}:{Q}Rome{Q},{Q}n{Q}:2}}<tool_call|>",
        "",
        [("w", {"city": "Rome", "n": 2})],
    ),
    (
        "JSON-style object",
        '<|tool_call>call:w{"city":"Ro\\"me","meta":{"ok":false,"l":[1,"x"]}}<tool_call|>',
        "",
        [("w", {"city": 'Ro"me', "meta": {"ok": False, "l": [1, "x"]}})],
    ),
    (
        "Python literals and bare words",
        "<|tool_call>call:w{a:None,b:True,c:False,d:nil,unit:celsius,e:1.5e3,when:12:05}<tool_call|>",
        "",
        [("w", {"a": None, "b": True, "c": False, "d": None, "unit": "celsius", "e": 1500.0, "when": "12:05"})],
    ),
    (
        "whitespace and trailing commas",
        f"<|tool_call>call:w{{ a : 1 , b : [ 1 , 2 , ] , c : {Q} x {Q} , }}<tool_call|>",
        "",
        [("w", {"a": 1, "b": [1, 2], "c": " x "})],
    ),
    ("missing call", "<|tool_call>:w{a:1}<tool_call|><|tool_call>v{}<tool_call|>", "", [("w", {"a": 1}), ("v", {})]),
    ("MCP-style name", "<|tool_call>call:time.get-current:v2{}<tool_call|>", "", [("time.get-current:v2", {})]),
    ("no closing marker before the stop", "<|tool_call>call:w{a:[1]}<|tool_response>", "", [("w", {"a": [1]})]),
    (
        "bare call right after the thought closes",
        "<|channel>thought\nneed time<channel|>\ncall:get_time{tz:" + Q + "UTC" + Q + "}<tool_call|>",
        "<|channel>thought\nneed time<channel|>",
        [("get_time", {"tz": "UTC"})],
    ),
    ("bare call at the start", "call:ping{}<|tool_response>", "", [("ping", {})]),
    (
        "call out of an unclosed thought",
        "<|channel>thought\nreasoning<|tool_call>call:ping{}<tool_call|>",
        "<|channel>thought\nreasoning<channel|>",
        [("ping", {})],
    ),
    ("stray closing markers are dropped", "Hi<tool_call|> there<tool_response|>", "Hi there", []),
    (
        "no calls",
        "<|channel>thought\nx<channel|>calling is fine, c",
        "<|channel>thought\nx<channel|>calling is fine, c",
        [],
    ),
    ("a reply that is only 'cal'", "cal", "cal", []),
]


@pytest.mark.parametrize("cut", ["whole", "chars", "random"])
@pytest.mark.parametrize("case", WELL_FORMED, ids=[c[0] for c in WELL_FORMED])
def test_well_formed_replies(vocab, markers, case, cut):
    _, reply, content, want = case
    for seed in range(3 if cut == "random" else 1):
        parser, events = _run(reply, vocab, markers, cut, seed)
        assert parser.content == content
        assert [(c.name, c.arguments) for c in parser.calls] == want
        assert not parser.errors
        for c in parser.calls:
            assert c.arguments_json == json.dumps(c.arguments, ensure_ascii=False)
            assert json.loads(c.openai()["function"]["arguments"]) == c.arguments
        _check_event_order(events, parser.calls)


def _check_event_order(events, calls: list[ToolCall]) -> None:
    """Per call: Started (with its id and name) first, then deltas that concatenate to its JSON, then the call."""
    for call in calls:
        mine = [e for e in events if e.index == call.index]
        assert isinstance(mine[0], ToolCallStarted) and (mine[0].id, mine[0].name) == (call.id, call.name)
        assert mine[-1] is call
        deltas = mine[1:-1]
        assert all(isinstance(d, ToolCallDelta) for d in deltas)
        assert "".join(d.arguments for d in deltas) == call.arguments_json


def test_arguments_stream_before_the_call_closes(vocab, markers):
    """A string's characters come out as they are decoded; a number waits for its delimiter."""
    parser = ToolCallParser(markers)
    fed = []
    for tid, text in _stream(f"<|tool_call>call:w{{city:{Q}Paris{Q},n:42}}", vocab, "chars"):
        _, evs = parser.feed(tid, text)
        fed.append("".join(e.arguments for e in evs if isinstance(e, ToolCallDelta)))
    streamed = "".join(fed)
    assert streamed == '{"city": "Paris", "n": 42}'
    assert fed[fed.index("P") + 1 : fed.index("P") + 5] == ["a", "r", "i", "s"]  # one character per piece
    assert fed[-3:] == ["", "", "42}"]  # 42 went out only when "}" ended it
    assert not parser.calls  # still open: no <tool_call|> yet


def test_started_comes_with_the_name(vocab, markers):
    parser = ToolCallParser(markers, new_id=lambda: "call_x")
    seen = []
    for tid, text in _stream("<|tool_call>call:get_current_time{", vocab, "chars"):
        seen += parser.feed(tid, text)[1]
    assert seen[0] == ToolCallStarted(0, "call_x", "get_current_time")
    assert seen[1:] == [ToolCallDelta(0, "{")]


MALFORMED_CASES = [
    ("unterminated string", f"<|tool_call>call:w{{a:{Q}oops}}<tool_call|>", "before their closing"),
    ("parentheses", "<|tool_call>call:w(a=1)<tool_call|>", "no '{' after the tool name"),
    ("missing colon", "<|tool_call>call:w{a 1}<tool_call|>", "expected a key"),
    ("missing comma", f"<|tool_call>call:w{{a:1 b:{Q}x{Q}}}<tool_call|>", "unexpected character"),
    ("bad name", "<|tool_call>call:get time{}<tool_call|>", "bad tool name"),
    ("text after the arguments", "<|tool_call>call:w{a:1} and more<tool_call|>", "text after the arguments"),
    ("empty value", "<|tool_call>call:w{a:}<tool_call|>", "a value is missing"),
    ("reply ends inside the call", f"<|tool_call>call:w{{a:{Q}half", "ended inside the call"),
]


@pytest.mark.parametrize("case", MALFORMED_CASES, ids=[c[0] for c in MALFORMED_CASES])
def test_malformed_calls_are_reported_with_their_raw_text(vocab, markers, case):
    _, reply, why = case
    for cut in ("whole", "chars"):
        parser, events = _run(reply, vocab, markers, cut)
        assert not parser.calls and parser.content == ""
        [error] = parser.errors
        assert error.message.startswith(MALFORMED + ": ") and why in error.message
        want_raw = reply if reply.endswith("<tool_call|>") else reply
        assert error.raw == want_raw
        assert events[-1] is error


def _shown(raw: str) -> str:
    """A call as a chat shows it while it streams (TokenEvent.call_text): no markers, '"' for a quote token."""
    return raw.replace("<|tool_call>", "").replace("<tool_call|>", "").replace(Q, '"')


@pytest.mark.parametrize("cut", ["whole", "chars", "random"])
@pytest.mark.parametrize(
    "reply",
    [c[1] for c in WELL_FORMED] + [c[1] for c in MALFORMED_CASES],
    ids=[c[0] for c in WELL_FORMED] + [c[0] for c in MALFORMED_CASES],
)
def test_each_tokens_share_of_a_call_is_its_call_text(vocab, markers, reply, cut):
    """Concatenated in order, the tokens' call_text is every call as the model wrote it (markers left out,
    quotes as '"'), and a token is content or call text, never both: what the chat shows of a call while
    it streams, token by token in the tokens' colours."""
    for seed in range(3 if cut == "random" else 1):
        parser = ToolCallParser(markers)
        tokens = _stream(reply, vocab, cut, seed)
        shown = []
        for k, (tid, text) in enumerate(tokens):
            content, _ = parser.feed(tid, text, last=k == len(tokens) - 1)
            assert not (content and parser.last_call_text), (text, content)
            shown.append(parser.last_call_text)
        parser.finish()
        calls = sorted([(c.index, c.raw) for c in parser.calls] + [(e.index, e.raw) for e in parser.errors])
        assert "".join(shown) == "".join(_shown(raw) for _, raw in calls)


def test_the_splitter_puts_a_calls_text_on_its_tokens_and_keeps_their_origin(vocab, markers):
    from core.decode.tool_calls import ReplySplitter
    from core.events import TokenEvent

    out: list[object] = []
    splitter = ReplySplitter(ToolCallParser(markers), out.append, stop_ids={vocab["<|tool_response>"]}, max_tokens=99)
    stream = _stream(f"Let me check.<|tool_call>call:get_current_time{{timezone:{Q}Asia/Tokyo{Q}}}<tool_call|>", vocab)
    stream += [(vocab["<|tool_response>"], "")]
    for k, (tid, text) in enumerate(stream):
        splitter(TokenEvent(tid, text, from_draft=k % 2 == 0, round=k))
    tokens = [e for e in out if isinstance(e, TokenEvent)]
    assert "".join(t.text for t in tokens) == "Let me check."
    assert "".join(t.call_text for t in tokens) == 'call:get_current_time{timezone:"Asia/Tokyo"}'
    assert [t.from_draft for t in tokens] == [k % 2 == 0 for k in range(len(stream))]


def test_a_malformed_call_does_not_stop_the_next(vocab, markers):
    parser, _ = _run("<|tool_call>call:w{a:}<tool_call|><|tool_call>call:v{b:2}<tool_call|>", vocab, markers)
    assert [e.index for e in parser.errors] == [0]
    assert [(c.index, c.name, c.arguments) for c in parser.calls] == [(1, "v", {"b": 2})]


def test_a_call_opened_before_the_last_closed(vocab, markers):
    parser, _ = _run("<|tool_call>call:w{a:1}<|tool_call>call:v{}<tool_call|>", vocab, markers)
    assert [(c.name, c.arguments) for c in parser.calls] == [("w", {"a": 1}), ("v", {})]
    assert parser.calls[0].raw == "<|tool_call>call:w{a:1}"


def test_markers_typed_as_plain_text_are_text(vocab, markers):
    """Only the special tokens open a call or end a string: the same characters as text do not."""
    parser = ToolCallParser(markers)
    for ch in "see <|tool_call>call:w{} here":
        parser.feed(PLAIN, ch)
    parser.finish()
    assert parser.content == "see <|tool_call>call:w{} here" and not parser.calls
    inside = ToolCallParser(markers)
    stream = [(markers.call_start, ""), (PLAIN, "call:w{s:"), (markers.quote, "")]
    stream += [(PLAIN, c) for c in 'a<|"|>b']
    stream += [(markers.quote, ""), (PLAIN, "}"), (markers.call_end, "")]
    for tid, text in stream:
        inside.feed(tid, text)
    assert [c.arguments for c in inside.calls] == [{"s": 'a<|"|>b'}]


def test_reply_after_a_tool_result_with_thinking_starts_in_the_thought(vocab, markers):
    from core.decode.prompt import ThinkingMarkers, split_thinking

    parser, _ = _run("I should answer.<channel|>It is sunny.", vocab, markers, starts_in_thought=True)
    assert parser.content == "<|channel>thought\nI should answer.<channel|>It is sunny."
    assert split_thinking(parser.content, ThinkingMarkers("<|channel>", "<channel|>")) == (
        "I should answer.",
        "It is sunny.",
    )


def test_probe_text_held_back_is_released_by_the_last_token(vocab, markers):
    """A reply ending in "ca" (maybe a bare call) still streams its last characters with its last token."""
    parser = ToolCallParser(markers)
    assert parser.feed(PLAIN, "ca") == ("", [])
    assert parser.feed(vocab["<turn|>"], "", last=True) == ("ca", [])


def test_the_real_detokenizer_feeds_the_parser(vocab, markers):
    """Pack tokenizer ids through core.decode.detok (which drops the tool markers' text) into the parser."""
    from mlx_lm.tokenizer_utils import load

    from core.decode.detok import Detokenizer

    tokenizer = load(PACK_TOKENIZER)
    reply = f"Checking.<|tool_call>{TRICKY}<tool_call|><|tool_response>"
    ids = tokenizer._tokenizer.encode(reply, add_special_tokens=False)
    assert markers.call_start in ids and markers.quote in ids
    detok = Detokenizer(tokenizer)
    parser = ToolCallParser(markers)
    texts = [parser.feed(i, detok.add(i), last=k == len(ids) - 1)[0] for k, i in enumerate(ids)]
    assert "".join(texts) == "Checking." == parser.content
    assert [(c.name, c.arguments) for c in parser.calls] == [("search", TRICKY_ARGS)]


def test_rendered_history_calls_parse_back():
    """What chat_format writes for a call in the history is what the parser reads (one format both ways)."""
    rng = random.Random(1)
    alphabet = ["a", "Z", " ", ",", "{", "}", "[", "]", ":", '"', "\n", "é", "<", "|", "0", "-"]

    def value(depth: int):
        kind = rng.choice(["s", "i", "f", "b", "n", "o", "l"] if depth < 3 else ["s", "i", "f", "b", "n"])
        if kind == "s":
            return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 8)))
        if kind == "i":
            return rng.randint(-(10**12), 10**12)
        if kind == "f":
            return rng.choice([0.5, -2.25, 1e-05, 3.0e20, 123.456])
        if kind == "b":
            return rng.random() < 0.5
        if kind == "n":
            return None
        if kind == "o":
            return {f"k{j}_{rng.randint(0, 9)}": value(depth + 1) for j in range(rng.randint(0, 3))}
        return [value(depth + 1) for _ in range(rng.randint(0, 3))]

    for _ in range(200):
        args = {f"p{j}": value(0) for j in range(rng.randint(0, 4))}
        rendered = chat_format.render(
            chat_format.normalize_messages(
                [{"role": "assistant", "tool_calls": [{"function": {"name": "f.x", "arguments": json.dumps(args)}}]}]
            )
        ).text
        body = rendered.split("<|tool_call>", 1)[1].split("<tool_call|>", 1)[0]
        name, parsed, _ = parse_call_text(body)
        assert (name, parsed) == ("f.x", args)


def test_the_stream_only_grows_and_ends_as_the_scanner_does():
    """ArgumentStream (push parser) against scan_arguments (recursive descent): on every cut of the text
    its output so far is a prefix of the scanner's JSON for the whole text, and fed whole it is that JSON."""
    texts = [
        f"{{a:{Q}xy{Q},b:[1,{{c:true}}],d:-0.5}}",
        TRICKY[len("call:search") :],
        '{"city":"Ro\\"me","meta":{"ok":false,"l":[1,"x"]}}',
        f"{{ a : 1 , b : [ 1 , 2 , ] , c : {Q} x {Q} , }}",
        "{a:None,b:True,when:12:05,e:1.5e3,xs:[[],{}],}",
    ]
    for raw in texts:
        text = raw.replace(Q, "\ue000")
        final, _ = scan_arguments(text)
        for cut in range(len(text) + 1):
            stream = ArgumentStream()
            first = stream.feed(text[:cut])
            assert final.startswith(first), (raw, cut)
            assert first + stream.feed(text[cut:]) == final and stream.done
        one_by_one = ArgumentStream()
        assert "".join(one_by_one.feed(c) for c in text) == final
    for bad in ["{a 1}", "{a:1 b:\ue000x\ue000}", "[1]", "{a:}", "{a:[1,,2]}"]:
        stream = ArgumentStream()
        stream.feed(bad)
        assert stream.failed and not stream.done, bad
        with pytest.raises(Malformed):
            scan_arguments(bad)
    with pytest.raises(Malformed, match="before their closing"):
        scan_arguments("{a:1")


def test_long_calls_stream_in_linear_time(markers):
    """A 4000-number array or a 16k-character string argument: per-token work does not grow with the call."""
    import time

    def run(stream):
        parser = ToolCallParser(markers)
        t = time.perf_counter()
        for tid, text in stream:
            parser.feed(tid, text)
        return time.perf_counter() - t, parser

    q = markers.quote
    numbers = [(markers.call_start, ""), (PLAIN, "call:sum{xs:[")] + [(PLAIN, f"{i},") for i in range(4000)]
    numbers += [(PLAIN, "0]}"), (markers.call_end, "")]
    code = [(markers.call_start, ""), (PLAIN, "call:write{code:"), (q, "")]
    code += [(PLAIN, 'x = {"k": [1]}\n'[i % 4 :][:4] or "ab") for i in range(4000)] + [(q, ""), (PLAIN, "}")]
    code += [(markers.call_end, "")]
    for stream in (numbers, code):
        # the best of three: one run preempted on a busy machine (CI beside other work) is not the parser's time
        short = min(run(stream[:400] + stream[-2:])[0] for _ in range(3))
        full, parser = min((run(stream) for _ in range(3)), key=lambda r: r[0])
        assert len(parser.calls) == 1
        assert full < 25 * short + 0.05  # 10x the tokens: linear is ~10x, quadratic ~100x


def test_events_are_typed():
    err = ToolCallError(0, "m", "r")
    call = ToolCall(1, "call_1", "f", {"a": 1}, '{"a": 1}', "raw")
    assert call.openai() == {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    assert (err.index, err.raw) == (0, "r")
