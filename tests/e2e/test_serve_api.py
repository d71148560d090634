"""The rest of what OpenAI clients send to `gemma-chat serve` (issue 25): `logprobs` / `top_logprobs`,
`/v1/completions`, `stream_options.include_usage`, `n`; driven by the official `openai` client over a
real engine on the reference pack's e-style pairing (the real process: tests/e2e/test_serve_parallel.py).

The logprobs are checked against the target itself: the prompt and the reply run through it in one
teacher-forced pass give the same log-probabilities the speculative rounds reported.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import mlx.core as mx
import pytest

from core.engine.contract import PairingSpec
from core.engine.local import Engine
from core.frontends.server import BackgroundServer, ServerConfig, create_app
from core.model.target import load_target

openai = pytest.importorskip("openai")

PACK = "tests/data/pack/models"
TARGET, DRAFTER = f"{PACK}/e-style-target", f"{PACK}/e-style-assistant"
QUESTION = [{"role": "user", "content": "How do I reverse a list in place?"}]


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    engine = Engine()
    try:
        engine.load(PairingSpec("e-style", TARGET, DRAFTER), None).result(timeout=120)
        app = create_app(engine, ServerConfig(model_id="e-style"))
        with BackgroundServer(app) as base:
            yield base
    finally:
        engine.close()


def client(url: str) -> Any:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", timeout=600, max_retries=0)


def chat(url: str, stream: bool = False, **kwargs: Any) -> tuple[str, list[Any], list[int], Any]:
    """(content, logprobs content items, token ids, usage) of one greedy chat completion."""
    kwargs = {"model": "e-style", "messages": QUESTION, "max_tokens": 24, "temperature": 0, **kwargs}
    if not stream:
        r = client(url).chat.completions.create(**kwargs)
        ext = r.model_extra["gemma_chat"]
        items = r.choices[0].logprobs.content if r.choices[0].logprobs else []
        return r.choices[0].message.content, items, [t["id"] for t in ext["tokens"]], r.usage
    chunks = list(client(url).chat.completions.create(stream=True, **kwargs))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    items = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    ids = [t["id"] for c in chunks for t in (c.model_extra.get("gemma_chat") or {}).get("tokens", [])]
    return text, items, ids, chunks[-1].usage


def test_logprobs_are_the_targets_with_the_drafter_or_without(url: str) -> None:
    off = chat(url, logprobs=True, top_logprobs=3, extra_body={"drafter": False})
    for drafter, stream in ((True, False), (True, True), (False, True)):
        on = chat(url, stream, logprobs=True, top_logprobs=3, extra_body={"drafter": drafter, "block_size": 4})
        assert on[2] == off[2] and on[0] == off[0]
        assert [(t.token, t.bytes) for t in on[1]] == [(t.token, t.bytes) for t in off[1]]
        assert [t.logprob for t in on[1]] == pytest.approx([t.logprob for t in off[1]], abs=1e-5)
        for a, b in zip(on[1], off[1]):
            assert [x.token for x in a.top_logprobs] == [x.token for x in b.top_logprobs]
    text, items, ids, _ = off
    # OpenAI's shape: one item per token of the content, its text and bytes; greedy picks the most likely
    assert "".join(t.token for t in items) == text and b"".join(bytes(t.bytes) for t in items) == text.encode()
    for t in items:
        assert len(t.top_logprobs) == 3 and t.top_logprobs[0].token == t.token
        assert t.top_logprobs[0].logprob == pytest.approx(t.logprob)
        assert [x.logprob for x in t.top_logprobs] == sorted((x.logprob for x in t.top_logprobs), reverse=True)
    assert all(i.logprob <= 0 for i in items) and len(items) >= len(ids) - 1  # the end-of-turn token has no text


def test_completion_logprobs_equal_a_teacher_forced_pass_of_the_target(url: str) -> None:
    # a prompt of token ids (fed as they are, no BOS added): BOS and the start of the model's own reply
    prompt = [2, *chat(url)[2][:6]]
    r = client(url).completions.create(
        model="e-style", prompt=prompt, max_tokens=12, logprobs=2, temperature=0, extra_body={"ignore_eos": True}
    )
    tokens = r.model_extra["gemma_chat"]["tokens"]
    ids = [t["id"] for t in tokens]
    lp = r.choices[0].logprobs
    tg = load_target(TARGET)
    logits, _ = tg.forward(prompt + ids[:-1], tg.make_cache(), logits="all")
    assert logits is not None and len(ids) == 12
    forced = logits[len(prompt) - 1 :] - mx.logsumexp(logits[len(prompt) - 1 :], axis=-1, keepdims=True)
    # one entry per token of the text: an end-of-turn token (text "") has none
    expected = [forced[j, t["id"]].item() for j, t in enumerate(tokens) if t["text"]]
    assert len(expected) >= 4 and lp.token_logprobs == pytest.approx(expected, abs=2e-3)
    assert "".join(lp.tokens) == r.choices[0].text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    assert all(len(top) <= 2 and lp.tokens[i] in top for i, top in enumerate(lp.top_logprobs))


def test_completions_take_a_plain_prompt_streamed_or_whole(url: str) -> None:
    c = client(url)
    whole = c.completions.create(model="e-style", prompt="The list", max_tokens=10, temperature=0)
    assert whole.object == "text_completion" and whole.id.startswith("cmpl-")
    assert whole.choices[0].finish_reason == "length" and whole.usage.completion_tokens == 10
    assert whole.choices[0].logprobs is None
    chunks = list(c.completions.create(model="e-style", prompt="The list", max_tokens=10, temperature=0, stream=True))
    assert "".join(ch.choices[0].text for ch in chunks) == whole.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "length"
    # the default max_tokens is OpenAI's (16); a stop string ends the text before it
    default = c.completions.create(model="e-style", prompt="The list", extra_body={"ignore_eos": True})
    assert default.usage.completion_tokens == 16
    text = whole.choices[0].text
    stop = text[len(text) // 2 :][:3]
    cut = c.completions.create(model="e-style", prompt="The list", max_tokens=10, temperature=0, stop=[stop])
    assert cut.choices[0].text == text[: text.index(stop)] and cut.choices[0].finish_reason == "stop"


def test_streamed_completion_logprobs_concatenate_to_the_whole_ones(url: str) -> None:
    kwargs = {"model": "e-style", "prompt": "The list", "max_tokens": 12, "logprobs": 3, "temperature": 0}
    kwargs["extra_body"] = {"ignore_eos": True, "block_size": 4}
    c = client(url)
    whole = c.completions.create(**kwargs)
    chunks = list(c.completions.create(stream=True, **kwargs))
    lp = whole.choices[0].logprobs
    assert len(lp.tokens) >= 8 and "".join(lp.tokens) == whole.choices[0].text
    parts = [ch.choices[0].logprobs for ch in chunks if ch.choices[0].logprobs]
    assert len(parts) >= 2  # several chunks carry logprobs: the offsets must go on across them
    assert "".join(ch.choices[0].text for ch in chunks) == whole.choices[0].text
    assert [t for p in parts for t in p.tokens] == lp.tokens
    assert [x for p in parts for x in p.token_logprobs] == pytest.approx(lp.token_logprobs, abs=1e-5)
    tops = [top for p in parts for top in p.top_logprobs]
    assert [list(top) for top in tops] == [list(top) for top in lp.top_logprobs]
    assert [v for top in tops for v in top.values()] == pytest.approx(
        [v for top in lp.top_logprobs for v in top.values()], abs=1e-5
    )
    # text_offset counts from the start of the whole reply, not of each chunk
    assert [o for p in parts for o in p.text_offset] == lp.text_offset
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]


def test_completion_include_usage_sends_the_usage_as_a_last_chunk_without_choices(url: str) -> None:
    kwargs = {"model": "e-style", "prompt": "The list", "max_tokens": 8, "temperature": 0}
    c = client(url)
    whole = c.completions.create(**kwargs)
    chunks = list(c.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
    last = chunks[-1]
    assert last.object == "text_completion" and last.choices == [] and last.usage is not None
    assert last.usage.completion_tokens == 8 == whole.usage.completion_tokens
    assert last.usage.prompt_tokens == whole.usage.prompt_tokens > 0
    assert last.usage.total_tokens == last.usage.prompt_tokens + 8
    assert all(ch.usage is None for ch in chunks[:-1]) and chunks[-2].choices[0].finish_reason == "length"
    assert "".join(ch.choices[0].text for ch in chunks[:-1]) == whole.choices[0].text
    plain = list(c.completions.create(stream=True, **kwargs))
    assert plain[-1].choices[0].finish_reason == "length" and plain[-1].usage.completion_tokens == 8


def test_include_usage_sends_the_usage_as_a_last_chunk_without_choices(url: str) -> None:
    chunks = list(
        client(url).chat.completions.create(
            model="e-style", messages=QUESTION, max_tokens=8, stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 8
    assert chunks[-1].usage.total_tokens == chunks[-1].usage.prompt_tokens + 8
    assert all(c.usage is None for c in chunks[:-1]) and chunks[-2].choices[0].finish_reason == "length"
    plain = list(client(url).chat.completions.create(model="e-style", messages=QUESTION, max_tokens=8, stream=True))
    assert plain[-1].choices[0].finish_reason == "length" and plain[-1].usage.completion_tokens == 8


@pytest.mark.parametrize(
    ("route", "body", "param"),
    [
        ("chat", {"n": 2}, "n"),
        ("chat", {"top_logprobs": 2}, "top_logprobs"),
        ("chat", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ("chat", {"logprobs": "yes"}, "logprobs"),
        ("chat", {"stream_options": {"include_usage": True}}, "stream_options"),
        ("completions", {"n": 3}, "n"),
        ("completions", {"echo": True}, "echo"),
        ("completions", {"logprobs": 30}, "logprobs"),
        ("completions", {"prompt": ["one", "two"]}, "prompt"),
        ("completions", {"prompt": ""}, "prompt"),
        ("completions", {"prompt": [2, 10**9]}, "prompt"),
        ("completions", {"prompt": [2, -1]}, "prompt"),
    ],
)
def test_what_is_not_served_is_a_clear_400(url: str, route: str, body: dict, param: str) -> None:
    c = client(url)
    with pytest.raises(openai.BadRequestError) as e:
        if route == "chat":
            c.chat.completions.create(model="e-style", messages=QUESTION, max_tokens=4, extra_body=body)
        else:
            c.completions.create(model="e-style", prompt=body.pop("prompt", "hi"), max_tokens=4, extra_body=body)
    error = e.value.body
    assert error["param"] == param and error["type"] == "invalid_request_error" and error["message"]


def test_completions_refused_by_an_engine_without_plain_prompts() -> None:
    from support.fake_engine import FakeEngine
    from support.fake_engine import PairingSpec as FakeSpec

    engine = FakeEngine()
    engine.load(FakeSpec("fake", "t", "d"), lambda e: None).result(timeout=5)
    with contextlib.ExitStack() as stack:
        stack.callback(engine.close)
        if hasattr(engine, "complete"):
            pytest.skip("the fake engine serves plain prompts")
        base = stack.enter_context(BackgroundServer(create_app(engine, ServerConfig(model_id="fake"))))
        with pytest.raises(openai.NotFoundError):
            client(base).completions.create(model="fake", prompt="hi", max_tokens=4)
