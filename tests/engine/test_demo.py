"""core.hub.demo: the trained demo pairing ships in the package, is checked against its sha256
manifest, loads with no build step, and behaves like a trained model: English replies that end
their turn, and a drafter the target agrees with."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest
from support import factory

from app.cli import main
from core.hub import demo

ROOT = Path(__file__).resolve().parents[2]


def _json_lines(out: str) -> list[dict]:
    return [json.loads(line) for line in out.strip().splitlines() if line.startswith("{")]


def _generate(capsys, prompt: str, *extra: str) -> tuple[list[dict], dict]:
    rc = main(["generate", "--demo", "--prompt", prompt, "--temp", "0", "--json", *extra])
    lines = _json_lines(capsys.readouterr().out)
    assert rc == 0, lines[-1:]
    return [x for x in lines if "id" in x], lines[-1]["stats"]


def test_shipped_pairing_loads_from_the_package_without_building(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("GEMMA_CHAT_CACHE_DIR", str(cache))
    monkeypatch.setattr(factory, "build_pairing", lambda *a, **k: pytest.fail("the demo must not be built"))
    target, drafter = demo.ensure_demo_pairing()
    assert target == demo.DEMO_DIR / "target" and drafter == demo.DEMO_DIR / "assistant"
    assert demo.DEMO_DIR.is_relative_to(ROOT / "core")  # inside the package
    assert not cache.exists()  # nothing written to the cache
    assert json.loads((target / "config.json").read_text())["model_type"] == "gemma4"
    d_cfg = json.loads((drafter / "config.json").read_text())
    assert d_cfg["model_type"] == "gemma4_assistant" and d_cfg["use_ordered_embeddings"] is True
    for d in (target, drafter, demo.DEMO_DIR):
        assert demo.is_demo_checkpoint(d)
    m = demo.manifest()
    assert m["trained"] is True and "target/model.safetensors" in m["sha256"]
    size = sum((demo.DEMO_DIR / f).stat().st_size for f in m["sha256"])
    assert size < 20e6  # issue 23: "under ~20 MB in the package"
    label = demo.demo_label()
    assert label.startswith("DEMO — tiny model trained on") and " M params" in label


def test_a_corrupted_shipped_file_is_refused_with_a_clear_message(tmp_path):
    copy = tmp_path / "demo"
    shutil.copytree(demo.DEMO_DIR, copy)
    assert demo.verify(copy) == (copy / "target", copy / "assistant")

    weights = copy / "target" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte in the middle of the weights
    weights.write_bytes(bytes(data))
    with pytest.raises(demo.DemoIntegrityError, match=r"damaged: .*target/model\.safetensors.*sha256"):
        demo.verify(copy)

    shutil.copyfile(demo.DEMO_DIR / "target" / "model.safetensors", weights)
    (copy / "assistant" / "config.json").unlink()
    with pytest.raises(demo.DemoIntegrityError, match=r"incomplete: .*assistant/config\.json is missing"):
        demo.verify(copy)


def test_the_cli_says_so_when_the_shipped_demo_is_damaged(tmp_path, monkeypatch, capsys):
    copy = tmp_path / "demo"
    shutil.copytree(demo.DEMO_DIR, copy)
    (copy / "assistant" / "model.safetensors").write_bytes(b"not weights")
    monkeypatch.setattr(demo, "DEMO_DIR", copy)
    with pytest.raises(demo.DemoIntegrityError):
        demo.verify(copy)
    rc = main(["generate", "--demo", "--prompt", "hi", "--json"])
    out = capsys.readouterr().out
    assert rc != 0 and "damaged" in out


def _corpus_words() -> set[str]:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import demo_corpus
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    text = " ".join(q + " " + " ".join(a) for a, q in demo_corpus.PROJECT_TURNS)
    return {w.lower() for w in re.findall(r"[A-Za-z]+", text)}


def test_greedy_reply_to_a_greeting_is_english_and_ends_its_turn(capsys):
    tokens, stats = _generate(capsys, "Hello!", "--max-tokens", "96")
    text = "".join(t["text"] for t in tokens)
    assert stats["stop_reason"] == "eos"  # it ended its turn (with <turn|>) before 96 tokens
    words = re.findall(r"[A-Za-z]+", text)
    known = _corpus_words()
    assert len(words) >= 5, text
    real = [w for w in words if w.lower() in known]
    assert len(real) / len(words) >= 0.9, text  # real words, not sub-word salad


def test_drafts_are_accepted_and_greedy_output_is_unchanged(capsys):
    prompt = "What is speculative decoding?"
    # a fixed block size: auto's choices follow measured timings, this must be deterministic
    tokens, stats = _generate(capsys, prompt, "--max-tokens", "64", "--block-size", "3")
    plain, plain_stats = _generate(capsys, prompt, "--max-tokens", "64", "--no-draft")
    assert [t["id"] for t in tokens] == [t["id"] for t in plain]  # float32: token-identical
    from_drafts = sum(t["from_draft"] for t in tokens)
    assert from_drafts == stats["accepted"]
    # the random-weight demo's drafter got 0 % here, the first trained one 22 % (its cluster table was
    # the factory's random one), the second 42 of 64 (66 %); the retrained one (multi-turn, 3.6 M target,
    # 245 drafter steps) 23 of 43 (53 %), 2.1 tokens per round
    assert from_drafts / len(tokens) >= 0.5, stats
    assert stats["tokens_per_round"] > 2.0


def test_compiled_drafted_replies_are_the_uncompiled_plain_one(compiled):
    """The suite runs MLX uncompiled (tests/conftest.py); a user's CPU runs compiled once its kernels are
    built (mlx-lm's fused pieces): there too drafting at a fixed and at auto block size gives the target's
    own greedy tokens, the ones it gives uncompiled."""
    import mlx.core as mx
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    from core.decode import chat_format
    from core.decode.spec import Decoder, Prompt
    from core.model.drafter import load_drafter
    from core.model.target import load_target
    from core.settings import GenerationSettings

    tg, dr = load_target(demo.DEMO_DIR / "target"), load_drafter(demo.DEMO_DIR / "assistant")
    tok = load_tokenizer(demo.DEMO_DIR / "target")
    messages = chat_format.normalize_messages([{"role": "user", "content": "What is speculative decoding?"}])
    text = chat_format.render(messages, None, bos=tok.bos_token).text
    ids = tok._tokenizer.encode(text, add_special_tokens=False)

    def reply(block: int | str) -> list[int]:
        settings = GenerationSettings(max_tokens=24, ignore_eos=True, block_size=block)
        run = Decoder(tg, dr if block != 1 else None, None, frozenset()).run
        return run(tg.make_cache(), Prompt(list(ids)), settings, lambda e: None).token_ids

    mx.disable_compile()
    want = reply(1)
    mx.enable_compile()
    for block in (1, 4, "auto"):
        assert reply(block) == want, block


def test_the_drafter_routes_its_drafts_among_the_right_candidates(monkeypatch, capsys):
    """The centroid head drafts among the tokens of its top clusters (`token_ordering`): with the
    cluster table it was trained with, that is the token its full vocabulary would pick. A table that
    does not match the trained centroids (the first shipped demo kept the factory's random one) routes
    most drafts among the wrong candidates: acceptance collapses while the weights look trained."""
    import mlx.core as mx

    from core.model.drafter import Drafter

    routed_greedy = Drafter.greedy_token
    same: list[bool] = []

    def spy(self, y):
        routed = routed_greedy(self, y)
        full = mx.argmax(self.embed_tokens.as_linear(y.reshape(-1)))
        same.append(int(routed.item()) == int(full.item()))
        return routed

    monkeypatch.setattr(Drafter, "greedy_token", spy)
    _generate(capsys, "What is gemma-chat?", "--max-tokens", "48", "--block-size", "4")
    assert len(same) >= 20
    assert sum(same) / len(same) >= 0.9, f"{sum(same)}/{len(same)} drafts routed to the full-vocabulary choice"


# --- what the retrained demo answers: second turns, other phrasings, off-topic questions, the time tool ---

DATA = ROOT / "tests" / "data"
FIRST = 40  # a reply is on topic when its first 40 characters are those of the topic's corpus reply


def _corpus():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import demo_corpus
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    return demo_corpus


def _topic_reply(key: str) -> str:
    return next(t.reply for t in _corpus().TOPICS if t.key == key)


def _retrained() -> bool:
    """The retrained demos (multi-turn, off-topic reply, time tools: "E", then waves 6-8 in scripts/train_demo.py)
    ship with the canonical template; the first trained demo had the factory's simplified one."""
    return "<|tool_call>" in (demo.DEMO_DIR / "target" / "chat_template.jinja").read_text(encoding="utf-8")


retrained_only = pytest.mark.skipif(not _retrained(), reason="the shipped demo is not the retrained one yet")


@pytest.fixture(scope="module")
def demo_engine():
    from core.engine.local import Engine
    from core.engine.pairings import demo_spec

    engine = Engine()
    engine.load(demo_spec(), None).result(timeout=600)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def demo_tokenizer():
    from core.model.loader import load_tokenizer

    return load_tokenizer(demo.DEMO_DIR / "target")._tokenizer


def _chat(engine, messages: list[dict], max_tokens: int = 96):
    from core.settings import GenerationSettings

    done = engine.chat(messages, GenerationSettings(max_tokens=max_tokens), None).result(timeout=600)
    assert done.error is None, done.error
    return done


@retrained_only
def test_a_second_turn_is_answered_on_topic(demo_engine):
    # the first trained demo answered only a chat's first message: after "Hello" this gave "In tokens."
    greeting = _corpus().GREETING_REPLY
    for question, key in (("What is speculative decoding?", "speculative"), ("What is Gemma 4?", "gemma4")):
        history = [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": greeting}]
        done = _chat(demo_engine, [*history, {"role": "user", "content": question}])
        assert done.text.strip() == _topic_reply(key), done.text
        assert done.stats.stop_reason == "eos"


@retrained_only
def test_held_out_phrasings_are_answered_on_topic(demo_engine):
    # phrasings that are not in the corpus, one of them the greeting's own suggestion in other words
    for question, key in (
        ("Could you describe speculative decoding for me?", "speculative"),
        ("What are the keys for this app?", "keys"),
    ):
        text = _chat(demo_engine, [{"role": "user", "content": question}]).text.strip()
        assert text[:FIRST] == _topic_reply(key)[:FIRST], (question, text)


@retrained_only
def test_questions_it_does_not_know_get_the_off_topic_reply(demo_engine):
    # the README's serve example, and one that is not in the corpus; the first demo made word salad of both
    reply = _corpus().off_topic_reply(with_tools=False)
    assert "speculative decoding" in reply and "Gemma 4" in reply  # it names what it knows
    for question in ("Why is the sky blue?", "What is the capital of Germany?"):
        assert _chat(demo_engine, [{"role": "user", "content": question}]).text.strip() == reply, question


def _time_tools() -> tuple[list[dict], dict]:
    """mcp-server-time's tools as its tools/list gave them (captured), as OpenAI-style schemas, and its calls."""
    captured = json.loads((DATA / "mcp_server_time" / "captured.json").read_text(encoding="utf-8"))
    tools = [
        {
            "type": "function",
            "function": {"name": t["name"], "description": t["description"], "parameters": t["inputSchema"]},
        }
        for t in captured["tools"]
    ]
    return tools, {c["name"]: c for c in captured["calls"]}


@retrained_only
def test_the_shipped_chat_template_is_the_canonical_gemma4_one_and_renders_plain_chats_as_before(demo_tokenizer):
    shipped = (demo.DEMO_DIR / "target" / "chat_template.jinja").read_text(encoding="utf-8")
    assert shipped == (ROOT / "scripts" / "gemma4_e2b_chat_template.jinja").read_text(encoding="utf-8")
    assert "Google Gemma 4 Canonical Chat Template" in shipped and "format_tool_response_block" in shipped
    d_cfg = json.loads((demo.DEMO_DIR / "assistant" / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert d_cfg["chat_template"] == shipped
    chats = [
        [{"role": "user", "content": "Hello"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        [
            {"role": "user", "content": [{"type": "image", "path": "x.png"}, {"type": "text", "text": "What is it?"}]},
            {"role": "assistant", "content": "A cat."},
            {"role": "user", "content": "Sure?"},
        ],
    ]
    for messages in chats:  # the factory's simplified template (what the demo shipped before) renders them alike
        ours = demo_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        before = demo_tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, chat_template=factory.chat_template()
        )
        assert ours == before
    gen = json.loads((demo.DEMO_DIR / "target" / "generation_config.json").read_text(encoding="utf-8"))
    stops = {demo_tokenizer.convert_tokens_to_ids(t) for t in ("<eos>", "<turn|>", "<|tool_response>")}
    assert stops <= set(gen["eos_token_id"])  # a tool call ends the turn at <|tool_response>


def _ask_the_time(engine, question: str):
    from core.settings import GenerationSettings

    tools, _ = _time_tools()
    ask = [{"role": "user", "content": question}]
    done = engine.chat(ask, GenerationSettings(max_tokens=64), None, tools=tools).result(timeout=600)
    assert done.error is None, done.error
    return done


@retrained_only
def test_with_the_time_tools_it_calls_get_current_time_and_stops_for_the_result(demo_engine):
    # mcp-server-time's own declarations (captured), through Engine.chat(tools=) as the chat and the server
    # send them; the first trained demo had no tool template and answered in prose
    from zoneinfo import ZoneInfo

    for question in ("What time is it in Paris?", "what time is it in tokyo"):
        done = _ask_the_time(demo_engine, question)
        assert done.stats.stop_reason == "tool_calls", done  # ended at <|tool_response>: the tool answers
        [call] = done.tool_calls
        assert call.name == "get_current_time" and list(call.arguments) == ["timezone"], call
        ZoneInfo(call.arguments["timezone"])  # a real IANA zone


@retrained_only
def test_the_time_call_names_the_zone_of_the_city_asked_about(demo_engine):
    # the captured declarations name Etc/UTC as the local timezone: a question with no place asks for it
    asked = [("What time is it in Paris?", "Europe/Paris"), ("what time is it in tokyo", "Asia/Tokyo")]
    for question, zone in [*asked, ("What time is it?", "Etc/UTC")]:
        [call] = _ask_the_time(demo_engine, question).tool_calls
        assert call.arguments == {"timezone": zone}, (question, call)


@retrained_only
def test_after_the_result_it_answers_with_the_time_it_was_given(demo_engine):
    from core.settings import GenerationSettings

    tools, calls = _time_tools()
    call = calls["get_current_time"]
    result = call["structured_content"]
    assert call["arguments"] == {"timezone": "Europe/Paris"}
    expected = f"It is {result['datetime'][11:16]} in Europe/Paris."
    tool_call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "get_current_time", "arguments": json.dumps({"timezone": "Europe/Paris"})},
    }
    ask = [{"role": "user", "content": "What time is it in Paris?"}]
    as_mapping = [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [tool_call],
            "tool_responses": [{"name": "get_current_time", "response": result}],
        }
    ]
    as_text = [
        {"role": "assistant", "content": None, "tool_calls": [tool_call]},
        {"role": "tool", "tool_call_id": "c1", "content": call["text"]},
    ]
    for after in (as_mapping, as_text):  # the result as a mapping, or the server's JSON text as the tool message
        done = demo_engine.chat(ask + after, GenerationSettings(max_tokens=64), None, tools=tools).result(600)
        assert done.error is None and done.stats.stop_reason == "eos", done
        assert done.text.strip() == expected


@retrained_only
def test_with_the_time_tools_declared_an_off_topic_question_gets_the_off_topic_reply(demo_engine):
    # the app declares the time tools by default: wave 7 answered these (held out: not in the corpus) with a
    # time call for a made-up zone ("What's 5 + 5?" -> Asia/Dubai)
    reply = _corpus().off_topic_reply(with_tools=True)
    for question in ("What's 5 + 5?", "Tell me about the Eiffel Tower.", "What does pandas.DataFrame do?"):
        done = _ask_the_time(demo_engine, question)
        assert not done.tool_calls and done.text.strip() == reply, (question, done.text)


@retrained_only
def test_after_a_denied_call_it_says_it_cannot_tell_the_time(demo_engine):
    # the chat sends a denied call back as an error result (app/tui/screens/chat_tools.py); wave 7 made up a
    # time after it
    from app.tui.screens import chat_tools
    from core.settings import GenerationSettings

    denied = chat_tools._error(chat_tools.DENIED)
    assert denied == _corpus().DENIED_RESULT  # what the corpus trained on
    tools, _ = _time_tools()
    call = {"name": "get_current_time", "arguments": json.dumps({"timezone": "Europe/Lisbon"})}
    ask = [
        {"role": "user", "content": "What time is it in Lisbon?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": call}]},
        {"role": "tool", "tool_call_id": "c1", "content": denied},
    ]
    done = demo_engine.chat(ask, GenerationSettings(max_tokens=64), None, tools=tools).result(600)
    assert done.error is None and not done.tool_calls, done
    assert done.text.strip() == _corpus().DENIED_REPLY


@retrained_only
def test_without_the_time_tool_a_time_question_gets_a_polite_refusal(demo_engine):
    text = _chat(demo_engine, [{"role": "user", "content": "What time is it in Paris?"}]).text.strip()
    assert text == _corpus().NO_TIME_TOOL_REPLY


def test_the_corpus_declares_the_time_tools_exactly_as_the_server_lists_them():
    tools, _ = _time_tools()
    assert _corpus().time_tools("Etc/UTC") == tools  # the captured listing names this machine's Etc/UTC


def test_no_corpus_conversation_has_a_held_out_turn():
    # scripts/measure_demo.py's held-out set measures what the demo does with phrasings it never saw: no judged
    # held-out turn, typed casually or not, may be a user turn of anything the shipped demo trained on
    # (12 of the 2400 conversations of wave 6's corpus had one: a paraphrased opening, or a later turn)
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import demo_corpus as dc
        import measure_demo as md

        banned = dc.held_out_turns()
        assert dc.normalise("What's MLX?") in banned and dc.normalise("How do I write a loop in Go?") in banned
        wide = [q for qs in dc.WIDE_PHRASINGS.values() for q in qs] + dc.OFF_TOPIC_WIDE + dc.OFF_TOPIC_MORE
        wide += dc.OFF_TOPIC_TOOLS
        assert not [q for q in wide if dc.normalise(q) in banned]
        casual = dc.Conversation(None, [("user", "Hi"), ("reply", dc.GREETING_REPLY), ("user", "what's mlx")])
        assert dc._is_held_out(casual, set(), banned)  # the check that drops it from the corpus
        assert md.held_out_leaks([casual]) == ["what's mlx"]
        assert md.held_out_leaks(md.trained_conversations(demo.DEMO_DIR / "target")) == []
    finally:
        sys.path.remove(str(ROOT / "scripts"))


def test_an_image_sent_to_the_demo_comes_with_a_notice_that_it_cannot_see_it(demo_engine):
    # its vision tower was never trained: the reply to a picture is noise ("tell tell tell …"), and a user
    # trying the demo with an image must learn that from gemma-chat, not guess it from the reply
    from core.engine.local import DEMO_IMAGE_NOTICE
    from core.events import Notice
    from core.settings import GenerationSettings

    image = Path(__file__).resolve().parents[2] / "assets" / "images" / "landscape.jpg"
    asks = {
        "image": [{"type": "image", "path": str(image)}, {"type": "text", "text": "What is in this picture?"}],
        "text": "What is speculative decoding?",
    }
    notices = {}
    for kind, content in asks.items():
        events: list = []
        done = demo_engine.chat([{"role": "user", "content": content}], GenerationSettings(max_tokens=8), events.append)
        assert done.result(timeout=600).error is None
        notices[kind] = [e.text for e in events if isinstance(e, Notice)]
    assert notices == {"image": [DEMO_IMAGE_NOTICE], "text": []}


def test_generate_after_the_apps_demo_flag_runs_the_demo(capsys):
    # `gemma-chat --demo` opens the app on the demo; `gemma-chat --demo generate …` ran generate without it,
    # which said "say which model to run: --model PATH [--drafter PATH], --pairing NAME or --demo"
    assert main(["--demo", "generate", "--prompt", "Hello!", "--max-tokens", "4"]) == 0
    out = capsys.readouterr()
    assert "say which model to run" not in out.err and out.out.strip()
