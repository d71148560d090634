"""`scripts/bench_serve.py --streams 4,8`: concurrent greedy streams against `gemma-chat serve` (issue 25).

Two real server processes on the same pairing: `--parallel 1` (requests one at a time, the old server)
and `--parallel N` (continuous batching). For each N, interleaved and repeated: the same N requests
(different prompts, greedy, EOS ignored, `--tokens` each) sent one after another to the first, and all
at once from N threads to the second. Aggregate tok/s = all tokens / wall time from the first request
to the last token (prefills included). On a shared machine wall time swings with the load, so each run
also reports the server process's own CPU time per token (all its threads, from /proc): the engine's
and the server's work, whatever else runs. `--compare DIR` adds a batched server on another checkout's
code to the same interleaved repeats (before/after). Per stream, the inter-token gaps are the times between the
arrivals of consecutive tokens at the client (a round's tokens arrive together: a gap of 0 inside a
round), and its p95 is compared with the p95 of the same stream alone.

`--join` (bench_join): the latency of a long prompt joining running streams. Three streams run; once
each has its first tokens, a request with a long prompt arrives. Per running stream its p95 (and max)
inter-token gap against the same stream alone, and the newcomer's time to first token against its
time alone (its prefill) plus two rounds (a round: the running streams' median time from one round's
first token to the next's); and its prefill as the server timed it, alone and joining (on a small machine
the prefill itself slows beside the running streams' HTTP work and clients: 103-111 ms alone, 104-146 ms
joining, on stop 53's 2-core Xeon, where the engine made the newcomer wait 1-3 ms beyond it).
`--checkout DIR` serves another checkout's code (e.g. main's, for a before/after run).

`--load` (bench_load): CLIENTS clients (default 32) for SECONDS (60) against `--parallel 4 --max-waiting 16`,
each sending greedy requests one after another (a random prompt each; after a 429 it retries 0.2-1 s later).
Every prompt is first run alone on the same server; every accepted request must get exactly those ids.
Reported: accepted, refused (429) and failed requests, how fast a 429 came, the accepted requests' time to
first token, FIFO inversions (an accepted request sent 1 s after another that got its first token 1 s
before it: the earlier one was starved), and the server's RSS after the solo runs, idle after a 10 s warm-up
load (the batch's shapes traced, its caches filled: one-time memory) and 2 s after the load.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx2 as httpx

PROMPTS = [
    "Tell me a long story about the sea.",
    "What is a cat?",
    "Write a poem about rain in the city.",
    "Explain how rivers form.",
    "Why is the sky blue?",
    "Describe a walk in the forest.",
    "What is speculative decoding?",
    "Tell me about the moon.",
]


def _greedy_stream(prompt: str, tokens: int) -> dict:
    """A streamed greedy chat request of exactly `tokens` tokens (eos ignored)."""
    return {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": tokens,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
    }


def client() -> httpx.Client:
    """A client for a run's requests, made before its clock starts. Each `httpx.stream(...)` call builds a
    client of its own (its TLS context: about 20 ms of CPU here), which the old benches timed as the
    server's: 21 ms of a request's time to first token on an idle server (34 against 13 ms at the server;
    1 ms with one client), and more beside running streams, whose threads share the core."""
    return httpx.Client(timeout=600)


def stream_times(
    http: httpx.Client,
    url: str,
    prompt: str,
    tokens: int,
    block_size: str,
    times: list[float] | None = None,
    rounds: list[int] | None = None,
    stats: dict | None = None,
) -> list[float]:
    """One streamed request: the arrival time (perf_counter) of every token (appended to `times` as they come),
    the engine's round of each (to `rounds`, when given) and the server's stats of the request (to `stats`)."""
    body = {**_greedy_stream(prompt, tokens), "block_size": block_size if block_size == "auto" else int(block_size)}
    times = [] if times is None else times
    with http.stream("POST", url + "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: {"):
                extra = json.loads(line[6:]).get("gemma_chat") or {}
                got = extra.get("tokens", ())
                now = time.perf_counter()
                times.extend([now] * len(got))
                if stats is not None and "stats" in extra:
                    stats.update(extra["stats"])
                if rounds is not None:
                    rounds.extend(int(t.get("round", 0)) for t in got)
    return times


def round_gaps(times: list[float], rounds: list[int]) -> list[float]:
    """Seconds between the first arrivals of consecutive rounds of one stream. A round's tokens can come in
    several chunks, a fraction of a millisecond apart: gaps between arrivals would count those as rounds."""
    firsts = [t for i, (t, r) in enumerate(zip(times, rounds)) if i == 0 or r != rounds[i - 1]]
    return [b - a for a, b in zip(firsts, firsts[1:])]


def p95_gap(times: list[float]) -> float:
    gaps = sorted(b - a for a, b in zip(times, times[1:]))
    return gaps[min(int(0.95 * len(gaps)), len(gaps) - 1)] if gaps else 0.0


def one_at_a_time(url: str, prompts: list[str], tokens: int, block: str) -> tuple[float, list[list[float]]]:
    with client() as http:
        t0 = time.perf_counter()
        streams = [stream_times(http, url, p, tokens, block) for p in prompts]
    return sum(len(s) for s in streams) / (streams[-1][-1] - t0), streams


def together(url: str, prompts: list[str], tokens: int, block: str) -> tuple[float, list[list[float]]]:
    streams: list[list[float]] = [[] for _ in prompts]
    go = threading.Barrier(len(prompts) + 1)

    def run(i: int) -> None:
        with client() as http:  # one per thread, as a client app's threads would hold theirs
            go.wait()
            streams[i] = stream_times(http, url, prompts[i], tokens, block)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    go.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    return sum(len(s) for s in streams) / (max(s[-1] for s in streams) - t0), streams


def _server(args: list[str], checkout: str | None) -> Any:
    import sys
    from pathlib import Path

    from serve_process import ServeProcess

    if checkout is None:
        return ServeProcess(args)
    return ServeProcess(args, command=[sys.executable, "-m", "app.cli"], cwd=Path(checkout))


def bench_streams(
    serve_args: list[str],
    counts: list[int],
    tokens: int,
    repeats: int,
    block: str,
    checkout: str | None = None,
    compare: str | None = None,
) -> None:
    """`compare`: another checkout's batched server too, in the same interleaved repeats (before/after)."""
    biggest = max(counts)
    solo = _server([*serve_args, "--parallel", "1", "--max-waiting", str(biggest)], checkout)
    batched_args = [*serve_args, "--parallel", str(biggest), "--max-waiting", str(biggest)]
    servers = {"solo": solo, "batch": _server(batched_args, checkout)}
    if compare is not None:
        servers["other"] = _server(batched_args, compare)
    with contextlib.ExitStack() as stack:
        for s in servers.values():
            stack.enter_context(s)
        prompts = [PROMPTS[i % len(PROMPTS)] for i in range(biggest)]
        one_at_a_time(solo.url, prompts[:2], 16, block)  # warm them all: kernels, caches
        for name in ("batch", "other"):
            if name in servers:
                together(servers[name].url, prompts, 16, block)
        waited = wait_quiet([s.proc.pid for s in servers.values()])
        print(f"(waited {waited:.1f} s for the servers' idle-time warm-up to end)")
        print(f"{tokens} tokens per stream, greedy, EOS ignored, block size {block}; {repeats} repeats, interleaved")
        other = f" | together ({compare}) tok/s | its ratio" if compare else ""
        cpu = "one at a time / together" + (f" / together ({compare})" if compare else "")
        print(
            "| streams | one at a time tok/s | together tok/s | ratio | p95 gap alone ms | "
            f"p95 gap together ms | server CPU ms per token: {cpu}{other} |"
        )
        print("|---|---|---|---|---|---|---|" + ("---|---|" if compare else ""))
        for n in counts:
            _stream_rows(servers, prompts[:n], tokens, repeats, block)


def _stream_rows(servers: dict[str, Any], prompts: list[str], tokens: int, repeats: int, block: str) -> None:
    """One table row (and its repeats) of `bench_streams`: the servers' runs interleaved, the order rotating."""
    names = list(servers)
    rows: list[list[float]] = []
    for r in range(repeats):
        got: dict[str, Any] = {}
        cpu: dict[str, float] = {}
        for which in names[r % len(names) :] + names[: r % len(names)]:
            run = one_at_a_time if which == "solo" else together
            c0 = cpu_seconds(servers[which].proc.pid)
            got[which] = run(servers[which].url, prompts, tokens, block)
            cpu[which] = (cpu_seconds(servers[which].proc.pid) - c0) / sum(len(s) for s in got[which][1])
        (s_rate, s_streams), (b_rate, b_streams) = got["solo"], got["batch"]
        alone = statistics.median(p95_gap(s) for s in s_streams)
        shared = statistics.median(p95_gap(s) for s in b_streams)
        row = [s_rate, b_rate, alone, shared, cpu["solo"], cpu["batch"]]
        rows.append(row + ([got["other"][0], cpu["other"]] if "other" in got else []))
    med = [statistics.median(r[k] for r in rows) for k in range(len(rows[0]))]
    other = f" | {med[6]:.1f} | {med[6] / med[0]:.2f}x" if len(med) > 6 else ""
    cpus = " / ".join(f"{c * 1000:.1f}" for c in [med[4], med[5]] + med[7:])
    print(
        f"| {len(prompts)} | {med[0]:.1f} | {med[1]:.1f} | {med[1] / med[0]:.2f}x | {med[2] * 1000:.1f} | "
        f"{med[3] * 1000:.1f} | {cpus}{other} |",
        flush=True,
    )
    for i, row in enumerate(rows):
        s, b, a, g = row[:4]
        also = f"; the other checkout {row[6]:.1f} tok/s ({row[6] / s:.2f}x)" if len(row) > 6 else ""
        print(
            f"  repeat {i + 1}: {s:.1f} vs {b:.1f} tok/s ({b / s:.2f}x), "
            f"p95 gap {a * 1000:.1f} vs {g * 1000:.1f} ms{also}"
        )


def wait_quiet(pids: list[int], limit_s: float = 120.0, quiet_cores: float = 0.05, quiet_s: float = 2.0) -> float:
    """Wait until every server process has used under `quiet_cores` of CPU for `quiet_s` in a row; the
    seconds waited. An idle server spends its first idle seconds tracing its warm-up steps (core.engine
    .kernels, ~6 CPU-seconds for the demo, on both cores): timed against the other server, that work
    would be counted against whichever ran meanwhile."""
    t0 = last_t = time.perf_counter()
    last = [cpu_seconds(p) for p in pids]
    calm = 0.0
    while calm < quiet_s and time.perf_counter() - t0 < limit_s:
        time.sleep(0.5)
        now, used = time.perf_counter(), [cpu_seconds(p) for p in pids]
        busy = max(u - v for u, v in zip(used, last)) / (now - last_t)
        calm = calm + (now - last_t) if busy < quiet_cores else 0.0
        last, last_t = used, now
    return time.perf_counter() - t0


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, all its threads (Linux /proc; 0 elsewhere)."""
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


LONG_PROMPT = "Tell me everything about the sea, the ships, the rivers and the rain. " * 12


def _first_token_after(url: str, prompt: str, block: str, out: dict[str, float]) -> None:
    """The request's time to first token as its client sees it ("ttft") and its prefill as the server timed
    it ("prefill": inside the batch, when rows decode)."""
    stats: dict = {}
    with client() as http:
        t0 = time.perf_counter()
        times = stream_times(http, url, prompt, 8, block, stats=stats)
    out["ttft"] = times[0] - t0
    out["prefill"] = float(stats.get("prefill_s", 0.0))


def _collect(url: str, prompt: str, tokens: int, block: str, into: list[float], rounds: list[int]) -> None:
    with client() as http:
        stream_times(http, url, prompt, tokens, block, into, rounds)


def bench_join(serve_args: list[str], tokens: int, repeats: int, block: str, checkout: str | None = None) -> None:
    """See the module docstring (`--join`)."""
    server = _server([*serve_args, "--parallel", "4", "--max-waiting", "4"], checkout)
    with server:
        prompts = PROMPTS[:3]
        together(server.url, prompts, 16, block)  # warm: kernels, and the long prompt's shapes
        _first_token_after(server.url, "warm " + LONG_PROMPT, block, {})
        wait_quiet([server.proc.pid])
        print(f"3 streams of {tokens} tokens, a {len(LONG_PROMPT)}-character prompt joins; block size {block}")
        print(
            "| repeat | p95 gap alone ms | p95 gap with the join ms | max gap with the join ms | "
            "newcomer TTFT alone ms | newcomer TTFT ms | TTFT alone + 2 rounds ms | "
            "newcomer prefill alone / joining ms (server's) | within? |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
        ttfts: list[float] = []
        targets: list[float] = []
        for r in range(repeats):
            with client() as http:
                alone = [stream_times(http, server.url, p, tokens, block) for p in prompts]
            solo: dict[str, float] = {}
            _first_token_after(server.url, f"{r} alone " + LONG_PROMPT, block, solo)
            streams: list[list[float]] = [[] for _ in prompts]
            rounds: list[list[int]] = [[] for _ in prompts]
            threads = [
                threading.Thread(target=_collect, args=(server.url, p, tokens, block, streams[i], rounds[i]))
                for i, p in enumerate(prompts)
            ]
            for t in threads:
                t.start()
            while min(len(s) for s in streams) < 8:
                time.sleep(0.005)
            joined: dict[str, float] = {}
            _first_token_after(server.url, f"{r} joins " + LONG_PROMPT, block, joined)
            for t in threads:
                t.join()
            # a round: the running streams' median time from one round's first token to the next's (their median
            # gap between arrivals, which earlier stops used, counts a round split over chunks as two: 10-16 ms
            # for rounds of 15-30 ms here)
            gaps = [g for s, rs in zip(streams, rounds) for g in round_gaps(s, rs)]
            round_s = statistics.median(gaps) if gaps else 0.0
            a95 = statistics.median(p95_gap(s) for s in alone)
            t95 = statistics.median(p95_gap(s) for s in streams)
            worst = max(b - a for s in streams for a, b in zip(s, s[1:]))
            target = solo["ttft"] + 2 * round_s
            ttfts.append(joined["ttft"])
            targets.append(target)
            print(
                f"| {r + 1} | {a95 * 1000:.1f} | {t95 * 1000:.1f} | {worst * 1000:.1f} | {solo['ttft'] * 1000:.1f} | "
                f"{joined['ttft'] * 1000:.1f} | {target * 1000:.1f} | "
                f"{solo['prefill'] * 1000:.1f} / {joined['prefill'] * 1000:.1f} | "
                f"{'yes' if joined['ttft'] <= target else 'no'} |",
                flush=True,
            )
        within = sum(t <= g for t, g in zip(ttfts, targets))
        print(
            f"newcomer TTFT within (its TTFT alone + 2 rounds) in {within} of {repeats} repeats; medians "
            f"{statistics.median(ttfts) * 1000:.1f} against {statistics.median(targets) * 1000:.1f} ms"
        )


# --- --load: many clients against a bounded server -------------------------------------------------


@dataclass
class LoadResult:
    """One request of the load run, as its client saw it."""

    client: int
    prompt: int
    sent: float
    status: int  # 200, or 429 (refused), or 0 (failed otherwise)
    answered: float = 0.0  # the status line (429) or the first token (200)
    done: float = 0.0
    ids: list[int] = field(default_factory=list)


def _request_ids(client: httpx.Client, url: str, prompt: str, tokens: int, out: LoadResult) -> None:
    """One greedy streamed request; fills `out` (its status, first-token and end times, token ids)."""
    body = _greedy_stream(prompt, tokens)
    with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        out.status = r.status_code
        if r.status_code != 200:
            out.answered = out.done = time.perf_counter()
            r.read()
            return
        for line in r.iter_lines():
            if line.startswith("data: {"):
                got = (json.loads(line[6:]).get("gemma_chat") or {}).get("tokens", ())
                if got and not out.ids:
                    out.answered = time.perf_counter()
                out.ids.extend(t["id"] for t in got)
    out.done = time.perf_counter()


def rss_bytes(pid: int) -> int:
    """Resident memory of a process (Linux /proc; 0 elsewhere)."""
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def run_load(
    url: str, clients: int, seconds: float, tokens: int, seed: int = 0, prompts: list[str] = PROMPTS
) -> list[LoadResult]:
    """`clients` threads, each sending requests one after another for `seconds` (a random prompt each; after
    a 429 it waits 0.2-1 s and sends again). Every request's result, in the order they were sent."""
    results: list[LoadResult] = []
    lock = threading.Lock()
    go = threading.Barrier(clients + 1)
    end = time.perf_counter() + seconds + 5.0  # the barrier and the first connections take a moment

    def run(c: int) -> None:
        rng = random.Random(seed * 1000 + c)
        with httpx.Client(timeout=600) as client:
            go.wait()
            t_end = time.perf_counter() + seconds
            while time.perf_counter() < t_end:
                i = rng.randrange(len(prompts))
                out = LoadResult(c, i, time.perf_counter(), 0)
                with lock:
                    results.append(out)
                try:
                    _request_ids(client, url, prompts[i], tokens, out)
                except httpx.HTTPError:
                    out.status, out.done = 0, time.perf_counter()
                if out.status == 429:
                    time.sleep(rng.uniform(0.2, 1.0))

    threads = [threading.Thread(target=run, args=(c,), daemon=True) for c in range(clients)]
    for t in threads:
        t.start()
    go.wait()
    for t in threads:
        t.join(timeout=max(1.0, end - time.perf_counter() + 600))
    return sorted(results, key=lambda r: r.sent)


def fifo_inversions(results: list[LoadResult], margin: float) -> int:
    """Pairs of accepted requests where one was sent `margin` s before the other and yet got its first token
    `margin` s after it (an overtaken request: starvation). Arrival order within `margin` is not compared."""
    ok = [r for r in results if r.status == 200 and r.answered]
    return sum(1 for a in ok for b in ok if b.sent - a.sent > margin and a.answered - b.answered > margin)


def _q(values: list[float], f: float) -> float:
    s = sorted(values)
    return s[min(int(f * len(s)), len(s) - 1)] if s else 0.0


def bench_load(
    serve_args: list[str],
    clients: int,
    seconds: float,
    tokens: int,
    parallel: int = 4,
    max_waiting: int = 16,
    checkout: str | None = None,
) -> dict[str, Any]:
    """The load scenario (see the module docstring): prints its report and returns its figures."""
    server = _server([*serve_args, "--parallel", str(parallel), "--max-waiting", str(max_waiting)], checkout)
    with server:
        pid = server.proc.pid
        alone: dict[int, list[int]] = {}
        with httpx.Client(timeout=600) as client:
            for i, p in enumerate(PROMPTS):  # each prompt alone first: the ids every accepted request must get
                out = LoadResult(-1, i, time.perf_counter(), 0)
                _request_ids(client, server.url, p, tokens, out)
                alone[i] = out.ids
        wait_quiet([pid])
        solo_rss = rss_bytes(pid)
        run_load(server.url, clients, min(10.0, seconds / 6), tokens, seed=99)  # warm: batch shapes, caches
        time.sleep(2.0)
        idle = rss_bytes(pid)
        t0 = time.perf_counter()
        results = run_load(server.url, clients, seconds, tokens)
        wall = time.perf_counter() - t0
        time.sleep(2.0)
        after = rss_bytes(pid)
    ok = [r for r in results if r.status == 200]
    busy = [r for r in results if r.status == 429]
    failed = [r for r in results if r.status not in (200, 429)]
    wrong = [r for r in ok if r.ids != alone[r.prompt]]
    refused_s = [r.answered - r.sent for r in busy]
    ttft = [r.answered - r.sent for r in ok]
    figures = {
        "requests": len(results),
        "accepted": len(ok),
        "refused": len(busy),
        "failed": len(failed),
        "wrong_ids": len(wrong),
        "tok_s": sum(len(r.ids) for r in ok) / wall,
        "refused_p50_ms": _q(refused_s, 0.5) * 1000,
        "refused_max_ms": max(refused_s, default=0.0) * 1000,
        "ttft_p50_s": _q(ttft, 0.5),
        "ttft_max_s": max(ttft, default=0.0),
        "fifo_inversions": fifo_inversions(results, 1.0),
        "rss_solo_mb": solo_rss / 2**20,
        "rss_idle_mb": idle / 2**20,
        "rss_after_mb": after / 2**20,
    }
    print(
        f"{clients} clients for {seconds:.0f} s against --parallel {parallel} --max-waiting {max_waiting}, "
        f"{tokens} greedy tokens per request (EOS ignored)"
    )
    print(
        "| requests | accepted | 429 | failed | ids != alone | tok/s | 429 after p50/max ms | "
        "accepted: first token p50/max s | FIFO inversions (1 s) | RSS after solo runs / idle / after MB |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    f = figures
    print(
        f"| {f['requests']} | {f['accepted']} | {f['refused']} | {f['failed']} | {f['wrong_ids']} | {f['tok_s']:.1f} | "
        f"{f['refused_p50_ms']:.0f} / {f['refused_max_ms']:.0f} | {f['ttft_p50_s']:.1f} / {f['ttft_max_s']:.1f} | "
        f"{f['fifo_inversions']} | {f['rss_solo_mb']:.0f} / {f['rss_idle_mb']:.0f} / {f['rss_after_mb']:.0f} |",
        flush=True,
    )
    return figures
