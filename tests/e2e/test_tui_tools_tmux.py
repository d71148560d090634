"""The chat calls a tool of mcp-server-time in tmux at 80x24 (issue 26 §3): scripts/fake_ui.py --mcp
starts the config's default MCP server (the time server) and scripts a reply that calls
get_current_time; the approval prompt, the call's result and the reply that quotes it show, and
quitting ends the server's process. Then the same with the real demo pairing (issue 26 §5): its call
shows while it is written, in the drafter's and the target's colours, and runs on the real server."""

from __future__ import annotations

import re
import shutil
import subprocess
import time

import pytest
from tmux_session import _colour, _session, _sgr_params, shows_ready
from tmux_session import term_env as term_env  # noqa: F401 (a fixture, used by name)

from app.tui.screens.tools import ToolApprovalScreen
from core.user.mcp_config import find_command

pytestmark = pytest.mark.skipif(
    not shutil.which(find_command("mcp-server-time")), reason="mcp-server-time (the test extra) is not installed"
)


def _time_servers() -> list[str]:
    run = subprocess.run(["pgrep", "-f", "mcp-server-time"], capture_output=True, text=True)
    return run.stdout.split()


def _wait_for_time_server(t) -> None:
    """Open the tools screen (F12), wait until the time server is up, close it again."""
    t.keys("F12")
    t.wait(lambda: re.search(r"time\s+ready\s+get_current_time", t.text()), "the time server to be ready", 90)
    t.keys("Escape")
    t.wait(lambda: "Tool servers (MCP)" not in t.text(), "the tools screen to close", 10)


def test_a_scripted_reply_calls_the_time_server_after_approval(term_env):
    before = set(_time_servers())
    t = _session(term_env, {}, ["--mcp", "--delay", "0.02"], fake=True)
    try:
        t.wait(lambda: "ready" in t.text(), "the fake engine to load", 30)
        _wait_for_time_server(t)
        t.keys("What time is it in Paris?", literal=True)
        t.keys("Enter")
        t.wait(lambda: "Run get_current_time from MCP server 'time'?" in t.text(), "the approval prompt", 20)
        assert '"timezone": "Europe/Paris"' in t.text()  # the arguments, in full, before it runs
        time.sleep(ToolApprovalScreen.ARM_SECONDS + 0.3)  # its keys answer after a moment
        t.keys("y")
        t.wait(lambda: "The time server says:" in t.text() and "is_dst" in t.text(), "the reply after the result", 30)
        t.wait(lambda: shows_ready(t.text()), "the reply to finish", 10)
        # the conversation's column (the side panel starts at the first '│' of a line)
        screen = "\n".join(line.split("│")[0].rstrip() for line in t.text().splitlines())
        assert re.search(r"done\n.*▶ result: \d+ characters", screen), screen  # the call ran, its result collapsed
        assert re.search(r'"datetime":\s*\n?.*20\d\d-\d\d-\d\dT\d\d:\d\d', screen), screen  # the result, quoted
        assert "+01:00" in screen or "+02:00" in screen  # Paris's offset: the server really answered
        t.keys("C-q")
        t.wait(lambda: not t.alive(), "Ctrl+Q to quit", 10)
        t.wait(lambda: set(_time_servers()) <= before, "the time server to end with the app", 10)
    finally:
        t.kill()


DRAFT = _colour(0x56, 0xB4, 0xE9)
TARGET = _colour(0xE6, 0x9F, 0x00)


def test_the_demo_writes_a_time_call_in_colour_and_the_time_server_answers_it(term_env):
    """The offline demo, asked the time with the default time server running: its reply shows the call as
    it writes it (`call:get_current_time{timezone:"..."}`, drafted tokens in the drafter's colour, the
    target's own in its colour), the approval prompt names the call, a denied call gets "You did not allow
    the time tool…" (not a made-up time), the real server answers it (its result shows, collapsed) and the
    demo goes on with the time it was given, in the zone of the city asked about (issue 26 §5)."""
    from datetime import datetime, timedelta
    from zoneinfo import ZoneInfo

    t = _session(term_env, {}, ["--demo"], size=(100, 36))
    try:
        t.wait(lambda: shows_ready(t.text()), "the demo to load", 90)
        _wait_for_time_server(t)
        t.keys("What time is it in Tokyo?", literal=True)
        t.keys("Enter")
        t.wait(lambda: "Run get_current_time from MCP server 'time'?" in t.text(), "the approval prompt", 60)
        [zone] = set(re.findall(r'"timezone": "([^"]+)"', t.text()))  # in the prompt and in the call box
        assert zone == "Asia/Tokyo"
        time.sleep(ToolApprovalScreen.ARM_SECONDS + 0.3)  # its keys answer after a moment
        t.keys("n")  # the dialog covers the reply: deny first, then look at the call as written
        t.wait(lambda: "denied: the model is told so" in t.text(), "the call to be denied", 10)
        t.wait(lambda: shows_ready(t.text()), "the demo's answer after the denied call", 60)
        assert "You did not allow the time tool" in " ".join(t.text().split())  # not a made-up time (wave 7)
        written = f'call:get_current_time{{timezone:"{zone}"}}'
        screen = t.escapes()  # settled: the answer has finished streaming
        params = _sgr_params(screen, written)
        assert any(DRAFT(p) for p in params) and any(TARGET(p) for p in params), screen
        t.keys("What time is it in Tokyo?", literal=True)
        t.keys("Enter")
        t.wait(lambda: t.text().count("Run get_current_time from MCP server 'time'?") == 1, "the prompt again", 60)
        time.sleep(ToolApprovalScreen.ARM_SECONDS + 0.3)  # its keys answer after a moment
        t.keys("y")
        t.wait(lambda: re.search(r"▶ result: \d+ characters", t.text()), "the server's result", 30)
        t.wait(lambda: shows_ready(t.text()), "the demo's answer after the result", 60)
        [hhmm] = re.findall(r"It is (\d\d:\d\d) in Asia/Tokyo\.", t.text())  # the server's time, copied
        now = datetime.now(ZoneInfo(zone))
        assert hhmm in {(now - timedelta(minutes=m)).strftime("%H:%M") for m in (0, 1)}, (hhmm, now)
        t.keys("C-q")
        t.wait(lambda: not t.alive(), "Ctrl+Q to quit", 10)
    finally:
        t.kill()
