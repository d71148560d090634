"""The chat's side of tool calling: which MCP tools a turn offers, and what happens when the reply
calls some (issue 26 §3).

For each call, in order: it is shown (name, server, arguments in full); it runs only after the user
allowed it (once, or always for this tool this session) or when its server is trusted; it runs on
the MCP hub's thread (core.user.mcp_client) with the server's timeout, never on the UI thread; its
result is shown collapsed. A denied call, a failure or a timeout goes back to the model as an
`{"error": ...}` result and the chat goes on. Once every call has its result the model continues
(the screen starts the next turn with the calls and results in the history). Esc, in the approval
dialog or while a call runs, stops there: the running call is cancelled, no further call runs and
the model does not continue. At most MAX_ROUNDS rounds of calls follow one message of the user.

Servers take seconds to start (mcp-server-time about 5 s on a loaded machine). A message sent while an
enabled server is still starting waits for it, up to STARTING_WAIT_S, under a "starting MCP servers…"
line, so that its first question is asked with the tools; Esc sends it at once with the tools that are
ready. A server still starting after the wait is named in that line: the message went without its tools.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from app.tui.screens.tools import ALWAYS, DENY, STOP, ToolApprovalScreen
from app.tui.widgets.tool_call import ToolCallView
from core.events import ToolCall
from core.user.mcp_client import McpError, McpHub

if TYPE_CHECKING:
    from textual.screen import Screen
    from textual.widget import Widget
    from textual.worker import Worker

MAX_ROUNDS = 8
STARTING_WAIT_S = 15.0  # the hub's start timeout is 20 s: a server slower than this is probably stuck
STOPPED = "stopped by the user: not run"
DENIED = "the user denied this call"


@dataclass(frozen=True)
class ToolOutcome:
    call: ToolCall
    content: str  # the `role: "tool"` message's content, for the model
    shown: str  # what the chat says happened
    server: str | None = None  # the MCP server whose tool it is (None: no such tool)


def _error(text: str) -> str:
    return json.dumps({"error": text}, ensure_ascii=False)


class ChatTools:
    """Owned by the chat screen: `offered()` for a turn, `run(calls, ...)` when a reply called tools."""

    def __init__(self, screen: Screen, hub: McpHub | None, mount: Callable[[Widget], None]) -> None:
        self.screen = screen
        self.hub = hub
        self.mount = mount  # puts a widget at the end of the conversation
        self.always: set[str] = set()  # tools the user allowed for the rest of the session
        self.rounds = 0  # rounds of calls since the user's last message
        self.worker: Worker | None = None

    @property
    def active(self) -> bool:
        return self.worker is not None and not self.worker.is_finished

    def offered(self, engine_can: bool) -> list[dict] | None:
        """The tools a turn declares to the model: the ready servers' (None: no tools, or the engine cannot)."""
        if self.hub is None or not engine_can:
            return None
        return [t.openai() for t in self.hub.tools()] or None

    def user_sent(self) -> None:
        self.rounds = 0

    def starting(self) -> list[str]:
        """The enabled servers still starting (their tools are not offered yet)."""
        return [s.name for s in self.hub.states() if s.status == "starting"] if self.hub is not None else []

    def wait_for_servers(self, engine_can: bool, then: Callable[[], None]) -> bool:
        """If servers are still starting (and the engine takes tools), wait for them in a worker, then
        call `then` (the turn starts); False when there is nothing to wait for (call `then` yourself)."""
        names = self.starting()
        if not engine_can or not names:
            return False
        self.worker = self.screen.run_worker(self._wait(names, then), group="tools", exclusive=True)
        return True

    async def _wait(self, names: list[str], then: Callable[[], None]) -> None:
        from textual.widgets import Static

        line = Static(f"starting MCP servers ({', '.join(names)})… the message goes when they are ready (Esc: now)")
        line.add_class("tools-starting")
        self.mount(line)
        deadline = time.monotonic() + STARTING_WAIT_S
        try:
            while self.starting() and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
        except asyncio.CancelledError:
            self._waited(line, names, "sent at once with Esc")
            then()
            raise
        self._waited(line, names, f"waited {STARTING_WAIT_S:g} s")
        then()

    def _waited(self, line: Widget, names: list[str], why: str) -> None:
        """The wait is over: the line goes when every server is ready, else it says whose tools the
        message went without: those still starting, and those that failed meanwhile (and why)."""
        from textual.widgets import Static

        assert self.hub is not None and isinstance(line, Static)
        states = [self.hub.state(n) for n in names]
        late = [s.name for s in states if s.status == "starting"]
        failed = [f"{s.name} failed ({s.error})" for s in states if s.status == "failed"]
        if not late and not failed:
            line.remove()
            return
        parts = ([f"{', '.join(late)} still starting ({why})"] if late else []) + failed
        line.update(f"tools not available yet: {'; '.join(parts)}; this message went without their tools")

    def run(self, calls: tuple[ToolCall, ...], done: Callable[[list[ToolOutcome], bool], None]) -> bool:
        """Handle a reply's calls in a worker; `done(outcomes, stopped)` when they have their results.
        False (nothing started) past MAX_ROUNDS."""
        if self.rounds >= MAX_ROUNDS:
            self.screen.notify(f"Stopped: {MAX_ROUNDS} rounds of tool calls in a row", severity="warning")
            return False
        self.rounds += 1
        self.worker = self.screen.run_worker(self._run(calls, done), group="tools", exclusive=True)
        return True

    def stop(self) -> None:
        """Esc: cancel the running call (the hub cancels it on the server's side) and everything after it."""
        if self.worker is not None:
            self.worker.cancel()

    async def _run(self, calls: tuple[ToolCall, ...], done: Callable[[list[ToolOutcome], bool], None]) -> None:
        outcomes: list[ToolOutcome] = []
        stopped = False
        try:
            for call in calls:
                if stopped:
                    outcomes.append(ToolOutcome(call, _error(STOPPED), STOPPED))
                    continue
                outcome = await self._one(call)
                stopped = outcome.shown == STOPPED
                outcomes.append(outcome)
        except asyncio.CancelledError:
            stopped = True
            taken = {o.call.id for o in outcomes}
            outcomes += [ToolOutcome(c, _error(STOPPED), STOPPED) for c in calls if c.id not in taken]
            done(outcomes, stopped)
            raise
        done(outcomes, stopped)

    async def _one(self, call: ToolCall) -> ToolOutcome:
        assert self.hub is not None
        tool = self.hub.find(call.name)
        view = ToolCallView(call.name, tool.server if tool else None, call.arguments)
        self.mount(view)
        if tool is None:
            view.set_state("no such tool on the MCP servers now", failed=True)
            return ToolOutcome(call, _error(f"no tool named {call.name}"), "no such tool")
        trusted = self.hub.state(tool.server).trusted
        answer = "allow" if trusted or call.name in self.always else None
        if answer is None:
            try:
                answer = await self.screen.app.push_screen_wait(
                    ToolApprovalScreen(call.name, tool.server, call.arguments)
                )
            except asyncio.CancelledError:
                view.set_state(STOPPED)
                raise
        if answer == ALWAYS:
            self.always.add(call.name)
        if answer == STOP:
            view.set_state(STOPPED)
            return ToolOutcome(call, _error(STOPPED), STOPPED, tool.server)
        if answer == DENY:
            view.set_state("denied: the model is told so")
            return ToolOutcome(call, _error(DENIED), DENIED, tool.server)
        view.set_state("running… (Esc stops)" + (" · trusted server" if trusted else ""))
        future = self.hub.call(tool, call.arguments)
        try:
            result = await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            future.cancel()
            view.set_state(STOPPED + " (cancelled while running)")
            raise
        except McpError as e:
            view.set_state(str(e), failed=True)
            return ToolOutcome(call, _error(str(e)), str(e), tool.server)
        except Exception as e:  # the hub's contract is McpError; nothing from a server may end the chat
            message = f"{call.name} failed: {type(e).__name__}: {e}"
            view.set_state(message, failed=True)
            return ToolOutcome(call, _error(message), message, tool.server)
        view.set_state("the tool said it failed" if result.is_error else "done", failed=result.is_error)
        view.show_result(result.text)
        return ToolOutcome(call, _error(result.text) if result.is_error else result.text, "done", tool.server)
