"""The chat's MCP servers, through the official `mcp` SDK, on a thread of their own (issue 26 §3).

`McpHub` owns one asyncio loop on a daemon thread; every server is a task on it that opens the
transport (a stdio child process, or streamable HTTP), initialises the session, lists the tools and
then holds the session open until it is stopped. Callers on any thread (the UI) get plain values
(`ServerState`, `McpTool`) and `concurrent.futures.Future`s (`call`); nothing here blocks its caller,
and nothing here imports textual.

Everything that can go wrong with a server is one line in its state or in the call's McpError: a
command that does not exist, a process that exits, a server that does not answer `initialize` within
`start_timeout_s` (a hang, or garbage on its stdout), a call past the server's `timeout`. A stdio
server's stderr goes to a temporary file, never to the terminal, and its last line is quoted in the
error. The servers are the app's children: `close()` ends their sessions, which ends their processes
(the SDK terminates a child that does not leave when its stdin closes); a server whose parent dies
sees its stdin close and exits.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import re
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import IO, Any

from core.user.mcp_config import McpServerConfig, find_command

log = logging.getLogger("gemma_chat.mcp")

START_TIMEOUT_S = 20.0
_NAME = re.compile(r"^[A-Za-z0-9_.:-]+$")  # what Gemma 4's call syntax can name (core.decode.chat_format)


class McpError(RuntimeError):
    """A call or a server that failed; the message is the one line to show."""


@dataclass(frozen=True)
class McpTool:
    server: str
    name: str
    description: str
    input_schema: dict

    def openai(self) -> dict:
        """As an OpenAI `tools` item (what Engine.chat takes)."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.input_schema},
        }


@dataclass(frozen=True)
class ServerState:
    name: str
    where: str  # the command or the URL
    status: str  # "off" | "starting" | "ready" | "failed"
    error: str = ""
    tools: tuple[McpTool, ...] = ()
    trusted: bool = False


@dataclass(frozen=True)
class ToolResult:
    text: str  # what goes back to the model (a JSON text when the server gave structured content)
    is_error: bool = False  # the tool said it failed (the model is told, the chat goes on)


@dataclass
class _Server:
    config: McpServerConfig
    state: ServerState
    session: Any = None
    stop: asyncio.Event | None = None
    http_error: str = ""  # a streamable HTTP server's last error status ("HTTP 401 from URL"), for _why
    task: asyncio.Task | None = None
    errlog: IO[str] | None = None
    crashed: bool = False  # a call found the connection gone: the state stays "failed"


def result_text(result: Any) -> ToolResult:
    """A CallToolResult as text for the model: its structured content as JSON, else its text parts;
    other parts (images, resources) are named, not passed on."""
    parts = []
    for item in getattr(result, "content", None) or ():
        kind = getattr(item, "type", "")
        if kind == "text":
            parts.append(str(item.text))
        else:
            parts.append(f"[{kind} content: {getattr(item, 'mime_type', None) or 'not shown'}]")
    structured = getattr(result, "structured_content", None)
    is_error = bool(getattr(result, "is_error", False))
    if structured is not None and not is_error:
        return ToolResult(json.dumps(structured, ensure_ascii=False))
    return ToolResult("\n".join(parts), is_error)


@dataclass
class McpHub:
    servers: list[McpServerConfig]
    start_timeout_s: float = START_TIMEOUT_S
    on_change: Callable[[], None] | None = None  # called on the hub's thread when a state changes
    _by_name: dict[str, _Server] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        quiet_sdk_logs()
        for c in self.servers:
            state = ServerState(c.name, c.where, "off", trusted=c.trusted)
            self._by_name[c.name] = _Server(c, state)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="gemma-chat-mcp", daemon=True)
        self._thread.start()
        self._closed = False

    # -- what callers see ---------------------------------------------------------------------------
    def start(self) -> None:
        """Start every enabled server (returns at once)."""
        for s in self._by_name.values():
            if s.config.enabled:
                self.set_enabled(s.config.name, True)

    def states(self) -> list[ServerState]:
        return [s.state for s in self._by_name.values()]

    def state(self, name: str) -> ServerState:
        return self._by_name[name].state

    def tools(self) -> list[McpTool]:
        """The tools of the servers that are ready, first server first; a name already taken is skipped."""
        seen: set[str] = set()
        out = []
        for s in self._by_name.values():
            if s.state.status != "ready":
                continue
            for t in s.state.tools:
                if t.name not in seen:
                    seen.add(t.name)
                    out.append(t)
        return out

    def find(self, tool_name: str) -> McpTool | None:
        return next((t for t in self.tools() if t.name == tool_name), None)

    def set_enabled(self, name: str, on: bool) -> None:
        """Start (on) or stop a server; its state says how it went. On return the state is already
        "starting" (or "off"), never the one before: a caller that waits for "ready" cannot read a stale
        "failed"."""
        if self._closed:
            return
        server = self._by_name[name]
        switch = self._start if on else self._stop

        async def now() -> None:
            switch(server)

        with contextlib.suppress(concurrent.futures.TimeoutError):
            asyncio.run_coroutine_threadsafe(now(), self._loop).result(timeout=2.0)

    def call(self, tool: McpTool, arguments: dict) -> concurrent.futures.Future[ToolResult]:
        """Run `tool`; the future ends with its ToolResult or an McpError. Cancelling the future stops
        the call (Esc in the chat)."""
        server = self._by_name[tool.server]
        return asyncio.run_coroutine_threadsafe(self._call(server, tool, arguments), self._loop)

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop every server (their processes end) and the hub's thread."""
        if self._closed:
            return
        self._closed = True

        async def stop_all() -> None:
            tasks = [s.task for s in self._by_name.values() if s.task is not None and not s.task.done()]
            for s in self._by_name.values():
                if s.stop is not None:
                    s.stop.set()
            if tasks:
                _, pending = await asyncio.wait(tasks, timeout=timeout_s)
                for t in pending:
                    t.cancel()
                if pending:
                    await asyncio.wait(pending, timeout=1.0)

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(stop_all(), self._loop).result(timeout=timeout_s + 2)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=2)

    # -- the hub's thread ---------------------------------------------------------------------------
    def _set(self, server: _Server, **changes: Any) -> None:
        server.state = replace(server.state, **changes)
        if self.on_change is not None:
            with contextlib.suppress(Exception):
                self.on_change()

    def _start(self, server: _Server) -> None:
        if server.task is not None and not server.task.done():
            return
        server.stop = asyncio.Event()
        server.crashed = False
        self._set(server, status="starting", error="", tools=())
        server.task = self._loop.create_task(self._serve(server))

    def _stop(self, server: _Server) -> None:
        if server.stop is not None:
            server.stop.set()
        if server.task is None or server.task.done():
            self._set(server, status="off", error="", tools=())

    async def _serve(self, server: _Server) -> None:
        name = server.config.name
        try:
            async with contextlib.AsyncExitStack() as stack:
                try:
                    async with asyncio.timeout(self.start_timeout_s):
                        session = await self._open(server, stack)
                        await session.initialize()
                        listed = await session.list_tools()
                except TimeoutError:
                    why = f"did not answer within {self.start_timeout_s:g} s (not an MCP server, or stuck)"
                    raise McpError(why) from None
                tools = tuple(_tool(name, t) for t in listed.tools if _NAME.match(str(t.name)))
                server.session = session
                self._set(server, status="ready", error="", tools=tools)
                assert server.stop is not None
                await server.stop.wait()
        except asyncio.CancelledError:
            pass
        except BaseException as e:  # noqa: BLE001 - a server's failure is its state, never the app's crash
            self._set(server, status="failed", error=self._why(server, e), tools=())
            log.warning("MCP server %s: %s", name, server.state.error)
            return
        finally:
            server.session = None
            if server.errlog is not None:
                server.errlog.close()
                server.errlog = None
        if not server.crashed:
            self._set(server, status="off", error="", tools=())

    async def _open(self, server: _Server, stack: contextlib.AsyncExitStack) -> Any:
        from mcp import ClientSession

        c = server.config
        if c.command is not None:
            from mcp.client.stdio import StdioServerParameters, stdio_client

            server.errlog = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")
            params = StdioServerParameters(command=find_command(c.command), args=list(c.args), env=dict(c.env) or None)
            streams = await stack.enter_async_context(stdio_client(params, errlog=server.errlog))
        else:
            import httpx2
            from mcp.client.streamable_http import streamable_http_client

            async def record(response: Any) -> None:  # the SDK's own error says no more than "an error response"
                if response.status_code >= 400:
                    server.http_error = f"HTTP {response.status_code} from {c.url}"

            hooks = {"response": [record]}
            client = await stack.enter_async_context(
                httpx2.AsyncClient(headers=c.headers, timeout=c.timeout_s, event_hooks=hooks)
            )
            assert c.url is not None
            streams = await stack.enter_async_context(streamable_http_client(c.url, http_client=client))
        return await stack.enter_async_context(ClientSession(streams[0], streams[1]))

    def _why(self, server: _Server, e: BaseException) -> str:
        while isinstance(e, BaseExceptionGroup) and e.exceptions:
            e = e.exceptions[0]
        if isinstance(e, FileNotFoundError):
            text = f"cannot start {server.config.command!r}: no such program"
            if server.config.command == "mcp-server-time":
                text += " (pip install mcp-server-time)"
            return text
        text = str(e) if isinstance(e, McpError) else f"{type(e).__name__}: {e}".rstrip(": ")
        if server.http_error:
            status = server.http_error
            auth = status.startswith(("HTTP 401", "HTTP 403"))
            text += f" ({status}{': check its headers in config.toml' if auth else ''})"
        tail = _last_line(server.errlog)
        return f"{text}; it said: {tail}" if tail else text

    async def _call(self, server: _Server, tool: McpTool, arguments: dict) -> ToolResult:
        where = f"{tool.server}: {tool.name}"
        session = server.session
        if session is None:
            raise McpError(f"{where}: the server is not running ({server.state.error or server.state.status})")
        timeout = server.config.timeout_s
        try:
            async with asyncio.timeout(timeout):
                result = await session.call_tool(tool.name, arguments)
        except TimeoutError:
            raise McpError(f"{where} did not answer within {timeout:g} s") from None
        except asyncio.CancelledError:
            raise
        except Exception as e:
            message = f"{where} failed: {self._why(server, e)}"
            server.crashed = True  # the session is unusable (the SDK reports a tool's own failure as is_error)
            self._set(server, status="failed", error=message, tools=())
            if server.stop is not None:
                server.stop.set()
            raise McpError(message) from None
        return result_text(result)


def quiet_sdk_logs() -> None:
    """The SDK logs a server's garbage lines with tracebacks; with no handler configured Python would
    print them on stderr, over the chat's screen. The state's one line says it instead."""
    for name in ("mcp", "gemma_chat.mcp"):
        logger = logging.getLogger(name)
        if not any(isinstance(h, logging.NullHandler) for h in logger.handlers):
            logger.addHandler(logging.NullHandler())
        logger.propagate = False


def _tool(server: str, t: Any) -> McpTool:
    schema = getattr(t, "input_schema", None) or getattr(t, "inputSchema", None) or {"type": "object"}
    return McpTool(server, str(t.name), str(getattr(t, "description", "") or ""), dict(schema))


def _last_line(errlog: IO[str] | None) -> str:
    if errlog is None:
        return ""
    with contextlib.suppress(Exception):
        errlog.flush()
        errlog.seek(0)
        lines = [line.strip() for line in errlog.read()[-4000:].splitlines() if line.strip()]
        return lines[-1][:200] if lines else ""
    return ""
