"""`gemma-chat generate --mcp`: the MCP servers of config.toml as the turn's tools, their calls run.

The hub (core.user.mcp_client) starts the enabled servers and waits until each is ready or failed (a
failed one is a note on stderr; the turn goes on without its tools). A call to an MCP tool runs when
the user allowed it: `--yes` allows every call, a server with `trusted = true` needs no answer, and
otherwise, on a terminal, generate asks on stderr for each call (y: run it; anything else: the model is
told the user denied it). Without a terminal and without --yes nothing runs: the calls are printed and
generate ends, as with --tools alone. A call's result prints as one JSON line,
`{"tool_result": {"id", "name", "content", "is_error"}}`, and the model goes on with it, for up to
MAX_ROUNDS rounds of calls. A call to a --tools FILE tool is never run (generate has no code for it):
it is printed and the turn ends there.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TextIO

from app.commands.common import UsageError, printable

if TYPE_CHECKING:
    from core.events import ToolCall
    from core.user.config import Config
    from core.user.mcp_client import McpHub

MAX_ROUNDS = 8
DENIED = "the user denied this call"


@dataclass(frozen=True)
class RunOutcome:
    """A call's `role: "tool"` content for the model, and whether it failed (denied, error, timeout)."""

    content: str
    is_error: bool


def start_hub(config: Config, note: Callable[[str], None], wait_s: float = 30.0) -> McpHub:
    """The config's enabled MCP servers, started; returns once none is still starting (or after `wait_s`)."""
    from core.user.mcp_client import McpHub, quiet_sdk_logs

    servers = [s for s in config.mcp_servers.values() if s.enabled]
    if not servers:
        raise UsageError("--mcp: config.toml enables no MCP servers ([mcp.servers.NAME])")
    quiet_sdk_logs()
    hub = McpHub(servers)
    hub.start()
    deadline = time.monotonic() + wait_s
    while any(s.status == "starting" for s in hub.states()) and time.monotonic() < deadline:
        time.sleep(0.05)
    for s in hub.states():
        if s.status != "ready":
            note(f"MCP server {s.name} is {s.status}{': ' + s.error if s.error else ''}; its tools are not offered")
    return hub


def merged_tools(file_tools: list[dict] | None, hub: McpHub | None) -> list[dict] | None:
    """The --tools file's tools and the ready MCP servers' (a name in both is refused: which would run?)."""
    tools = list(file_tools or [])
    names = {t["function"]["name"] for t in tools}
    for t in hub.tools() if hub is not None else ():
        if t.name in names:
            raise UsageError(f"--tools declares {t.name!r}, which MCP server {t.server} also has: rename one")
        names.add(t.name)
        tools.append(t.openai())
    return tools or None


class CallRunner:
    """Runs a reply's calls on the hub, asking first (see the module docstring)."""

    def __init__(self, hub: McpHub, allow_all: bool, ask_in: TextIO | None, note: Callable[[str], None]) -> None:
        self.hub = hub
        self.allow_all = allow_all
        self.ask_in = ask_in  # where answers are read (a terminal), None: nobody to ask
        self.note = note

    def runnable(self, calls: tuple[ToolCall, ...]) -> bool:
        """Whether every call can be decided here: an MCP tool, and someone (or something) to allow it."""
        for call in calls:
            tool = self.hub.find(call.name)
            if tool is None:
                self.note(f"not run: {call.name} is not a tool of a ready MCP server (printed only)")
                return False
            if not (self.allow_all or self.hub.state(tool.server).trusted or self.ask_in is not None):
                self.note(f"not run: {call.name} (pass --yes to run MCP tools, or trust its server in config.toml)")
                return False
        return True

    def run(self, call: ToolCall) -> RunOutcome:
        from core.user.mcp_client import McpError

        tool = self.hub.find(call.name)
        assert tool is not None  # runnable() said so
        if not (self.allow_all or self.hub.state(tool.server).trusted) and not self._ask(call, tool.server):
            return RunOutcome(json.dumps({"error": DENIED}), True)
        try:
            result = self.hub.call(tool, call.arguments).result()
        except McpError as e:
            self.note(str(e))
            return RunOutcome(json.dumps({"error": str(e)}, ensure_ascii=False), True)
        if result.is_error:
            return RunOutcome(json.dumps({"error": result.text}, ensure_ascii=False), True)
        return RunOutcome(result.text, False)

    def _ask(self, call: ToolCall, server: str) -> bool:
        assert self.ask_in is not None
        arguments = json.dumps(call.arguments, indent=2, ensure_ascii=False)
        sys.stderr.write(f"run {printable(call.name)} ({printable(server)}) with\n{printable(arguments)}\n? [y/N] ")
        sys.stderr.flush()
        return self.ask_in.readline().strip().lower() in ("y", "yes")


def tool_messages(calls: tuple[ToolCall, ...], outcomes: list[RunOutcome]) -> list[dict]:
    """One `role: "tool"` message per call, in order (what the next turn sends the model)."""
    return [
        {"role": "tool", "tool_call_id": c.id, "name": c.name, "content": o.content} for c, o in zip(calls, outcomes)
    ]
