"""`gemma-chat serve --demo --parallel 2 --max-waiting 3` as a process under more clients than it takes (issue 25's
load scenario, small): ten requests sent one after another (each in the server, or refused, before the next) overflow
two rows and three waiting seats; every accepted one completes with exactly the ids it gets alone, its first token in
arrival order (FIFO); refused ones get 429 at once;
afterwards the server is idle and its resident memory near its idle level."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field

import httpx2 as httpx
from serve_process import ServeProcess

PROMPTS = ["Tell me about the sea.", "What is a cat?", "Write a poem about rain."]
# Long enough that the first requests still hold their seats while the last ones arrive, on a fast machine
# too (at 48 tokens a faster engine finished them first, and nothing was refused)
TOKENS = 200
CLIENTS = 10


@dataclass
class Sent:
    prompt: int
    sent: float = 0.0
    status: int = 0
    answered: float = 0.0  # the 429's status line, or the first token
    ids: list[int] = field(default_factory=list)


def request(url: str, out: Sent) -> Sent:
    body = {
        "messages": [{"role": "user", "content": PROMPTS[out.prompt]}],
        "max_tokens": TOKENS,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
    }
    out.sent = time.monotonic()
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=300) as r:
        out.status = r.status_code
        if r.status_code != 200:
            out.answered = time.monotonic()
            r.read()
            return out
        for line in r.iter_lines():
            if line.startswith("data: {"):
                got = (json.loads(line[6:]).get("gemma_chat") or {}).get("tokens", ())
                if got and not out.ids:
                    out.answered = time.monotonic()
                out.ids.extend(t["id"] for t in got)
    return out


def in_server(url: str) -> int:
    """Requests the server holds: decoding plus waiting."""
    health = httpx.get(url + "/health", timeout=10).json()
    return int(health["running"]) + int(health["waiting"])


def wait_idle(url: str) -> None:
    """Until the server holds no request (a stream's slot is released just after its client has it all)."""
    deadline = time.monotonic() + 15
    while in_server(url) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert in_server(url) == 0, "the server still holds requests 15 s after its clients finished"


def rss(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_more_clients_than_seats_fifo_solo_ids_429_at_once_and_memory_back() -> None:
    with ServeProcess(["--demo", "--parallel", "2", "--max-waiting", "3"]) as server:
        assert server.proc is not None
        alone = {i: request(server.url, Sent(i)).ids for i in range(len(PROMPTS))}
        for _ in range(2):  # warm the batch's shapes (two rows), then measure the idle level
            pair = [threading.Thread(target=request, args=(server.url, Sent(i))) for i in range(2)]
            for t in pair:
                t.start()
            for t in pair:
                t.join(timeout=300)
        wait_idle(server.url)
        time.sleep(1.0)
        idle = rss(server.proc.pid)

        sent = [Sent(i % len(PROMPTS)) for i in range(CLIENTS)]
        threads = []
        for s in sent:  # one at a time into the server: each is in (or refused) before the next is sent
            before = in_server(server.url)
            threads.append(threading.Thread(target=request, args=(server.url, s)))
            threads[-1].start()
            deadline = time.monotonic() + 1.0
            while not s.status and in_server(server.url) == before and time.monotonic() < deadline:
                time.sleep(0.01)
        for t in threads:
            t.join(timeout=300)

        ok = [s for s in sent if s.status == 200]
        busy = [s for s in sent if s.status == 429]
        assert len(ok) + len(busy) == CLIENTS, [s.status for s in sent]
        assert all(s.status == 200 for s in sent[:5]) and busy  # two rows and three seats, then full
        for s in ok:
            assert s.ids == alone[s.prompt]
        assert all(s.answered - s.sent < 5.0 for s in busy)  # refused at once, not after waiting (a loaded CI)
        for a, b in zip(ok, ok[1:]):  # FIFO: in arrival order (two first tokens of one step may swap by ms)
            assert b.answered > a.answered - 0.1, f"request {sent.index(b)} overtook {sent.index(a)}"

        wait_idle(server.url)
        time.sleep(1.0)
        after = rss(server.proc.pid)
        assert after < idle + 64 * 2**20, f"RSS {idle / 2**20:.0f} MB idle -> {after / 2**20:.0f} MB after the load"
        assert request(server.url, Sent(0)).ids == alone[0]  # and it keeps serving
