"""The chat calls a tool of mcp-server-time in tmux at 80x24 (issue 26 §3): scripts/fake_ui.py --mcp
starts the config's default MCP server (the time server) and scripts a reply that calls
get_current_time; the approval prompt, the call's result and the reply that quotes it show, and
quitting ends the server's process."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from tmux_session import _session, shows_ready
from tmux_session import term_env as term_env  # noqa: F401 (a fixture, used by name)

from core.user.mcp_config import find_command

pytestmark = pytest.mark.skipif(
    not shutil.which(find_command("mcp-server-time")), reason="mcp-server-time (the test extra) is not installed"
)


def _time_servers() -> list[str]:
    run = subprocess.run(["pgrep", "-f", "mcp-server-time"], capture_output=True, text=True)
    return run.stdout.split()


def test_a_scripted_reply_calls_the_time_server_after_approval(term_env):
    before = set(_time_servers())
    t = _session(term_env, {}, ["--mcp", "--delay", "0.02"], fake=True)
    try:
        t.wait(lambda: "ready" in t.text(), "the fake engine to load", 30)
        t.keys("F12")  # the tools screen: wait for the time server to be up
        t.wait(lambda: re.search(r"time\s+ready\s+get_current_time", t.text()), "the time server to be ready", 90)
        t.keys("Escape")
        t.wait(lambda: "Tool servers (MCP)" not in t.text(), "the tools screen to close", 10)
        t.keys("What time is it in Paris?", literal=True)
        t.keys("Enter")
        t.wait(lambda: "Run get_current_time from MCP server 'time'?" in t.text(), "the approval prompt", 20)
        assert '"timezone": "Europe/Paris"' in t.text()  # the arguments, in full, before it runs
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
