"""`scripts/bench_serve.py --streams 4,8`: concurrent greedy streams against `gemma-chat serve` (issue 25).

Two real server processes on the same pairing: `--parallel 1` (requests one at a time, the old server)
and `--parallel N` (continuous batching). For each N, interleaved and repeated: the same N requests
(different prompts, greedy, EOS ignored, `--tokens` each) sent one after another to the first, and all
at once from N threads to the second. Aggregate tok/s = all tokens / wall time from the first request
to the last token (prefills included). Per stream, the inter-token gaps are the times between the
arrivals of consecutive tokens at the client (a round's tokens arrive together: a gap of 0 inside a
round), and its p95 is compared with the p95 of the same stream alone.

`--join` (bench_join): the latency of a long prompt joining running streams. Three streams run; once
each has its first tokens, a request with a long prompt arrives. Per running stream its p95 (and max)
inter-token gap against the same stream alone, and the newcomer's time to first token against its
time alone (its prefill) plus two rounds (a round: the running streams' median gap between arrivals).
`--checkout DIR` serves another checkout's code (e.g. main's, for a before/after run).
"""

from __future__ import annotations

import json
import statistics
import threading
import time
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


def stream_times(url: str, prompt: str, tokens: int, block_size: str, times: list[float] | None = None) -> list[float]:
    """One streamed request: the arrival time (perf_counter) of every token (appended to `times` as they come)."""
    body = {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": tokens,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
        "block_size": block_size if block_size == "auto" else int(block_size),
    }
    times = [] if times is None else times
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: {"):
                k = len((json.loads(line[6:]).get("gemma_chat") or {}).get("tokens", ()))
                now = time.perf_counter()
                times.extend([now] * k)
    return times


def p95_gap(times: list[float]) -> float:
    gaps = sorted(b - a for a, b in zip(times, times[1:]))
    return gaps[min(int(0.95 * len(gaps)), len(gaps) - 1)] if gaps else 0.0


def one_at_a_time(url: str, prompts: list[str], tokens: int, block: str) -> tuple[float, list[list[float]]]:
    t0 = time.perf_counter()
    streams = [stream_times(url, p, tokens, block) for p in prompts]
    return sum(len(s) for s in streams) / (streams[-1][-1] - t0), streams


def together(url: str, prompts: list[str], tokens: int, block: str) -> tuple[float, list[list[float]]]:
    streams: list[list[float]] = [[] for _ in prompts]
    go = threading.Barrier(len(prompts) + 1)

    def run(i: int) -> None:
        go.wait()
        streams[i] = stream_times(url, prompts[i], tokens, block)

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
    serve_args: list[str], counts: list[int], tokens: int, repeats: int, block: str, checkout: str | None = None
) -> None:
    biggest = max(counts)
    solo = _server([*serve_args, "--parallel", "1", "--max-waiting", str(biggest)], checkout)
    batched = _server([*serve_args, "--parallel", str(biggest), "--max-waiting", str(biggest)], checkout)
    with solo, batched:
        prompts = [PROMPTS[i % len(PROMPTS)] for i in range(biggest)]
        one_at_a_time(solo.url, prompts[:2], 16, block)  # warm both: kernels, caches
        together(batched.url, prompts, 16, block)
        print(f"{tokens} tokens per stream, greedy, EOS ignored, block size {block}; {repeats} repeats, interleaved")
        print("| streams | one at a time tok/s | together tok/s | ratio | p95 gap alone ms | p95 gap together ms |")
        print("|---|---|---|---|---|---|")
        for n in counts:
            rows: list[tuple[float, float, float, float]] = []
            for r in range(repeats):
                order = ("solo", "batch") if r % 2 == 0 else ("batch", "solo")
                got: dict[str, Any] = {}
                for which in order:
                    if which == "solo":
                        got[which] = one_at_a_time(solo.url, prompts[:n], tokens, block)
                    else:
                        got[which] = together(batched.url, prompts[:n], tokens, block)
                (s_rate, s_streams), (b_rate, b_streams) = got["solo"], got["batch"]
                alone = statistics.median(p95_gap(s) for s in s_streams)
                shared = statistics.median(p95_gap(s) for s in b_streams)
                rows.append((s_rate, b_rate, alone, shared))
            med = [statistics.median(r[k] for r in rows) for k in range(4)]
            print(
                f"| {n} | {med[0]:.1f} | {med[1]:.1f} | {med[1] / med[0]:.2f}x | {med[2] * 1000:.1f} | "
                f"{med[3] * 1000:.1f} |",
                flush=True,
            )
            for i, (s, b, a, g) in enumerate(rows):
                gaps = f"p95 gap {a * 1000:.1f} vs {g * 1000:.1f} ms"
                print(f"  repeat {i + 1}: {s:.1f} vs {b:.1f} tok/s ({b / s:.2f}x), {gaps}")


LONG_PROMPT = "Tell me everything about the sea, the ships, the rivers and the rain. " * 12


def _first_token_after(url: str, prompt: str, block: str, out: dict[str, float]) -> None:
    t0 = time.perf_counter()
    times = stream_times(url, prompt, 8, block)
    out["ttft"] = times[0] - t0


def _collect(url: str, prompt: str, tokens: int, block: str, into: list[float]) -> None:
    stream_times(url, prompt, tokens, block, into)


def bench_join(serve_args: list[str], tokens: int, repeats: int, block: str, checkout: str | None = None) -> None:
    """See the module docstring (`--join`)."""
    server = _server([*serve_args, "--parallel", "4", "--max-waiting", "4"], checkout)
    with server:
        prompts = PROMPTS[:3]
        together(server.url, prompts, 16, block)  # warm: kernels, and the long prompt's shapes
        _first_token_after(server.url, "warm " + LONG_PROMPT, block, {})
        print(f"3 streams of {tokens} tokens, a {len(LONG_PROMPT)}-character prompt joins; block size {block}")
        print(
            "| repeat | p95 gap alone ms | p95 gap with the join ms | max gap with the join ms | "
            "newcomer TTFT alone ms | newcomer TTFT ms | TTFT alone + 2 rounds ms |"
        )
        print("|---|---|---|---|---|---|---|")
        for r in range(repeats):
            alone = [stream_times(server.url, p, tokens, block) for p in prompts]
            solo: dict[str, float] = {}
            _first_token_after(server.url, f"{r} alone " + LONG_PROMPT, block, solo)
            streams: list[list[float]] = [[] for _ in prompts]
            threads = [
                threading.Thread(target=_collect, args=(server.url, p, tokens, block, streams[i]))
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
            gaps = [b - a for s in streams for a, b in zip(s, s[1:]) if b > a]
            round_s = statistics.median(gaps) if gaps else 0.0
            a95 = statistics.median(p95_gap(s) for s in alone)
            t95 = statistics.median(p95_gap(s) for s in streams)
            worst = max(b - a for s in streams for a, b in zip(s, s[1:]))
            print(
                f"| {r + 1} | {a95 * 1000:.1f} | {t95 * 1000:.1f} | {worst * 1000:.1f} | {solo['ttft'] * 1000:.1f} | "
                f"{joined['ttft'] * 1000:.1f} | {(solo['ttft'] + 2 * round_s) * 1000:.1f} |",
                flush=True,
            )
