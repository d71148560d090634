"""Issue 23 §1: on a machine with no compiled kernels yet (an empty kernel cache), the first demo reply comes
at once instead of after ~90 s of C++ compiles, the screen says truthfully that kernels are being prepared,
and a second turn does not stall either. Then the terminal is killed while the kernels are still being
prepared (issue 24 §15): the app and its kernel-building child are gone within seconds, the history
holds both turns."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest
from test_tui_lost_terminal_tmux import cmdline, descendants, history, kill_terminal_and_wait
from tmux_session import _session, shows_ready
from tmux_session import term_env as term_env  # noqa: F401 (a fixture, used by name)

FINISHED = re.compile(r"(\d+) tokens · [\d.]+ tok/s · TTFT ([\d.]+) s")
TTFT_LIMIT_S = 5.0  # the target, from Enter to the first token
NOTE = re.compile(r"preparing kernels for this machine, first run only… \d+%")
IMAGES = Path(__file__).resolve().parents[2] / "assets" / "images"
# the first image prompt may cost its steady-state time (the second image's) and a little more, not a stall:
# generous for a loaded machine, far below the 5-11 s a first image used to stall on top of its own time
IMAGE_RATIO, IMAGE_MARGIN_S = 1.5, 1.5


def flat(screen: str) -> str:
    """The screen as one line: the panel wraps its status over lines, between borders."""
    return re.sub(r"[│\s]+", " ", screen)


def ask(t, question: str, n_before: int) -> float:
    """Send `question`; the finished reply's TTFT as the app reports it (seconds)."""
    t.keys(question, literal=True)
    t.keys("Enter")
    t.wait(lambda: len(FINISHED.findall(t.text())) > n_before, f"the reply to {question!r}", 120)
    return float(FINISHED.findall(t.text())[-1][1])


def test_first_reply_without_kernels_is_prompt_and_a_lost_terminal_ends_it(term_env, tmp_path):  # noqa: F811
    pytest.importorskip("core.engine")
    cold = tmp_path / "kernels"  # empty: this machine has built nothing yet
    t = _session(term_env, {"GEMMA_CHAT_KERNEL_DIR": str(cold)}, [], size=(120, 36), compiled=True)
    try:
        t.wait(lambda: "Enter: use it" in t.text(), "the welcome screen with the demo selected", 60)
        t.keys("Enter")
        t.wait(lambda: shows_ready(t.text()), "the demo to load", 90)
        t.wait(lambda: NOTE.search(flat(t.text())), "the note that kernels are being prepared", 15)
        first = ask(t, "Hello", 0)
        assert first < TTFT_LIMIT_S, f"first reply TTFT {first:.2f} s on a machine without kernels"
        second = ask(t, "What is gemma-chat?", 1)
        assert second < TTFT_LIMIT_S, f"second turn TTFT {second:.2f} s"
        building = bool(NOTE.search(flat(t.text())))
        procs, took = kill_terminal_and_wait(t)
    finally:
        t.kill()
    assert took < 5.0, f"{took:.1f} s to end after the terminal went away"
    saved = history(tmp_path / "data")
    assert [(r, s) for r, _, s in saved] == [("user", False), ("assistant", False)] * 2
    assert [c for r, c, _ in saved if r == "user"] == ["Hello", "What is gemma-chat?"]
    if not building:
        pytest.skip("the kernels were ready before the terminal was killed: the kill was not during preparation")
    assert any("core.engine.warmup" in c for c in procs.values()), f"no kernel-building child among {procs}"


REPLY = re.compile(r"(\d+) tokens · ([\d.]+) tok/s · TTFT ([\d.]+) s")
STALL_LIMIT_S = 1.0  # the target for a later first-of-a-kind prompt


def reply_seconds(t, question: str) -> tuple[float, float]:
    """Send `question`: (its TTFT, its whole time: TTFT + tokens / decode rate), as the app reports them. Its
    reply is the one whose figures end the screen's list of them (earlier replies may have scrolled away)."""
    before = REPLY.findall(t.text())
    t.keys(question, literal=True)
    t.keys("Enter")
    t.wait(lambda: REPLY.findall(t.text())[-1:] not in ([], before[-1:]), f"the reply to {question!r}", 120)
    tokens, rate, ttft = REPLY.findall(t.text())[-1]
    return float(ttft), float(ttft) + int(tokens) / max(float(rate), 1e-9)


def test_later_first_of_a_kind_prompts_on_a_cold_machine_do_not_stall(term_env, tmp_path):  # noqa: F811
    """Issue 23 §1: after the first reply, no first-of-a-kind prompt stalls more than a second on a machine
    without kernels: a second turn (a longer context), and the first reply after a block-size change (new
    verify shapes), which must cost about what the same reply costs once its kernels exist."""
    pytest.importorskip("core.engine")
    cold = tmp_path / "kernels"
    t = _session(term_env, {"GEMMA_CHAT_KERNEL_DIR": str(cold)}, [], size=(120, 36), compiled=True)
    try:
        t.wait(lambda: "Enter: use it" in t.text(), "the welcome screen with the demo selected", 60)
        t.keys("Enter")
        t.wait(lambda: shows_ready(t.text()), "the demo to load", 90)
        reply_seconds(t, "Hello")
        second, _ = reply_seconds(t, "What is gemma-chat?")
        assert second < STALL_LIMIT_S, f"second turn TTFT {second:.2f} s"
        for _ in range(3):
            t.keys("F6")  # block size + 1, from the prompt (the F-keys work wherever the focus is)
        # "Block size  11 (manual)" in the side panel, "block size 11 ·" in the compact one (auto shows "auto")
        t.wait(lambda: re.search(r"[Bb]lock size\s+\d+", t.text()), "a manual block size", 10)
        question = "What is speculative decoding?"
        times = []
        for _ in range(2):  # in a new chat each: the same prompt, the first time at this block size, then again
            t.keys("C-n")
            t.wait(lambda: not REPLY.search(t.text()), "a new chat", 10)
            times.append(reply_seconds(t, question))
        (ttft, first_time), (_, warm_time) = times
    finally:
        t.kill()
    assert ttft < STALL_LIMIT_S, f"TTFT {ttft:.2f} s after the block size changed"
    assert first_time - warm_time < STALL_LIMIT_S, (
        f"the first reply at a new block size took {first_time:.2f} s, the same reply after it {warm_time:.2f} s"
    )


def child_states(t) -> list[str]:
    """The process state (R, S, T: stopped, ...) of each kernel-building child the app started."""
    pane = int(t._run("display-message", "-p", "-t", "chat", "#{pane_pid}").stdout.strip())
    states = []
    for pid in descendants(pane):
        if "core.engine.warmup" in cmdline(pid):
            try:
                states.append(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0])
            except OSError:
                pass
    return states


def test_the_first_image_prompt_on_a_cold_machine_costs_what_the_second_does(term_env, tmp_path):  # noqa: F811
    """Issue 23 §1 (first image): with an empty kernel cache, while the kernels are prepared, the first image
    prompt takes about what a second image prompt takes (no first-of-a-kind stall), and the kernel-building
    child is stopped while the reply runs (the reply has the CPU)."""
    pytest.importorskip("core.engine")
    cold = tmp_path / "kernels"
    t = _session(term_env, {"GEMMA_CHAT_KERNEL_DIR": str(cold)}, ["--demo"], size=(120, 36), compiled=True)
    try:
        t.wait(lambda: shows_ready(t.text()), "the demo to load", 90)
        t.wait(lambda: NOTE.search(flat(t.text())), "the note that kernels are being prepared", 15)
        states: list[str] = []
        t.keys(f"/image {IMAGES / 'chart.png'} What is this?", literal=True)
        t.keys("Enter")
        # sampled while the first image's reply runs (prefill: seconds on this machine)
        deadline = time.monotonic() + 120
        while not FINISHED.findall(t.text()) and time.monotonic() < deadline:
            states += child_states(t)
            time.sleep(0.2)
        first = float(FINISHED.findall(t.text())[-1][1])
        preparing = bool(NOTE.search(flat(t.text())))
        shown = FINISHED.findall(t.text())  # the first reply's line may scroll away under the second image
        t.keys(f"/image {IMAGES / 'landscape.jpg'} What is this?", literal=True)
        t.keys("Enter")
        t.wait(lambda: FINISHED.findall(t.text())[-1:] not in ([], shown[-1:]), "the second image's reply", 120)
        second = float(FINISHED.findall(t.text())[-1][1])
        t.keys("C-q")
        t.wait(lambda: not t.alive(), "Ctrl+Q", 15)
    finally:
        t.kill()
    assert first <= IMAGE_RATIO * second + IMAGE_MARGIN_S, f"first image TTFT {first:.2f} s, second {second:.2f} s"
    if preparing and states:
        assert "T" in states, f"the kernel-building child was never stopped during the reply: {states}"


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("GEMMA_CHAT_SLOW"), reason="opt-in: GEMMA_CHAT_SLOW=1 (a whole preparation)")
def test_a_second_start_finds_the_kernels(term_env, tmp_path):  # noqa: F811
    """Once prepared, a start on the same machine runs compiled from the first reply, with no note."""
    kernels = tmp_path / "kernels"
    t = _session(term_env, {"GEMMA_CHAT_KERNEL_DIR": str(kernels)}, ["--demo"], size=(120, 36), compiled=True)
    try:
        t.wait(lambda: shows_ready(t.text()), "the demo to load", 90)
        t.wait(lambda: "preparing kernels" not in t.text(), "the kernels to be prepared", 600)
        t.keys("C-q")
        t.wait(lambda: not t.alive(), "Ctrl+Q", 15)
    finally:
        t.kill()
    assert list(kernels.rglob("prepared/*.json")), "no marker after the preparation"
    t = _session(term_env, {"GEMMA_CHAT_KERNEL_DIR": str(kernels)}, ["--demo"], size=(120, 36), compiled=True)
    try:
        t.wait(lambda: shows_ready(t.text()), "the demo to load", 90)
        time.sleep(1.0)
        assert "preparing kernels" not in t.text()
        assert ask(t, "Hello", 0) < TTFT_LIMIT_S
        t.keys("C-q")
        t.wait(lambda: not t.alive(), "Ctrl+Q", 15)
    finally:
        t.kill()
