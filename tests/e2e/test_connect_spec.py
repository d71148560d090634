"""`--connect` to other servers' own per-reply speculative counts (issue 25): llama.cpp's server
(`timings.draft_n` / `draft_n_accepted` on its last chunk) and vLLM started with
`--per-request-spec-decode-metrics` (`metrics.speculative_decoding`), on scripted stand-ins that speak
their dialects (tests/llamacpp_standin.py, tests/vllm_standin.py). The reply's own counts win over the
server-wide /metrics counters, which other users' requests inflate."""

from __future__ import annotations

import time

import pytest

from core.engine.remote import RemoteEngine, ReplySpec, reply_spec
from core.events import RoundEvent, TokenEvent
from core.frontends.server import BackgroundServer
from core.settings import GenerationSettings

HI = [{"role": "user", "content": "hi"}]


def turn(engine: RemoteEngine) -> tuple[list, object]:
    events: list = []
    done = engine.chat(HI, GenerationSettings(), events.append).result(timeout=20)
    return events, done


@pytest.mark.parametrize("drafting", [True, False])
def test_connect_to_llama_cpp_shows_the_replys_own_draft_counts(drafting: bool) -> None:
    from llamacpp_standin import DRAFT_MAX, PIECES, STEP_TOKENS, LlamaCppStandIn

    standin = LlamaCppStandIn(drafting=drafting)
    with BackgroundServer(standin.app()) as url:
        engine = RemoteEngine(url, metrics_poll_s=0.02)
        try:
            info = engine.load(None, None).result(timeout=10)
            assert engine.kind == "llama.cpp" and "llama.cpp" in info.name and info.context_length == 16384
            assert not engine.features.live_controls and "--draft-max" in engine.features.controls_note
            events, done = turn(engine)
        finally:
            engine.close()
    assert "/metrics" not in standin.paths  # the reply says it all; llama-server has no /metrics by default
    tokens = [e for e in events if isinstance(e, TokenEvent)]
    assert "".join(t.text for t in tokens) == done.text == "".join(PIECES) and done.error is None
    s = done.stats
    assert s.tokens == len(PIECES) and s.decode_tokens == len(PIECES) - 1 and s.prompt_tokens == 12
    rounds = [e for e in events if isinstance(e, RoundEvent)]
    if not drafting:
        assert (s.rounds, s.drafted, s.accepted) == (0, 0, 0) and not rounds and not s.drafter_enabled
        return
    # llama.cpp counts no drafting steps: its decode steps are the tokens after the first less the accepted
    assert (s.drafted, s.accepted) == (DRAFT_MAX * len(STEP_TOKENS), sum(n - 1 for n in STEP_TOKENS))
    assert s.rounds == len(STEP_TOKENS) == len(rounds) and s.drafter_enabled
    assert sum(r.drafted for r in rounds) == s.drafted and sum(r.accepted for r in rounds) == s.accepted
    assert s.tokens_per_round == pytest.approx((len(PIECES) - 1) / len(STEP_TOKENS))
    assert events.index(rounds[-1]) < len(events) - 1  # the rounds come before TurnDone


@pytest.mark.parametrize("level", ["summary", "detailed"])
def test_connect_to_vllm_prefers_the_replys_own_counts_to_the_servers(level: str) -> None:
    from vllm_standin import VllmStandIn, recorded_steps

    steps = recorded_steps()[1:]
    standin = VllmStandIn(chunk_delay_s=0.01, per_request=level, other_users=3)
    with BackgroundServer(standin.app()) as url:
        engine = RemoteEngine(url + "/v1", metrics_poll_s=0.05)
        try:
            engine.load(None, None).result(timeout=10)
            first_events, first = turn(engine)
            time.sleep(0.25)  # a /metrics poll sent during the first turn may land just after it ends
            polls = standin.metrics_requests
            second_events, second = turn(engine)
        finally:
            engine.close()
    mine = (len(steps), len(steps), sum(n - 1 for n in steps))
    for done in (first, second):
        assert (done.stats.rounds, done.stats.drafted, done.stats.accepted) == mine  # not 4x: other users
        assert done.stats.decode_tokens == sum(steps)
    assert standin.metrics_requests == polls  # once the server reports per reply, /metrics is not polled
    rounds = [e for e in second_events if isinstance(e, RoundEvent)]
    assert len(rounds) == len(steps) and sum(r.accepted for r in rounds) == mine[2]
    if level == "detailed":  # every round as the server listed it
        assert [r.accepted for r in rounds] == [n - 1 for n in steps]


def test_reply_spec_reads_both_dialects_and_ignores_what_does_not_add_up() -> None:
    vllm = {
        "metrics": {
            "speculative_decoding": {"num_spec_steps": 4, "num_draft_tokens": 8, "num_accepted_draft_tokens": 5}
        }
    }
    assert reply_spec(vllm) == ReplySpec(8, 5, 4)
    assert [r.drafted for r in ReplySpec(8, 5, 4).round_events(20)] == [2, 2, 2, 2]
    llama = {"choices": [], "timings": {"predicted_n": 10, "draft_n": 6, "draft_n_accepted": 4}}
    assert reply_spec(llama) == ReplySpec(6, 4)
    assert len(ReplySpec(6, 4).round_events(10)) == 10 - 1 - 4
    assert reply_spec({"timings": {"predicted_n": 10}}) is None  # llama.cpp drafted nothing
    assert (
        reply_spec({"metrics": {"speculative_decoding": {"num_draft_tokens": 2, "num_accepted_draft_tokens": 3}}})
        is None
    )
    assert reply_spec({"timings": {"draft_n": "6", "draft_n_accepted": 4}}) is None
    assert reply_spec({"metrics": None}) is None and reply_spec({}) is None
