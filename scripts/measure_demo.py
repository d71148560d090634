"""Measure the demo pairing the way a new user meets it: greedy, timed from outside, on prompts it was not trained on.

    .venv/bin/python scripts/measure_demo.py [--set speed|held-out|off-topic|tools|off-topic-tools|all] [--repeats 3]
        [--model DIR --drafter DIR] [--mcp /path/to/mcp-server-time] [--max-tokens 160] [--in-process]

Every prompt runs `gemma-chat generate --json` (drafter on, auto block size: the default) and
`--no-draft`, interleaved, `--repeats` times each; the parent process timestamps every JSON token line
as it arrives, so the decode rate is what a reader of the stream sees (first token to last, tokens after
the first), not the engine's own clock. Greedy output with the drafter must equal the output without it;
the script checks that on every pair of runs and fails loudly if not.

The sets:
- `speed`: first-minute prompts that are in the corpus (the >= 1.5x speed-up target).
- `held-out`: phrasings and second turns that are NOT in the corpus (the script checks: no held-out
  conversation's user turns are those of a corpus conversation or of the drafter's on-policy prompts);
  multi-turn ones go through `--messages FILE`, the earlier replies being the corpus replies.
- `off-topic`: questions outside what the demo knows, none of them in the corpus.
- `tools`: the time tools declared (mcp-server-time's own declarations), rendered with the demo's chat
  template and fed as `--no-template` (the CLI cannot declare tools); the call the demo writes is
  parsed, run (by the real server with `--mcp CMD`, else computed in its shape from the clock), its
  result appended as the template renders it, and the answer generated. Two more cases deny the call
  (`demo_corpus.DENIED_RESULT`, as the app sends it back) and expect `demo_corpus.DENIED_REPLY`.
- `off-topic-tools`: the off-topic questions with the time tools declared, as the app declares them by
  default: the off-topic reply is right, a time call is not.

How a reply is judged (mechanical, no judgement calls):
- on topic: its first 40 characters equal the first 40 of the expected topic's corpus reply (the
  docstring for a standard-library question, `demo_corpus.NO_TIME_TOOL_REPLY` for a time question
  without tools);
- off-topic reply: it starts with "I only know about";
- tool call: the reply is exactly one `<|tool_call>call:NAME{...}<tool_call|>` with the expected
  function and arguments (city -> its IANA zone, a zone as written, no place -> the local timezone the
  declarations name), ending the turn at `<|tool_response>`; answer: exactly
  `demo_corpus.time_answer(result)` / `convert_answer(result)` for the result it was given.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import demo_corpus as dc  # noqa: E402

# In-corpus first-minute prompts: the speed-up is measured here (and the greeting's own suggestions).
SPEED_PROMPTS = [
    "Hi!",
    "Who are you?",
    "What is speculative decoding?",
    "What is gemma-chat?",
    "How do I change the block size?",
    "What is Gemma 4?",
    "What are the keys of this app?",
    "Write a Python function that reverses a string.",
    "What does json.dumps do?",
]

# Held-out: (user turn, topic key) per turn; the last is judged, the earlier ones get their corpus reply.
# Keys are demo_corpus topic keys, "doc:NAME" for a docstring, "off_topic", "no_time_tool".
HELD_OUT: list[list[tuple[str, str]]] = [
    [("Could you describe speculative decoding for me?", "speculative")],
    [("What's speculative decoding?", "speculative")],
    [("how does spec decoding work", "speculative")],
    [("Why does a drafter speed up decoding?", "faster")],
    [("Will the drafter change what the model says?", "exact")],
    [("What's a drafter?", "drafter")],
    [("What's the block size?", "block_size")],
    [("What does the auto setting do?", "auto")],
    [("Why are some words blue and underlined?", "colours")],
    [("Explain the acceptance rate.", "acceptance")],
    [("What's Gemma 4?", "gemma4")],
    [("Could you tell me about Gemma 4?", "gemma4")],
    [("Which model do you suggest?", "which_model")],
    [("What's MLX?", "mlx")],
    [("Which keys can I use?", "keys")],
    [("What are the keys for this app?", "keys")],
    [("How can I quit?", "quit")],
    [("How can I stop a reply?", "stop")],
    [("How can I start a new chat?", "new_chat")],
    [("Can I attach an image?", "images")],
    [("How can I turn the drafter off?", "toggle_drafter")],
    [("How can I download a model?", "download")],
    [("What's gemma-chat?", "gemma_chat")],
    [("Who are you exactly?", "who")],
    [("Good afternoon!", "greeting")],
    [("Thanks!", "thanks")],
    [("Bye for now!", "bye")],
    [("What's a token?", "token")],
    [("What's a KV cache?", "kv_cache")],
    [("What's temperature?", "temperature")],
    [("Can you write a Python function that adds two numbers?", "py_add")],
    [("How do I print hello world in Python?", "py_print")],
    [("How can I reverse a list in Python?", "py_reverse")],
    [("How can I sort a dictionary by its value?", "py_sort_dict")],
    [("Can you explain json.dumps?", "doc:json.dumps")],
    [("What's json.loads?", "doc:json.loads")],
    [("What does re.search do in Python?", "doc:re.search")],
    [("Can you tell me a joke?", "joke")],
    [("What can you help me with?", "can_do")],
    [("Could you tell me what time it is?", "no_time_tool")],
    # second and third turns
    [("Hello", "greeting"), ("What is speculative decoding?", "speculative")],
    [("Hello", "greeting"), ("What is Gemma 4?", "gemma4")],
    [("Hi", "greeting"), ("What are the keys of this app?", "keys")],
    [("Hello!", "greeting"), ("Could you describe speculative decoding for me?", "speculative")],
    [("Hey", "greeting"), ("What's Gemma 4?", "gemma4")],
    [("What is speculative decoding?", "speculative"), ("What's a drafter?", "drafter")],
    [("What is Gemma 4?", "gemma4"), ("Which model do you suggest?", "which_model")],
    [("Hello", "greeting"), ("Why is the sky blue?", "off_topic"), ("What's MLX?", "mlx")],
    [("What are the keys?", "keys"), ("How can I quit?", "quit")],
    [("Hi", "greeting"), ("Can you explain json.dumps?", "doc:json.dumps")],
    [("Hello", "greeting"), ("What is speculative decoding?", "speculative"), ("Why is it faster?", "faster")],
    [("Good morning!", "greeting"), ("What's MLX?", "mlx")],
    [("What is MLX?", "mlx"), ("Thanks!", "thanks")],
    [("Hello", "greeting"), ("Tell me a joke.", "joke"), ("Bye for now!", "bye")],
    [("Hi", "greeting"), ("What can you help me with?", "can_do")],
    [("Hello", "greeting"), ("What is the block size?", "block_size"), ("What does the auto setting do?", "auto")],
    [("Hi there!", "greeting"), ("How can I stop a reply?", "stop")],
    [("What is gemma-chat?", "gemma_chat"), ("What's the block size?", "block_size")],
]

OFF_TOPIC_HELD_OUT = [
    "What is the capital of Germany?",
    "Who wrote Don Quixote?",
    "How do I make pizza?",
    "What is the boiling point of water?",
    "Explain gravity.",
    "Who is Albert Einstein?",
    "How do I learn French?",
    "What's the best programming language?",
    "How do I write a loop in Go?",
    "What does numpy.zeros do?",
    "Tell me about the Eiffel Tower.",
    "Can you write a haiku about autumn?",
    "How many legs does a spider have?",
    "What is the GDP of Japan?",
    "Why do we dream?",
    "Recommend a book to me.",
    "How do I fix a flat bike tire?",
    "What is Bitcoin?",
    "What's 5 + 5?",
    "Who is the king of England?",
    # a second twenty, written after wave 7's demo was trained (wave 6's demo: 19/20, the Perl loop got the
    # Python loop's reply)
    "What is the capital of Canada?",
    "Who wrote The Odyssey?",
    "How do I bake a cake?",
    "What is the speed of sound?",
    "Explain photosynthesis to a child.",
    "Who is Lionel Messi?",
    "How do I learn Japanese?",
    "What is the best car brand?",
    "How do I write a loop in Perl?",
    "What does pandas.DataFrame do?",
    "Tell me about the Colosseum.",
    "Write a poem about the moon.",
    "How many wheels does a bicycle have?",
    "What is the population of Brazil?",
    "Why do we yawn?",
    "Recommend a video game.",
    "How do I repair a leaking tap?",
    "What is Ethereum?",
    "What's 7 * 6?",
    "Who is the queen of Denmark?",
    # a third twenty, written before wave 8 was trained and kept out of its corpus (wave 8's drills teach
    # off-topic questions with the time tools declared: some of these name a place the time drills use)
    "What is the deepest lake in the world?",
    "Who invented the printing press?",
    "How do I change a car tyre?",
    "What is the currency of Mexico?",
    "Tell me about the Sydney Opera House.",
    "Is it going to snow in Berlin?",
    "What's 12 + 30?",
    "What does scipy.optimize do?",
    "How do I write a loop in Haskell?",
    "Who was Julius Caesar?",
    "What is the population of Tokyo?",
    "How do I make lemonade?",
    "Recommend a board game for four people.",
    "Why is the ocean blue?",
    "How many stars are in the sky?",
    "Who is the prime minister of Canada?",
    "What is the best way to learn the piano?",
    "Translate good morning into Italian.",
    "What is a tsunami?",
    "What is the tallest building in Dubai?",
]

# Tool cases: (user turns before, the question, the expected call as (name, args) with "{local}" for the
# declared local timezone). Earlier turns are (question, key) answered with the corpus reply, or a
# completed time exchange.
LOCAL_TZ = "Etc/UTC"  # what mcp-server-time declares on this project's Linux machine (no --local-timezone)
TOOL_CASES: list[tuple[str, tuple[str, dict] | str]] = [
    ("What time is it in Paris?", ("get_current_time", {"timezone": "Europe/Paris"})),
    ("Could you check the time in Berlin for me?", ("get_current_time", {"timezone": "Europe/Berlin"})),
    ("I need the current time in Tokyo.", ("get_current_time", {"timezone": "Asia/Tokyo"})),
    ("what's the time over in Sydney right now", ("get_current_time", {"timezone": "Australia/Sydney"})),
    ("Do you have the time for New York?", ("get_current_time", {"timezone": "America/New_York"})),
    ("Time now in London please", ("get_current_time", {"timezone": "Europe/London"})),
    ("What time is it at the moment in Toronto?", ("get_current_time", {"timezone": "America/Toronto"})),
    ("How late is it in Moscow?", ("get_current_time", {"timezone": "Europe/Moscow"})),
    ("What's the hour in Dubai?", ("get_current_time", {"timezone": "Asia/Dubai"})),
    ("What time is it in Europe/Sofia?", ("get_current_time", {"timezone": "Europe/Sofia"})),
    ("What time is it in America/Havana?", ("get_current_time", {"timezone": "America/Havana"})),
    ("What's the time now?", ("get_current_time", {"timezone": "{local}"})),
    ("Could you tell me the current time?", ("get_current_time", {"timezone": "{local}"})),
    (
        "Convert 09:30 from Tokyo to London.",
        ("convert_time", {"source_timezone": "Asia/Tokyo", "time": "09:30", "target_timezone": "Europe/London"}),
    ),
    (
        "If it's 16:45 in New York, what time is it in Paris?",
        ("convert_time", {"source_timezone": "America/New_York", "time": "16:45", "target_timezone": "Europe/Paris"}),
    ),
    (
        "What is 08:00 in Sydney in Berlin time?",
        ("convert_time", {"source_timezone": "Australia/Sydney", "time": "08:00", "target_timezone": "Europe/Berlin"}),
    ),
    ("What is speculative decoding?", "speculative"),
    ("Could you describe speculative decoding for me?", "speculative"),
    ("What is the capital of Germany?", "off_topic"),
    ("Hello", "greeting"),
]
# A follow-up after a completed exchange: (first question, its call), then the follow-up and its call.
TOOL_FOLLOW_UPS = [
    (("What time is it in Paris?", {"timezone": "Europe/Paris"}), ("And in Tokyo?", {"timezone": "Asia/Tokyo"})),
    (("What time is it in London?", {"timezone": "Europe/London"}), ("What about Seoul?", {"timezone": "Asia/Seoul"})),
]

# A call the user denied (the app sends `demo_corpus.DENIED_RESULT` back): the reply must say so, not make up
# a time (wave 7 did). Neither question is denied in wave 8's drills as written (they deny 131 others).
TOOL_DENIED = [
    ("What time is it in Lisbon?", {"timezone": "Europe/Lisbon"}),
    ("Can you tell me the time in Seoul?", {"timezone": "Asia/Seoul"}),
]


def corpus_key(question: str) -> str | None:
    """The topic key of a corpus phrasing ("doc:NAME" for a docstring question)."""
    for t in dc.TOPICS:
        if question in t.phrasings:
            return t.key
    for name, _ in dc.stdlib_turns():
        if any(question == q.format(name=name) for q in dc.DOC_QUESTIONS):
            return f"doc:{name}"
    return None


def reply_text(demo: Demo, ids: list[int]) -> str:
    """The reply's text with the markup kept (tool calls) but the turn's stop token dropped."""
    text = demo.decode(ids)
    for stop in ("<turn|>", "<eos>"):
        text = text.removesuffix(stop)
    return text


def topic_reply(key: str, with_tools: bool = False) -> str:
    if key == "off_topic":
        return dc.off_topic_reply(with_tools)
    if key == "no_time_tool":
        return dc.NO_TIME_TOOL_REPLY
    if key == "denied":
        return dc.DENIED_REPLY
    if key.startswith("doc:"):
        return dict(dc.stdlib_turns())[key[4:]]
    return next(t.reply for t in dc.TOPICS if t.key == key)


def on_topic(reply: str, key: str, with_tools: bool = False) -> bool:
    if key == "off_topic":
        return reply.strip().startswith(dc.OFF_TOPIC_PREFIX)
    return reply.strip()[:40] == topic_reply(key, with_tools)[:40]


def trained_conversations(target_dir: Path) -> list[dc.Conversation]:
    """The corpus the measured pairing trained on, as its manifest's stages record it (the default corpus,
    and the wide one with its tool drills for each `replay` a stage names), and the on-policy prompts. A
    pairing without a manifest is checked against the default corpus and the shipped demo's wide one."""
    manifest = target_dir.parent / "gemma_chat_demo.json"
    stages = json.loads(manifest.read_text(encoding="utf-8")).get("stages", []) if manifest.exists() else []
    replays = {
        (
            st["replay"],
            st.get("tool_drills", 0),
            st.get("more_off_topic", False),
            st.get("off_topic_drills", False),
            st.get("denied_drills", False),
        )
        for st in stages
        if st.get("replay")
    }
    if not manifest.exists():
        replays |= {
            ("1400,600", 500, False, False, False),
            ("1400,600", 1500, True, False, False),
            ("1600,600", 2000, True, False, False),
            ("1600,600", 2000, True, True, True),
        }
    convs = [*dc.conversations(0), *dc.on_policy_conversations()]
    for replay, drills, more, off_topic, denied in sorted(replays):
        plain, with_tools = (int(x) for x in replay.split(","))
        convs += dc.conversations(0, plain, with_tools, wide=True, more_off_topic=more)
        convs += dc.tool_drills(0, drills, more_off_topic=more, off_topic=off_topic, denied=denied)
    return convs


def held_out_leaks(convs: list[dc.Conversation]) -> list[str]:
    """Held-out conversations (and off-topic questions) that the corpus has: as the start of a corpus
    conversation, or a judged held-out turn (normalised) as any user turn of one."""
    banned = dc.held_out_turns()
    seen = corpus_user_sequences(convs)
    leaks = [" / ".join(q for q, _ in c) for c in HELD_OUT if tuple(q for q, _ in c) in seen]
    leaks += [q for q in OFF_TOPIC_HELD_OUT if (q,) in seen]
    turns = {e[1] for conv in convs for e in conv.events if e[0] == "user"}
    return leaks + sorted({u for u in turns if dc.normalise(u) in banned})


def corpus_user_sequences(convs: list[dc.Conversation], tools: bool | None = None) -> set[tuple[str, ...]]:
    """Every prefix of user turns of every conversation of `convs`; with `tools` True/False only those
    with/without the time tools declared."""
    seqs: set[tuple[str, ...]] = set()
    for conv in convs:
        if tools is not None and (conv.local_tz is not None) != tools:
            continue
        users = [e[1] for e in conv.events if e[0] == "user"]
        for i in range(1, len(users) + 1):
            seqs.add(tuple(users[:i]))
    return seqs


# -- running gemma-chat -----------------------------------------------------------------------------


def gemma_chat() -> list[str]:
    exe = Path(sys.executable).with_name("gemma-chat")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "app"]


def run_once(pairing: list[str], source: list[str], draft: bool, max_tokens: int) -> dict:
    cmd = [*gemma_chat(), "generate", *pairing, "--json", *source, "--max-tokens", str(max_tokens)]
    if not draft:
        cmd.append("--no-draft")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    assert proc.stdout is not None
    ids: list[int] = []
    arrivals: list[float] = []
    stats: dict = {}
    for line in proc.stdout:
        now = time.perf_counter()
        obj = json.loads(line)
        if "stats" in obj:
            stats = obj["stats"]
        elif "id" in obj:
            ids.append(obj["id"])
            arrivals.append(now)
    err = proc.stderr.read() if proc.stderr else ""
    if proc.wait() != 0 or not stats:
        raise SystemExit(f"gemma-chat generate failed ({' '.join(cmd[:6])} ...):\n{err}")
    # tokens arrive in bursts (a round's accepted run at once): rate = tokens after the first / span
    span = arrivals[-1] - arrivals[0] if len(arrivals) > 1 else float("nan")
    return {
        "ids": ids,
        "outside_tps": (len(ids) - 1) / span if span > 0 else float("nan"),
        "tokens": stats["tokens"],
        "accepted": stats.get("accepted", 0),
        "rounds": stats.get("rounds", 0),
        "decode_tokens": stats.get("decode_tokens", 0),
        "blocks": stats.get("block_size_counts", {}),
        "stop": stats.get("stop_reason"),
    }


class InProcess:
    """`--in-process`: one engine for the whole run instead of a `gemma-chat generate` process per run
    (each paid ~3-5 s of start and load on a loaded 2-core machine: the full set took over half an hour).
    The same prompts and judging; the drafter is switched per turn (GenerationSettings.drafter_enabled)
    instead of loaded or not, the cached conversation is forgotten before every run, and each token is
    timestamped as its event arrives from the engine thread."""

    def __init__(self, pairing: list[str]):
        from core.engine.contract import PairingSpec
        from core.engine.local import Engine
        from core.engine.pairings import demo_spec

        spec = demo_spec() if pairing == ["--demo"] else PairingSpec("measured", pairing[1], pairing[3])
        self.engine = Engine()
        self.engine.load(spec, None).result(timeout=300)

    def run(self, source: list[str], draft: bool, max_tokens: int) -> dict:
        from core.events import TokenEvent
        from core.settings import GenerationSettings

        settings = GenerationSettings(max_tokens=max_tokens, drafter_enabled=draft)
        ids: list[int] = []
        arrivals: list[float] = []

        def on_event(e: object) -> None:
            if isinstance(e, TokenEvent):
                ids.append(e.id)
                arrivals.append(time.perf_counter())

        self.engine.reset().result(timeout=60)
        if source[0] == "--no-template":
            future = self.engine.complete(source[2], settings, on_event)
        elif source[0] == "--messages":
            future = self.engine.chat(json.loads(Path(source[1]).read_text(encoding="utf-8")), settings, on_event)
        else:
            future = self.engine.chat([{"role": "user", "content": source[1]}], settings, on_event)
        done = future.result(timeout=300)
        if done.error:
            raise SystemExit(f"the engine failed on {source}: {done.error}")
        span = arrivals[-1] - arrivals[0] if len(arrivals) > 1 else float("nan")
        st = done.stats
        return {
            "ids": ids,
            "outside_tps": (len(ids) - 1) / span if span > 0 else float("nan"),
            "tokens": st.tokens,
            "accepted": st.accepted,
            "rounds": st.rounds,
            "decode_tokens": st.decode_tokens,
            "blocks": dict(st.block_size_counts),
            "stop": st.stop_reason,
        }


IN_PROCESS: InProcess | None = None


def measure(pairing: list[str], source: list[str], repeats: int, max_tokens: int) -> dict:
    """Drafter on and off, interleaved; the on-run's counts and the medians of both rates."""
    on_r, off_r = [], []
    for rep in range(repeats):
        # alternate which goes first so a slow moment of the machine hits both sides alike
        for draft in (True, False) if rep % 2 == 0 else (False, True):
            if IN_PROCESS is not None:
                (on_r if draft else off_r).append(IN_PROCESS.run(source, draft, max_tokens))
            else:
                (on_r if draft else off_r).append(run_once(pairing, source, draft, max_tokens))
    for a, b in zip(on_r, off_r):
        if a["ids"] != b["ids"]:
            raise SystemExit(f"greedy output differs with the drafter on {source}: exactness broken")
    first = dict(on_r[0])
    first["on"] = statistics.median(r["outside_tps"] for r in on_r)
    first["off"] = statistics.median(r["outside_tps"] for r in off_r)
    return first


class Demo:
    """Renders prompts with the demo's own tokenizer and chat template (what a client would send)."""

    def __init__(self, target_dir: Path):
        from transformers import AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(str(target_dir))
        self.template = (target_dir / "chat_template.jinja").read_text(encoding="utf-8")

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=False)

    def rendered(self, conv: dc.Conversation) -> str:
        messages, tools = dc.render_conversation(conv)
        text = self.tok.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=True, chat_template=self.template
        )
        return text.removeprefix("<bos>")  # --no-template adds BOS itself


def messages_source(turns: list[tuple[str, str]], tmp: Path) -> list[str]:
    """--messages FILE (earlier turns answered with their corpus reply), or --prompt for one turn."""
    if len(turns) == 1:
        return ["--prompt", turns[0][0]]
    messages = []
    for q, key in turns[:-1]:
        messages += [{"role": "user", "content": q}, {"role": "assistant", "content": topic_reply(key)}]
    messages.append({"role": "user", "content": turns[-1][0]})
    path = tmp / f"messages-{abs(hash(tuple(turns)))}.json"
    path.write_text(json.dumps(messages), encoding="utf-8")
    return ["--messages", str(path)]


# -- tool calls -------------------------------------------------------------------------------------

_CALL = re.compile(r"<\|tool_call>call:([\w.-]+)\{(.*?)\}<tool_call\|>", re.S)
_ARG = re.compile(r'(\w+):<\|"\|>(.*?)<\|"\|>', re.S)


def parse_call(text: str) -> tuple[str, dict] | None:
    """(name, string arguments) of the one tool call `text` holds (string arguments only: the time
    tools take nothing else), or None."""
    calls = _CALL.findall(text)
    if len(calls) != 1:
        return None
    name, body = calls[0]
    args = dict(_ARG.findall(body))
    if _ARG.sub("", body).strip(", ") != "":
        return None  # something other than key:<|"|>value<|"|> pairs
    return name, args


class McpTime:
    """A minimal MCP stdio client (JSON-RPC lines) for the real mcp-server-time: initialize, call tools."""

    def __init__(self, cmd: str):
        self.proc = subprocess.Popen(
            cmd.split(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        self.next_id = 0
        self.request(
            "initialize",
            {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "measure_demo", "version": "1"},
            },
        )
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        self.tools = self.request("tools/list", {})["tools"]

    def send(self, msg: dict) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()

    def request(self, method: str, params: dict) -> dict:
        self.next_id += 1
        self.send({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params})
        assert self.proc.stdout is not None
        while True:
            msg = json.loads(self.proc.stdout.readline())
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg["result"]

    def call(self, name: str, args: dict) -> dict | str:
        res = self.request("tools/call", {"name": name, "arguments": args})
        if res.get("isError"):
            return res["content"][0]["text"]
        return res.get("structuredContent") or json.loads(res["content"][0]["text"])

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


def local_result(name: str, args: dict) -> dict | str:
    """The server's answer computed here (same shape) when no --mcp server is given."""
    try:
        if name == "get_current_time":
            return dc.time_result(args["timezone"], datetime.now(UTC))
        if name == "convert_time":
            return dc.convert_result(args["source_timezone"], args["time"], args["target_timezone"], datetime.now(UTC))
    except Exception as e:  # an unknown zone: the server's error text
        return f"Error executing tool {name}: Invalid timezone: {e}"
    return f"Error executing tool {name}: Unknown tool"


def run_tool_case(demo: Demo, pairing, events, expected, call_tool, args, tmp, local_tz: str) -> list[dict]:
    """One question with the tools declared: its first reply (a call, or a plain reply), and after a
    call, the answer to its result. Rows for the table."""
    conv = dc.Conversation(local_tz, list(events))
    res = measure(pairing, ["--no-template", "--prompt", demo.rendered(conv)], args.repeats, args.max_tokens)
    text = reply_text(demo, res["ids"])
    users = tuple(e[1] for e in events if e[0] == "user")
    question = users[-1] + (" (in corpus)" if users in args.seen_with_tools else "")
    if isinstance(expected, str):
        return [{**res, "prompt": f"[tools] {question}", "ok": on_topic(text, expected, True), "text": text}]
    name, want = expected
    want = {k: v.replace("{local}", local_tz) for k, v in want.items()}
    got = parse_call(text)
    row = {**res, "prompt": f"[tools] {question}", "ok": got == (name, want), "text": text}
    if got is None:
        return [row]
    result = call_tool(*got)
    answer_events = [*events, ("call", got[0], got[1]), ("result", got[0], result, False)]
    conv = dc.Conversation(local_tz, answer_events)
    res2 = measure(pairing, ["--no-template", "--prompt", demo.rendered(conv)], args.repeats, args.max_tokens)
    answer = reply_text(demo, res2["ids"])
    if isinstance(result, str):
        ok = answer.startswith(dc.TIME_ERROR_REPLY)
    else:
        ok = answer.strip() == (dc.time_answer(result) if got[0] == "get_current_time" else dc.convert_answer(result))
    return [row, {**res2, "prompt": "  -> answer to its result", "ok": ok, "text": answer}]


def tool_rows(demo: Demo, pairing, args, tmp, off_topic: bool = False) -> list[dict]:
    """The tool cases and follow-ups, or (`off_topic`) the off-topic questions, with the time tools declared."""
    server = McpTime(args.mcp) if args.mcp else None
    local_tz = LOCAL_TZ
    if server is not None:  # the real server's declarations name its local timezone
        desc = server.tools[0]["inputSchema"]["properties"]["timezone"]["description"]
        local_tz = re.search(r"Use '([^']+)' as local", desc).group(1)  # type: ignore[union-attr]
        declared = [
            {"name": t["name"], "description": t["description"], "parameters": t["inputSchema"]} for t in server.tools
        ]
        ours = [t["function"] for t in dc.time_tools(local_tz)]
        if declared != ours:
            raise SystemExit("the server's tools differ from demo_corpus.time_tools(): retrain against them")

    def call_tool(name, a):
        return server.call(name, a) if server else local_result(name, a)

    rows = []
    try:
        cases = [(q, "off_topic") for q in OFF_TOPIC_HELD_OUT] if off_topic else TOOL_CASES
        for question, expected in cases:
            rows += run_tool_case(demo, pairing, [("user", question)], expected, call_tool, args, tmp, local_tz)
        for (q1, a1), (q2, a2) in [] if off_topic else TOOL_FOLLOW_UPS:
            r1 = call_tool("get_current_time", a1)
            before = [("user", q1), ("call", "get_current_time", a1), ("result", "get_current_time", r1, False)]
            before.append(("reply", dc.time_answer(r1) if isinstance(r1, dict) else dc.TIME_ERROR_REPLY))
            rows += run_tool_case(
                demo, pairing, [*before, ("user", q2)], ("get_current_time", a2), call_tool, args, tmp, local_tz
            )
        for q, a in [] if off_topic else TOOL_DENIED:
            denied: list[tuple] = [("user", q), ("call", "get_current_time", a)]
            denied.append(("result", "get_current_time", dc.DENIED_RESULT, True))
            rows += run_tool_case(demo, pairing, denied, "denied", call_tool, args, tmp, local_tz)
    finally:
        if server is not None:
            server.close()
    return rows


# -- report -------------------------------------------------------------------------------------------


def print_table(title: str, rows: list[dict]) -> None:
    print(f"\n## {title}\n")
    print(f"{'prompt':<58} {'tok':>4} {'drafts':>7} {'on':>6} {'off':>6} {'ratio':>6}  ok")
    for r in rows:
        share = r["accepted"] / max(r["tokens"], 1)
        ratio = r["on"] / r["off"] if r["off"] == r["off"] and r["off"] > 0 else float("nan")
        print(
            f"{r['prompt'][:58]:<58} {r['tokens']:>4} {share:>6.0%} {r['on']:>6.1f} {r['off']:>6.1f} {ratio:>5.2f}x  "
            f"{'yes' if r['ok'] else 'NO'}"
        )
        if not r["ok"]:
            print(f"      reply: {r['text'][:150]!r}")
    tokens = sum(r["tokens"] for r in rows)
    accepted = sum(r["accepted"] for r in rows)
    ratios = [r["on"] / r["off"] for r in rows if r["off"] > 0 and r["on"] == r["on"]]
    ok = sum(r["ok"] for r in rows)
    print(
        f"\n{title}: {ok}/{len(rows)} = {ok / max(len(rows), 1):.0%} ok; tokens from accepted drafts "
        f"{accepted}/{tokens} = {accepted / max(tokens, 1):.1%}; decode speed-up median "
        f"{statistics.median(ratios) if ratios else float('nan'):.2f}x "
        f"(range {min(ratios, default=float('nan')):.2f}-{max(ratios, default=float('nan')):.2f}x)"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--set", choices=["speed", "held-out", "off-topic", "tools", "off-topic-tools", "all"], default="all"
    )
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--model", help="target directory (default: the shipped demo)")
    ap.add_argument("--drafter", help="drafter directory (with --model)")
    ap.add_argument("--mcp", metavar="CMD", help="run the tool calls with this mcp-server-time command")
    ap.add_argument(
        "--in-process",
        action="store_true",
        help="one engine in this process instead of a gemma-chat generate process per run (much faster)",
    )
    args = ap.parse_args(argv)
    pairing = ["--model", args.model, "--drafter", args.drafter] if args.model else ["--demo"]
    target_dir = Path(args.model) if args.model else ROOT / "core" / "data" / "demo" / "target"
    demo = Demo(target_dir)
    trained = trained_conversations(target_dir)
    leaked = held_out_leaks(trained)
    if leaked:
        raise SystemExit(f"held-out conversations found in the corpus: {leaked}")
    args.seen_with_tools = corpus_user_sequences(trained, tools=True)
    tmp = Path(tempfile.mkdtemp(prefix="measure-demo-"))
    global IN_PROCESS
    if args.in_process:
        sys.path.insert(0, str(ROOT))
        IN_PROCESS = InProcess(pairing)
    sets = ["speed", "held-out", "off-topic", "tools", "off-topic-tools"] if args.set == "all" else [args.set]
    for name in sets:
        rows = []
        if name == "speed":
            for q in SPEED_PROMPTS:
                r = measure(pairing, ["--prompt", q], args.repeats, args.max_tokens)
                key = corpus_key(q)
                if key is None:
                    raise SystemExit(f"speed prompt {q!r} is not in the corpus")
                text = reply_text(demo, r["ids"])
                rows.append({**r, "prompt": q, "ok": on_topic(text, key), "text": text})
        elif name == "held-out":
            for turns in HELD_OUT:
                r = measure(pairing, messages_source(turns, tmp), args.repeats, args.max_tokens)
                text = reply_text(demo, r["ids"])
                label = " / ".join(q for q, _ in turns)
                rows.append({**r, "prompt": label, "ok": on_topic(text, turns[-1][1]), "text": text})
        elif name == "off-topic":
            for q in OFF_TOPIC_HELD_OUT:
                r = measure(pairing, ["--prompt", q], args.repeats, args.max_tokens)
                text = reply_text(demo, r["ids"])
                rows.append({**r, "prompt": q, "ok": on_topic(text, "off_topic"), "text": text})
        else:
            rows = tool_rows(demo, pairing, args, tmp, off_topic=name == "off-topic-tools")
        print_table(name, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
