"""`gemma-chat serve --demo --parallel N` as a process, driven by the official `openai` client from
8 threads at once (issue 25): every streamed answer is the one the same request gets alone (greedy),
with per-token draft marks and per-request stats; past `--max-waiting` a request gets 429 at once,
and the server keeps serving."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from serve_process import ServeProcess

openai = pytest.importorskip("openai")

QUESTIONS = [
    "What is speculative decoding?",
    "Tell me about the sea.",
    "What is a cat?",
    "Write a poem about rain.",
    "hi",
    "Explain rivers.",
    "Why is the sky blue?",
    "Name three colours.",
]


def client(server: ServeProcess) -> Any:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=300, max_retries=0)


def streamed(server: ServeProcess, question: str, max_tokens: int = 32) -> dict[str, Any]:
    stream = client(server).chat.completions.create(
        model="demo",
        messages=[{"role": "user", "content": question}],
        temperature=0,
        max_tokens=max_tokens,
        stream=True,
    )
    chunks = list(stream)
    tokens = [t for c in chunks for t in (c.model_extra.get("gemma_chat") or {}).get("tokens", [])]
    return {
        "ids": [t["id"] for t in tokens],
        "text": "".join(c.choices[0].delta.content or "" for c in chunks if c.choices),
        "token_text": "".join(t["text"] for t in tokens),
        "from_draft": [t["from_draft"] for t in tokens],
        "stats": chunks[-1].model_extra["gemma_chat"]["stats"],
        "finish": chunks[-1].choices[0].finish_reason,
    }


@pytest.fixture(scope="module")
def server() -> Any:
    with ServeProcess(["--demo", "--parallel", "4", "--max-waiting", "8"]) as s:
        yield s


def test_eight_threads_get_their_solo_answers_with_draft_marks(server: ServeProcess) -> None:
    alone = [streamed(server, q) for q in QUESTIONS]  # one at a time
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(lambda q: streamed(server, q), QUESTIONS))
    for q, a, t in zip(QUESTIONS, alone, together):
        assert t["ids"] == a["ids"] and t["ids"], q
        assert t["text"] == a["text"] == t["token_text"]
        assert t["stats"]["tokens"] == len(t["ids"])
        assert t["stats"]["decode_tokens"] == len(t["ids"]) - 1
        assert t["finish"] in ("stop", "length")
    marks = [m for t in together for m in t["from_draft"]]
    assert any(marks) and not all(marks)  # drafted tokens and the target's own, marked per token
    # stats are per request: each its own rounds and acceptance, as its own tokens' marks count them (the
    # batch's totals would not match; a demo that drafts every reply alike gives every request the same
    # rounds, so comparing requests with each other proves nothing)
    for t in together:
        assert t["stats"]["accepted"] == sum(t["from_draft"]), t["stats"]
        assert 1 <= t["stats"]["rounds"] <= t["stats"]["decode_tokens"], t["stats"]
    health = client(server)._client.get(server.url + "/health").json()
    assert health["parallel"] == 4 and health["running"] == 0 and health["waiting"] == 0


def test_past_max_waiting_is_429_at_once_and_the_rest_complete() -> None:
    with ServeProcess(["--demo", "--parallel", "2", "--max-waiting", "1"]) as s:
        s_alone = streamed(s, QUESTIONS[1], max_tokens=200)
        results: list[Any] = [None] * 6
        started = threading.Barrier(6)

        def one(i: int) -> None:
            started.wait()
            t0 = time.monotonic()
            try:
                results[i] = ("ok", streamed(s, QUESTIONS[1], max_tokens=200), time.monotonic() - t0)
            except openai.RateLimitError as e:
                results[i] = ("429", e, time.monotonic() - t0)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=600)
        ok = [r for r in results if r and r[0] == "ok"]
        busy = [r for r in results if r and r[0] == "429"]
        assert len(ok) + len(busy) == 6
        assert len(ok) >= 3 and busy  # two rows and one waiting seat; the others are refused
        assert all(r[1]["ids"] == s_alone["ids"] for r in ok)
        assert all(r[2] < 5 for r in busy)  # refused at once, not after waiting
        assert streamed(s, QUESTIONS[0])["ids"]  # and it keeps serving


def logprob_stream(server: ServeProcess, question: str) -> dict[str, Any]:
    """One greedy streamed chat with logprobs and stream_options.include_usage, as an OpenAI client sends it."""
    stream = client(server).chat.completions.create(
        model="demo",
        messages=[{"role": "user", "content": question}],
        temperature=0,
        max_tokens=32,
        stream=True,
        logprobs=True,
        top_logprobs=2,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    exts = [c.model_extra.get("gemma_chat") or {} for c in chunks]
    items = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    return {
        "ids": [t["id"] for e in exts for t in e.get("tokens", [])],
        "text": "".join(c.choices[0].delta.content or "" for c in chunks if c.choices),
        "logprobs": [t.logprob for t in items],
        "top": [[x.token for x in t.top_logprobs] for t in items],
        "tokens": "".join(t.token for t in items),
        "rounds": [r for e in exts for r in e.get("rounds", [])],
        "stats": next(e["stats"] for e in exts if "stats" in e),
        "usage": chunks[-1].usage if not chunks[-1].choices else None,
    }


def completion(server: ServeProcess, prompt: str) -> tuple[str, list[float]]:
    r = client(server).completions.create(model="demo", prompt=prompt, max_tokens=24, temperature=0, logprobs=1)
    return r.choices[0].text, r.choices[0].logprobs.token_logprobs


def test_concurrent_rows_keep_their_own_logprobs_usage_and_stats(server: ServeProcess) -> None:
    questions = QUESTIONS[:4]
    alone = [logprob_stream(server, q) for q in questions]
    plain_alone = completion(server, "The sea is")
    with ThreadPoolExecutor(5) as pool:
        plain = pool.submit(completion, server, "The sea is")  # a plain prompt in the same batch
        together = list(pool.map(lambda q: logprob_stream(server, q), questions))
    assert plain.result()[0] == plain_alone[0] and plain.result()[1] == pytest.approx(plain_alone[1], abs=1e-4)
    for a, t in zip(alone, together):
        assert t["ids"] == a["ids"] and t["text"] == a["text"] == t["tokens"]
        assert t["logprobs"] == pytest.approx(a["logprobs"], abs=1e-4) and t["top"] == a["top"]
        assert t["usage"] is not None and t["usage"].completion_tokens == len(t["ids"]) == t["stats"]["tokens"]
        # each row's stats are its own: the rounds it streamed, its drafts and acceptance
        assert t["stats"]["rounds"] == len(t["rounds"])
        assert t["stats"]["accepted"] == sum(r["accepted"] for r in t["rounds"])
        assert t["stats"]["drafted"] == sum(r["drafted"] for r in t["rounds"])
        assert t["stats"]["decode_tokens"] == sum(r["emitted"] for r in t["rounds"]) == len(t["ids"]) - 1


def test_a_continued_conversation_reports_its_reused_prompt_tokens(server: ServeProcess) -> None:
    """An agent resends the conversation: the second turn starts from the first turn's cache (prefix reuse
    across requests), which `usage.prompt_tokens_details.cached_tokens` reports as OpenAI does; the answer
    is the one it gets from scratch (greedy)."""
    c = client(server)
    first = [{"role": "user", "content": "Describe the moon at night, please."}]
    r1 = c.chat.completions.create(model="demo", messages=first, temperature=0, max_tokens=24)
    assert r1.usage is not None and r1.usage.prompt_tokens_details is not None
    assert r1.usage.prompt_tokens_details.cached_tokens == 0
    second = first + [
        {"role": "assistant", "content": r1.choices[0].message.content},
        {"role": "user", "content": "And the sun?"},
    ]
    answers = []
    for _ in range(2):
        r2 = c.chat.completions.create(model="demo", messages=second, temperature=0, max_tokens=24)
        assert r2.usage is not None and r2.usage.prompt_tokens_details is not None
        answers.append((r2.choices[0].message.content, r2.usage.prompt_tokens_details.cached_tokens))
    (text_a, cached_a), (text_b, cached_b) = answers
    assert (
        r1.usage.prompt_tokens + 10 < cached_a < r2.usage.prompt_tokens
    )  # the first turn's prompt and most of its reply
    assert cached_b == r2.usage.prompt_tokens - 1 and text_b == text_a  # the same request again: all but its last token
    with ServeProcess(["--demo", "--parallel", "2"]) as fresh:  # nothing cached there
        r3 = client(fresh).chat.completions.create(model="demo", messages=second, temperature=0, max_tokens=24)
        assert r3.usage is not None and r3.usage.prompt_tokens_details is not None
        assert r3.usage.prompt_tokens_details.cached_tokens == 0 and r3.choices[0].message.content == text_a
