"""[mcp.servers.NAME] in config.toml (core.user.mcp_config): stdio and HTTP servers, the default time
server, and one line per problem."""

from __future__ import annotations

import tomllib

import pytest

from core.user.config import DEFAULT_CONFIG_TEXT, ConfigError, validate
from core.user.mcp_config import McpServerConfig, find_command


def test_the_time_server_is_there_by_default_and_the_template_is_valid():
    for config in (validate({}), validate(tomllib.loads(DEFAULT_CONFIG_TEXT))):
        assert config.mcp_servers == {"time": McpServerConfig("time", command="mcp-server-time")}


def test_the_default_time_server_is_installed_with_the_app_not_only_the_tests():
    """`python3 dev.py run` installs gemma-chat without extras: the server config.toml names by default
    must come with it, or a new user's first chat says "no such program" (issue 26 §5)."""
    import importlib.metadata
    import re
    from pathlib import Path

    requires = importlib.metadata.requires("gemma-chat") or []
    plain = [r for r in requires if "extra ==" not in r]
    assert any(re.match(r"mcp-server-time\b", r) for r in plain), requires
    found = Path(find_command("mcp-server-time"))
    assert found.is_file(), f"config.toml's default server {found} is not installed beside this Python"


def test_stdio_and_http_servers_with_their_settings():
    config = validate(
        {
            "mcp": {
                "servers": {
                    "files": {"command": "npx", "args": ["-y", "fs"], "env": {"A": "1"}, "trusted": True, "timeout": 5},
                    "web": {"url": "https://example.test/mcp", "headers": {"Authorization": "Bearer k"}},
                    "time": {"enabled": False},  # the default server, turned off without restating its command
                }
            }
        }
    )
    files, web, time = (config.mcp_servers[n] for n in ("files", "web", "time"))
    assert (files.transport, files.args, files.env, files.trusted, files.timeout_s) == (
        "stdio",
        ("-y", "fs"),
        {"A": "1"},
        True,
        5.0,
    )
    assert (web.transport, web.url, web.headers, web.trusted) == (
        "http",
        "https://example.test/mcp",
        {"Authorization": "Bearer k"},
        False,
    )
    assert (time.command, time.enabled) == ("mcp-server-time", False)
    assert files.where == "npx -y fs" and web.where == "https://example.test/mcp"


@pytest.mark.parametrize(
    ("mcp", "says"),
    [
        ({"servers": {"x": {}}}, "[mcp.servers.x] needs either command"),
        ({"servers": {"x": {"command": "a", "url": "http://b"}}}, "needs either command"),
        ({"servers": {"x": {"command": "a", "args": "b"}}}, "[mcp.servers.x].args must be a list of strings"),
        ({"servers": {"x": {"command": "a", "env": {"A": 1}}}}, "[mcp.servers.x].env must be a table of strings"),
        ({"servers": {"x": {"url": "ftp://b"}}}, "url must be an http:// or https:// URL"),
        ({"servers": {"x": {"command": "a", "trusted": "yes"}}}, "[mcp.servers.x].trusted must be true or false"),
        ({"servers": {"x": {"command": "a", "timeout": 0}}}, "timeout must be a number of seconds > 0"),
        ({"servers": {"x": {"command": "a", "comand": "b"}}}, "unknown key [mcp.servers.x].comand"),
        ({"servers": {"x": "npx"}}, "[mcp.servers.x] must be a table"),
        ({"server": {}}, "unknown key [mcp].server"),
        ("x", "[mcp] must be a table"),
    ],
)
def test_each_problem_is_one_line_naming_the_key(mcp, says):
    with pytest.raises(ConfigError) as e:
        validate({"mcp": mcp})
    assert says in str(e.value)


def test_a_command_beside_this_python_comes_first(tmp_path, monkeypatch):
    import sys

    assert find_command("/bin/sh") == "/bin/sh"
    fake = tmp_path / "python"
    (tmp_path / "my-mcp").write_text("")
    monkeypatch.setattr(sys, "executable", str(fake))
    assert find_command("my-mcp") == str(tmp_path / "my-mcp")
