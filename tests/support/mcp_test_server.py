"""A real MCP server over stdio for the tests (the official SDK's MCPServer), with ways to misbehave.

    python tests/support/mcp_test_server.py [MODE]

MODE: "ok" (default: tools echo, say (plain text content, no structured copy), add, slow, getenv, babble
(garbage on stdout mid-call), crash), "garbage" (writes non-JSON on stdout and never answers), "hang" (reads
stdin, never answers), "exit" (says why on stderr and exits 3 at once), "slow-start SECONDS" (waits, then
serves as "ok").

    python tests/support/mcp_test_server.py http PORT TOKEN

serves the same tools over streamable HTTP at http://127.0.0.1:PORT/mcp, to requests that carry the
header `Authorization: Bearer TOKEN` (others get a 401).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

TOOL_NAMES = ("echo", "say", "add", "slow", "getenv", "babble", "crash")  # as "ok" lists them, in order


def serve(transport: str = "stdio", port: int = 0, token: str = "") -> None:
    from mcp.server import MCPServer

    server = MCPServer("gemma-chat-test")

    @server.tool(description="Repeat the text back")
    def echo(text: str) -> str:
        return f"echo: {text}"

    @server.tool(description="Repeat the text back as plain text content", structured_output=False)
    def say(text: str) -> str:
        return text

    @server.tool(description="Add two integers")
    def add(a: int, b: int) -> dict:
        return {"sum": a + b}

    @server.tool(description="Sleep, then answer")
    def slow(seconds: float) -> str:
        time.sleep(seconds)
        return "awake"

    @server.tool(description="A variable of the server's environment")
    def getenv(name: str) -> str:
        return os.environ.get(name, "(unset)")

    @server.tool(description="Write garbage on the protocol's stream mid-call, then answer")
    def babble() -> str:
        os.write(1, b"Loading plugins... <html>not json</html>\n{broken json\n\x1b[31mred\n")
        return "after the noise"

    @server.tool(description="Exit the server process mid-call")
    def crash() -> str:
        os._exit(7)

    if transport == "stdio":
        server.run("stdio")
        return
    import uvicorn

    app = server.streamable_http_app()

    async def guarded(scope: dict, receive: Any, send: Any) -> None:
        headers = dict(scope.get("headers") or [])
        if scope["type"] == "http" and headers.get(b"authorization") != f"Bearer {token}".encode():
            await send({"type": "http.response.start", "status": 401, "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": b"unauthorized"})
            return
        await app(scope, receive, send)

    uvicorn.run(guarded, host="127.0.0.1", port=port, log_level="warning", lifespan="on")


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "ok"
    if mode == "ok":
        serve()
    elif mode == "slow-start":  # ready after a few seconds, as mcp-server-time on a loaded machine
        time.sleep(float(sys.argv[2]))
        serve()
    elif mode == "http":
        serve("http", int(sys.argv[2]), sys.argv[3])
    elif mode == "garbage":
        for _ in range(3):
            sys.stdout.write("Welcome to my server! <html>not json</html>\n")
            sys.stdout.flush()
        sys.stdin.read()
    elif mode == "hang":
        sys.stdin.read()
    elif mode == "exit":
        sys.stderr.write("fatal: no database configured\n")
        sys.exit(3)


if __name__ == "__main__":
    main()
