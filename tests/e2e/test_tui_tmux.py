"""The installed `gemma-chat` in a real terminal (tmux): type, a coloured reply streams, Esc stops,
Ctrl+Q quits.

Two runs: the scripted fake engine (scripts/fake_ui.py: both token colours, underlined
drafts, deterministic) and `--demo` on the real engine (the tiny trained demo pair). tmux must be
installed (.ci/run installs it): skipped without it, failed without it when GEMMA_CHAT_REQUIRE_TMUX=1 (CI).
"""

from __future__ import annotations

import re
import time

import pytest
from tmux_session import _colour, _session, _sgr_params
from tmux_session import term_env as term_env  # noqa: F401 (a fixture, used by name)

FINISHED = " tok/s · TTFT"  # in the summary line under a reply once it has ended (stopped or not)
TARGET_SGR = "\x1b[38;2;230;159;0"


def _target_token_in_reply(capture: str) -> bool:
    """A target-coloured token in the conversation (the legend line uses the same colour)."""
    return any(TARGET_SGR in line and "target's own" not in line for line in capture.splitlines())


def test_fake_engine_in_tmux_streams_colours_stops_quits(term_env):
    t = _session(term_env, {}, ["--delay", "0.25"], fake=True)
    try:
        t.wait(lambda: "ready" in t.text(), "the fake engine to load", 20)
        t.keys("what is speculative decoding?", literal=True)
        t.keys("Enter")
        t.wait(lambda: "Speculative" in t.text() and "streaming" in t.text(), "the reply to stream", 10)
        draft, target = _colour(0x56, 0xB4, 0xE9), _colour(0xE6, 0x9F, 0x00)
        # The first round may be on screen before any draft: wait until both origins have streamed.
        t.wait(
            lambda: draft(_sgr_params(t.escapes(), "Speculative")) and target(_sgr_params(t.escapes(), "Speculative")),
            "draft- and target-coloured tokens on the reply's first line",
            10,
        )
        params = _sgr_params(t.escapes(), "Speculative")
        assert any("4" in p for p in params), "draft tokens are not underlined"
        t.keys("Escape")
        t.wait(lambda: "stopped" in t.text(), "Esc to stop the reply", 5)
        assert "Every accepted draft" not in t.text()  # the end of the scripted reply never came
        t.keys("C-q")
        t.wait(lambda: not t.alive(), "Ctrl+Q to quit", 5)
    finally:
        t.kill()


def test_demo_pairing_in_tmux_real_engine(term_env):
    pytest.importorskip("core.engine")
    t = _session(term_env, {}, ["--demo"])
    try:
        t.wait(lambda: "ready" in t.text(), "the demo pairing to build and load", 60)
        assert "DEMO — tiny model" in t.text()
        # The trained demo's longest answer (~60 tokens) streams in a quarter of a second with the drafter
        # (~250 tok/s), faster than Esc can land after its first token is seen: the drafter goes off (F8,
        # about half the rate) to give Esc a chance, and on a run where the reply still finished first
        # the question is asked again in a new chat.
        t.keys("F8")
        t.wait(lambda: re.search(r"[Dd]rafter +off", t.text()) is not None, "F8 to turn the drafter off", 10)
        stopped = False
        for _ in range(8):
            t.keys("What are the keys?", literal=True)
            t.keys("Enter")
            t.wait(lambda: "streaming" in t.text() or FINISHED in t.text(), "the reply to stream", 15)
            t.wait(lambda: _target_token_in_reply(t.escapes()), "a target-coloured token in the reply", 15)
            t.keys("Escape")
            t.wait(lambda: "stopped" in t.text() or FINISHED in t.text(), "Esc to stop the reply", 10)
            time.sleep(0.3)  # the header's "stopped" and the summary may land in separate frames
            if "stopped" in t.text():
                stopped = True
                break
            t.keys("C-n")
            t.wait(lambda: FINISHED not in t.text(), "a new chat", 10)
        assert stopped, "Esc never stopped a streaming reply in 8 tries"
        # quitting in the middle of a reply: cancel + close, promptly
        t.keys("What are the keys?", literal=True)
        t.keys("Enter")
        # (or already done: the demo is quick, and Ctrl+Q must then just quit)
        t.wait(lambda: "streaming" in t.text() or t.text().count(FINISHED) >= 2, "the second reply to stream", 15)
        start = time.monotonic()
        t.keys("C-q")
        t.wait(lambda: not t.alive(), "Ctrl+Q to quit mid-reply", 5)
        assert time.monotonic() - start < 3.0
    finally:
        t.kill()
