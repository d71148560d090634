"""core.user.mcp_client.McpHub against real stdio MCP servers: tests/support/mcp_test_server.py (the
official SDK's server, with modes that misbehave) and mcp-server-time when installed. One hub for the
module: each server process takes seconds to start on a loaded machine."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import pytest
from support.mcp_test_server import TOOL_NAMES

from core.user.mcp_client import McpError, McpHub
from core.user.mcp_config import McpServerConfig, find_command

SERVER = str(Path(__file__).parents[1] / "support" / "mcp_test_server.py")
START_S = 60.0


def server(name: str, mode: str = "ok", **kwargs) -> McpServerConfig:
    return McpServerConfig(name, command=sys.executable, args=(SERVER, mode), **kwargs)


def settle(hub: McpHub, names: list[str]) -> None:
    deadline = time.monotonic() + START_S + 10
    while time.monotonic() < deadline:
        if all(hub.state(n).status not in ("off", "starting") for n in names):
            return
        time.sleep(0.1)
    raise AssertionError([hub.state(n) for n in names])


@pytest.fixture(scope="module")
def hub():
    configs = [
        server("ok", timeout_s=3.0, env={"GEMMA_CHAT_TEST_SETTING": "from config.toml"}),
        server("crashy"),
        server("exit", "exit"),
        McpServerConfig("missing", command="no-such-mcp-server-here"),
    ]
    if shutil.which(find_command("mcp-server-time")):
        configs.append(McpServerConfig("time", command="mcp-server-time"))
    h = McpHub(configs, start_timeout_s=25.0)  # a loaded machine starts a server in seconds
    h.start()
    settle(h, [c.name for c in configs])
    yield h
    h.close()


def test_a_server_lists_its_tools_in_the_openai_shape(hub):
    state = hub.state("ok")
    assert state.status == "ready" and [t.name for t in state.tools] == list(TOOL_NAMES)
    add = hub.find("add")
    assert add is not None and add.server == "ok"
    spec = add.openai()["function"]
    assert spec["name"] == "add" and spec["parameters"]["required"] == ["a", "b"]


def test_a_call_returns_its_result_as_text_for_the_model(hub):
    add, echo = hub.find("add"), hub.find("echo")
    assert json.loads(hub.call(add, {"a": 2, "b": 40}).result(30).text) == {"sum": 42}
    assert "echo: héllo {x}" in hub.call(echo, {"text": "héllo {x}"}).result(30).text


def test_a_stdio_server_gets_the_env_its_config_gives_it(hub):
    getenv = hub.find("getenv")
    assert json.loads(hub.call(getenv, {"name": "GEMMA_CHAT_TEST_SETTING"}).result(30).text) == {
        "result": "from config.toml"
    }
    assert (
        json.loads(hub.call(getenv, {"name": "PATH"}).result(30).text)["result"] != "(unset)"
    )  # added to, not replaced


def test_garbage_on_a_servers_stream_mid_call_costs_nothing(hub):
    """A server that writes non-protocol lines on stdout while it answers (a chatty library, a stray
    print): the lines are skipped, the call gets its result and the server stays ready for the next."""
    babble = hub.find("babble")
    assert json.loads(hub.call(babble, {}).result(30).text) == {"result": "after the noise"}
    assert hub.state("ok").status == "ready"
    assert "echo: again" in hub.call(hub.find("echo"), {"text": "again"}).result(30).text


def test_a_bad_argument_is_the_tools_error_not_the_servers(hub):
    result = hub.call(hub.find("add"), {"a": "two"}).result(30)
    assert result.is_error and result.text
    assert hub.state("ok").status == "ready"  # the server goes on


def test_a_call_past_the_timeout_is_one_line(hub):
    with pytest.raises(McpError, match=r"ok: slow did not answer within 3 s"):
        hub.call(hub.find("slow"), {"seconds": 30}).result(30)
    assert hub.state("ok").status == "ready"


def test_a_server_that_dies_mid_call_is_one_line_and_marked_failed(hub):
    crash = next(t for t in hub.state("crashy").tools if t.name == "crash")
    with pytest.raises(McpError, match="crashy: crash failed"):
        hub.call(crash, {}).result(30)
    assert hub.state("crashy").status == "failed" and "crash failed" in hub.state("crashy").error


def test_servers_that_cannot_start_say_why_in_one_line(hub):
    assert hub.state("missing").error == "cannot start 'no-such-mcp-server-here': no such program"
    exit_error = hub.state("exit").error
    assert hub.state("exit").status == "failed" and "fatal: no database configured" in exit_error  # its stderr
    assert all("\n" not in s.error for s in hub.states())


def test_a_server_that_speaks_garbage_fails_at_the_start_timeout_in_one_line():
    # its own hub: the module's would wait the whole (long) start timeout for it
    h = McpHub([server("garbage", "garbage")], start_timeout_s=4.0)
    h.start()
    try:
        settle(h, ["garbage"])
        state = h.state("garbage")
        assert state.status == "failed" and "did not answer within 4 s" in state.error and "\n" not in state.error
    finally:
        h.close()


def test_disable_stops_a_server_and_enable_starts_it_again(hub):
    hub.set_enabled("ok", False)
    deadline = time.monotonic() + 20
    while hub.state("ok").status != "off" and time.monotonic() < deadline:
        time.sleep(0.05)
    # none of its tools is offered (crashy has tools of the same names while it runs: alone, this test
    # runs before the test that crashes it)
    offered = [hub.find(name) for name in TOOL_NAMES]
    assert hub.state("ok").status == "off" and all(t is None or t.server != "ok" for t in offered)
    hub.set_enabled("ok", True)
    settle(hub, ["ok"])
    assert hub.state("ok").status == "ready" and [t.name for t in hub.state("ok").tools] == list(TOOL_NAMES)
    assert hub.find("echo") is not None


@pytest.mark.skipif(not shutil.which(find_command("mcp-server-time")), reason="mcp-server-time is not installed")
def test_mcp_server_time_answers_get_current_time(hub):
    assert [t.name for t in hub.state("time").tools] == ["get_current_time", "convert_time"]
    result = json.loads(hub.call(hub.find("get_current_time"), {"timezone": "Asia/Tokyo"}).result(30).text)
    assert result["timezone"] == "Asia/Tokyo" and result["datetime"].endswith("+09:00")


@pytest.fixture(scope="module")
def http_server():
    """tests/support/mcp_test_server.py over streamable HTTP on a free loopback port (its own process)."""
    import socket
    import subprocess

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, SERVER, "http", str(port), "s3cret"], stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + START_S
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        proc.wait(10)


def test_a_streamable_http_server_with_headers_lists_and_runs_its_tools(http_server):
    """A `url` + `headers` server of config.toml, through the SDK's streamable HTTP client: its tools, a
    call and its result; the same server without the right header fails with one line that says why."""
    configs = [
        McpServerConfig("web", url=http_server, headers={"Authorization": "Bearer s3cret"}),
        McpServerConfig("nokey", url=http_server, headers={"Authorization": "Bearer wrong"}),
    ]
    h = McpHub(configs, start_timeout_s=20.0)
    h.start()
    try:
        settle(h, ["web", "nokey"])
        web = h.state("web")
        assert web.status == "ready", web.error
        assert web.where == http_server and [t.name for t in web.tools] == list(TOOL_NAMES)
        assert json.loads(h.call(h.find("add"), {"a": 20, "b": 22}).result(30).text) == {"sum": 42}
        failed = h.state("nokey")
        assert failed.status == "failed" and "401" in failed.error and "\n" not in failed.error, failed.error
    finally:
        h.close()


def test_close_ends_the_server_processes(tmp_path):
    pid_file = tmp_path / "pid"
    script = tmp_path / "srv.py"
    script.write_text(
        f"import os, runpy, sys\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
        f"sys.argv = [{SERVER!r}]\nrunpy.run_path({SERVER!r}, run_name='__main__')\n"
    )
    h = McpHub([McpServerConfig("p", command=sys.executable, args=(str(script),))], start_timeout_s=START_S)
    h.start()
    settle(h, ["p"])
    pid = int(pid_file.read_text())
    os.kill(pid, 0)  # alive
    h.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        if Path(f"/proc/{pid}/stat").exists() and Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z":
            return  # exited, not yet reaped
        time.sleep(0.1)
    raise AssertionError(f"the server process {pid} outlived close()")
