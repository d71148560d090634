"""`gemma-chat generate --mcp` as a process, on the offline demo with the default MCP server (mcp-server-time).

With --yes the call runs: its {"tool_result"} line carries the server's real answer, the demo goes on
with it, and {"messages"} holds the call, the result and the answer (what --messages needs to go on).
Without --yes and without a terminal nothing runs: the call is printed and generate says how to run it.
--tool-choice get_current_time forces the first reply's call (the demo is being taught the time tool;
left to itself it may answer in prose), never the reply after the result.
"""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from serve_process import GEMMA_CHAT

from core.user.mcp_config import find_command

pytestmark = pytest.mark.skipif(
    not shutil.which(find_command("mcp-server-time")), reason="mcp-server-time is not installed (the test extra)"
)
ASK = "What time is it in Tokyo?"


def generate(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(GEMMA_CHAT), "generate", "--demo", "--prompt", ASK, "--max-tokens", "48", *args],
        capture_output=True,
        text=True,
        timeout=300,
        input=stdin,
    )


def lines_of(run: subprocess.CompletedProcess) -> list[dict]:
    assert run.returncode == 0, run.stderr + run.stdout
    return [json.loads(line) for line in run.stdout.splitlines() if line.strip()]


def test_mcp_with_yes_runs_the_call_and_the_demo_answers_with_the_result():
    lines = lines_of(generate("--mcp", "--yes", "--tool-choice", "get_current_time", "--json"))
    [call] = [x["tool_call"] for x in lines if "tool_call" in x]
    [result] = [x["tool_result"] for x in lines if "tool_result" in x]
    assert call["name"] == "get_current_time" and isinstance(call["arguments"].get("timezone"), str)
    assert result["id"] == call["id"] and not result["is_error"]
    answer = json.loads(result["content"])  # the real server's answer, for the zone the model asked
    assert answer["timezone"] == call["arguments"]["timezone"] and "T" in answer["datetime"]
    after = lines.index(next(x for x in lines if "tool_result" in x))
    assert any("id" in x for x in lines[after:])  # the model went on after the result
    [messages] = [x["messages"] for x in lines if "messages" in x]
    roles = [m["role"] for m in messages]
    assert roles[-3:] == ["assistant", "tool", "assistant"] and messages[-2]["tool_call_id"] == call["id"]
    assert messages[-3]["tool_calls"][0]["id"] == call["id"] and messages[-2]["content"] == result["content"]
    assert lines[-1]["stats"]["stop_reason"] != "tool_calls"  # the last reply answered; it called nothing more


def test_without_yes_and_without_a_terminal_the_call_is_printed_not_run():
    run = generate("--mcp", "--tool-choice", "get_current_time", "--json", stdin="y\n")
    lines = lines_of(run)
    assert [x["tool_call"]["name"] for x in lines if "tool_call" in x] == ["get_current_time"]
    assert not any("tool_result" in x for x in lines)
    assert "not run: get_current_time (pass --yes" in run.stderr
    assert lines[-1]["stats"]["stop_reason"] == "tool_calls"
    # the printed messages continue the conversation by hand, as with --tools
    [messages] = [x["messages"] for x in lines if "messages" in x]
    assert messages[-1]["tool_calls"][0]["function"]["name"] == "get_current_time"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--yes"], "--yes runs MCP tools: it needs --mcp"),
        (["--mcp", "--tool-choice", "get_weather"], "--tool-choice get_weather: no such tool"),
        (["--tool-choice", "required"], "--tool-choice needs tools"),
    ],
)
def test_bad_tool_flags_are_one_clear_line(args, says):
    run = generate(*args)
    assert run.returncode == 1 and says in run.stderr, run.stderr
