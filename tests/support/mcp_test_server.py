"""A real MCP server over stdio for the tests (the official SDK's MCPServer), with ways to misbehave.

    python tests/support/mcp_test_server.py [MODE]

MODE: "ok" (default: tools echo, add, slow, crash), "garbage" (writes non-JSON on stdout and never
answers), "hang" (reads stdin, never answers), "exit" (says why on stderr and exits 3 at once).
"""

from __future__ import annotations

import os
import sys
import time


def serve() -> None:
    from mcp.server import MCPServer

    server = MCPServer("gemma-chat-test")

    @server.tool(description="Repeat the text back")
    def echo(text: str) -> str:
        return f"echo: {text}"

    @server.tool(description="Add two integers")
    def add(a: int, b: int) -> dict:
        return {"sum": a + b}

    @server.tool(description="Sleep, then answer")
    def slow(seconds: float) -> str:
        time.sleep(seconds)
        return "awake"

    @server.tool(description="Exit the server process mid-call")
    def crash() -> str:
        os._exit(7)

    server.run("stdio")


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "ok"
    if mode == "ok":
        serve()
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
