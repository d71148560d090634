"""MCP servers in config.toml: which tool servers the chat offers the model (issue 26 §3).

    [mcp.servers.time]                 # a stdio server: a command the app starts as its child
    command = "mcp-server-time"
    args = ["--local-timezone", "Europe/Paris"]
    env = { TZ = "Europe/Paris" }      # added to the server's environment
    trusted = false                    # true: its tools run without asking first
    enabled = true                     # false: listed, not started
    timeout = 30                       # seconds a call may take

    [mcp.servers.docs]                 # a streamable HTTP server
    url = "http://127.0.0.1:8931/mcp"
    headers = { Authorization = "Bearer ..." }

With no `[mcp.servers.time]` the time server (the `mcp-server-time` package: `get_current_time`,
`convert_time`) is there by default, the demo's tool server; `[mcp.servers.time] enabled = false` turns
it off. Every problem is one line naming the key, like the rest of the config's checks.
"""

from __future__ import annotations

import math
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_TIMEOUT_S = 30.0
TIME_SERVER = "time"
TIME_COMMAND = "mcp-server-time"
SERVER_KEYS = ("command", "args", "env", "url", "headers", "trusted", "enabled", "timeout")


@dataclass(frozen=True)
class McpServerConfig:
    name: str
    command: str | None = None  # stdio
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    url: str | None = None  # streamable HTTP
    headers: dict[str, str] = field(default_factory=dict)
    trusted: bool = False
    enabled: bool = True
    timeout_s: float = DEFAULT_TIMEOUT_S

    @property
    def transport(self) -> str:
        return "stdio" if self.command is not None else "http"

    @property
    def where(self) -> str:
        """What it is, in a line: the command (with its arguments) or the URL."""
        return " ".join((self.command or "", *self.args)) if self.command is not None else str(self.url)


def find_command(command: str) -> str:
    """`command` as the app will start it: a program next to this Python (a virtual environment's
    bin/, where `pip install mcp-server-time` puts it) before the PATH."""
    if "/" in command:
        return command
    beside = Path(sys.executable).parent / command
    if beside.is_file():
        return str(beside)
    return shutil.which(command) or command


def default_servers() -> dict[str, McpServerConfig]:
    return {TIME_SERVER: McpServerConfig(TIME_SERVER, command=TIME_COMMAND)}


def _strings(value: Any, what: str, problems: list[str]) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        problems.append(f"{what} must be a list of strings")
        return ()
    return tuple(value)


def _table(value: Any, what: str, problems: list[str]) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        problems.append(f'{what} must be a table of strings, e.g. {{ KEY = "value" }}')
        return {}
    return {str(k): v for k, v in value.items()}


def _server(name: str, raw: Any, problems: list[str]) -> McpServerConfig | None:
    where = f"[mcp.servers.{name}]"
    if not isinstance(raw, dict):
        problems.append(f"{where} must be a table")
        return None
    start = len(problems)
    for key in raw:
        if key not in SERVER_KEYS:
            problems.append(f"unknown key {where}.{key} (known: {', '.join(SERVER_KEYS)})")
    command, url = raw.get("command"), raw.get("url")
    if (command is None) == (url is None):
        defaults = default_servers().get(name)
        if command is None and defaults is not None:  # settings for the default server without restating it
            command = defaults.command
        else:
            problems.append(f"{where} needs either command (a stdio server) or url (a streamable HTTP server)")
    if command is not None and (not isinstance(command, str) or not command.strip()):
        problems.append(f"{where}.command must be a non-empty string")
    if url is not None and (not isinstance(url, str) or not url.startswith(("http://", "https://"))):
        problems.append(f"{where}.url must be an http:// or https:// URL")
    flags = {}
    for key, default in (("trusted", False), ("enabled", True)):
        flags[key] = raw.get(key, default)
        if not isinstance(flags[key], bool):
            problems.append(f"{where}.{key} must be true or false")
    timeout = raw.get("timeout", DEFAULT_TIMEOUT_S)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not math.isfinite(timeout) or timeout <= 0:
        problems.append(f"{where}.timeout must be a number of seconds > 0")
    args = _strings(raw.get("args", []), f"{where}.args", problems)
    env = _table(raw.get("env", {}), f"{where}.env", problems)
    headers = _table(raw.get("headers", {}), f"{where}.headers", problems)
    if len(problems) > start:
        return None
    return McpServerConfig(name, command, args, env, url, headers, flags["trusted"], flags["enabled"], float(timeout))


def parse_mcp(raw: Any, problems: list[str]) -> dict[str, McpServerConfig]:
    """The `[mcp]` table -> the servers by name (the default time server included unless restated)."""
    servers = default_servers()
    if raw is None:
        return servers
    if not isinstance(raw, dict):
        problems.append("[mcp] must be a table")
        return servers
    for key in raw:
        if key != "servers":
            problems.append(f"unknown key [mcp].{key} (servers go in [mcp.servers.NAME])")
    table = raw.get("servers", {})
    if not isinstance(table, dict):
        problems.append("[mcp.servers] must be a table of [mcp.servers.NAME] tables")
        return servers
    for name, value in table.items():
        server = _server(str(name), value, problems)
        if server is not None:
            servers[str(name)] = server
    return servers
