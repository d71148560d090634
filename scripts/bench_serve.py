"""What does `gemma-chat serve` add per token? (issue 17) And what do concurrent streams gain? (issue 25)

    .venv/bin/python scripts/bench_serve.py [--tokens 200] [--repeats 6] [--block-size 3] \
        [--model DIR --drafter DIR | --demo]
    .venv/bin/python scripts/bench_serve.py --demo --streams 4,8 --tokens 128 --repeats 3
        (scripts/_serve_streams.py: N streams at once against `serve --parallel` vs one at a time)
    .venv/bin/python scripts/bench_serve.py --demo --join --tokens 128 --repeats 3 [--checkout DIR]
        (a long prompt joins 3 running streams: their inter-token gaps, its time to first token)
    .venv/bin/python scripts/bench_serve.py --demo --load 32 --seconds 60 --tokens 48
        (32 clients against --parallel 4 --max-waiting 16: solo ids, 429s at once, FIFO, RSS)

Interleaved, ONE engine, greedy, EOS ignored, a fixed number of tokens. This process holds the
engine and serves it (core.frontends.server on uvicorn, 127.0.0.1, as `gemma-chat serve` does); the server
runs during both kinds of turn, so they differ only in who listens:
- direct: `Engine.chat` called in this process, a token counted when the engine emits it;
- served: a child process (the client, as an editor or the TUI with --connect would be) streams
  /v1/chat/completions with httpx2, a token counted when its SSE chunk is parsed.
Rates are (tokens after the first) / (first to last token). The transport latency per token is
measured directly too: when the engine emitted it (a wrapper around the served engine) to when the
client parsed it, on the one monotonic clock both processes share. "added per token" is
1/served - 1/direct: what the HTTP hop, JSON and SSE cost per token as the client sees it; the
served engine's own rate (from the final chunk's stats) tells server-side slowdown from transport.
The order of the two runs alternates from one repeat to the next. Default pairing: the pack's tiny
e-style checkpoints, where a token costs milliseconds, so the overhead is as large as it gets in
relative terms. `--fake` uses the scripted engine instead (no model, no MLX): the direct rate is
then Python emitting events, and the served rate is bounded by the server's own work per token.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # the checkpoint factory and the fake engine (tests/support)

from core.user.kernel_cache import use_private_kernel_cache  # noqa: E402

use_private_kernel_cache()  # before mlx runs anything: its compiled kernels go to gemma-chat's private folder

PROMPT = "Tell me a long story about the sea."


def _rate(n: int, first: float, last: float) -> float:
    return (n - 1) / (last - first) if n > 1 and last > first else 0.0


def direct(engine, settings) -> tuple[float, float]:
    from core.events import TokenEvent

    times: list[float] = []

    def on_event(ev) -> None:
        if isinstance(ev, TokenEvent):
            times.append(time.perf_counter())

    done = engine.chat([{"role": "user", "content": PROMPT}], settings, on_event).result()
    return _rate(len(times), times[0], times[-1]), done.stats.decode_tps


def served(client, url: str, settings) -> tuple[float, float, list[float]]:
    body = {
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": settings.max_tokens,
        "ignore_eos": True,
        "block_size": settings.block_size,
        "stream": True,
    }
    n, first, last, engine_tps = 0, 0.0, 0.0, 0.0
    arrivals: list[float] = []  # per token, time.perf_counter() (CLOCK_MONOTONIC: one clock for both processes)
    with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            ext = chunk.get("gemma_chat") or {}
            k = len(ext.get("tokens", ()))
            if k:
                now = time.perf_counter()
                first = first or now
                last = now
                n += k
                arrivals += [now] * k
            if "stats" in ext:
                engine_tps = ext["stats"]["decode_tps"]
    # tokens that arrive together count at their arrival: the same rule as the direct run's
    return _rate(n, first, last), engine_tps, arrivals


class _EmitTimes:
    """The engine, recording when it emitted each token of the latest turn (for the transport latency)."""

    def __init__(self, engine) -> None:
        self._engine = engine
        self.times: list[float] = []

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def chat(self, messages, settings, on_event):
        from core.events import TokenEvent

        times = self.times = []

        def stamped(ev) -> None:
            if isinstance(ev, TokenEvent):
                times.append(time.perf_counter())
            on_event(ev)

        return self._engine.chat(messages, settings, stamped)


def client_loop(url: str, tokens: int, block_size: int) -> int:
    """--client: one served turn per line on stdin, its (rate, engine rate) as JSON on stdout."""
    import httpx2 as httpx

    from core.settings import GenerationSettings

    settings = GenerationSettings(max_tokens=tokens, ignore_eos=True, block_size=block_size)
    with httpx.Client(timeout=300) as client:
        for _ in sys.stdin:
            print(json.dumps(served(client, url, settings)), flush=True)
    return 0


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--client", metavar="URL", help=argparse.SUPPRESS)
    p.add_argument("--model", default=str(ROOT / "tests/data/pack/models/e-style-target"))
    p.add_argument("--drafter", default=str(ROOT / "tests/data/pack/models/e-style-assistant"))
    p.add_argument("--demo", action="store_true")
    p.add_argument(
        "--fake",
        action="store_true",
        help="the scripted engine (no model): tokens as fast as Python emits them, so the rates show the "
        "server's own cost per token",
    )
    p.add_argument("--tokens", type=int, default=200)
    p.add_argument("--repeats", type=int, default=6)
    p.add_argument("--block-size", type=int, default=3)
    p.add_argument("--switch-interval", type=float, default=None, help="sys.setswitchinterval for the server")
    p.add_argument(
        "--streams",
        metavar="N,M",
        default=None,
        help="concurrent streams instead (issue 25): N and M greedy streams against `serve --parallel` vs one at a "
        "time (scripts/_serve_streams.py); --demo or --model/--drafter; block size from --stream-block",
    )
    p.add_argument("--stream-block", default="auto", metavar="K", help="--streams: block size, 'auto' or 1..16")
    p.add_argument("--join", action="store_true", help="a long prompt joins 3 running streams: their gaps, its TTFT")
    p.add_argument(
        "--load",
        metavar="CLIENTS",
        type=int,
        default=None,
        help="CLIENTS clients for --seconds against --parallel 4 --max-waiting 16 (scripts/_serve_streams.py)",
    )
    p.add_argument(
        "--compare", metavar="DIR", help="--streams: also another checkout's batched server, interleaved (before/after)"
    )
    p.add_argument("--seconds", type=float, default=60.0, help="--load: how long the clients send")
    p.add_argument(
        "--checkout", metavar="DIR", help="--streams/--join/--load: serve this checkout's code (before/after)"
    )
    args = p.parse_args()
    if args.client:
        return client_loop(args.client, args.tokens, args.block_size)
    if args.streams or args.join or args.load:
        from _kernels import build_kernels
        from _serve_streams import bench_join, bench_load, bench_streams

        serve_args = ["--demo"] if args.demo else ["--model", args.model, "--drafter", args.drafter]
        for tree in [args.checkout] + ([args.compare] if args.compare else []):  # the code each server runs
            build_kernels(serve_args, checkout=Path(tree) if tree else None)
        if args.load:
            bench_load(serve_args, args.load, args.seconds, args.tokens, checkout=args.checkout)
            return 0
        if args.join:
            bench_join(serve_args, args.tokens, args.repeats, args.stream_block, args.checkout)
            return 0
        counts = [int(n) for n in args.streams.split(",")]
        bench_streams(serve_args, counts, args.tokens, args.repeats, args.stream_block, args.checkout, args.compare)
        return 0

    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)
    from core.engine.contract import PairingSpec
    from core.engine.local import Engine
    from core.frontends.server import BackgroundServer, ServerConfig, create_app
    from core.settings import GenerationSettings

    if args.demo:
        from core.hub.demo import ensure_demo_pairing

        target, drafter = (str(x) for x in ensure_demo_pairing())
    else:
        target, drafter = args.model, args.drafter
    if args.fake:
        from support.fake_engine import FakeEngine

        engine = FakeEngine(replies=[" word" * (args.tokens + 10)])
        engine.load(PairingSpec("bench", "fake", "fake"), lambda e: None).result()
    else:
        engine = Engine()
        engine.load(PairingSpec("bench", target, drafter), None).result()
    settings = GenerationSettings(max_tokens=args.tokens, ignore_eos=True, block_size=args.block_size)
    stamped = _EmitTimes(engine)
    server = BackgroundServer(create_app(stamped, ServerConfig("bench")))
    url = server.__enter__()
    cmd = [
        sys.executable,
        __file__,
        "--client",
        url,
        "--tokens",
        str(args.tokens),
        "--block-size",
        str(args.block_size),
    ]
    child = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)

    def served_turn() -> tuple[float, float, list[float]]:
        child.stdin.write("go\n")
        child.stdin.flush()
        return tuple(json.loads(child.stdout.readline()))

    try:
        direct(engine, settings)  # warm both (compile, caches)
        served_turn()
        rows, latencies = [], []
        for i in range(args.repeats):
            order = ("direct", "served") if i % 2 == 0 else ("served", "direct")
            got = {}
            for which in order:
                got[which] = direct(engine, settings) if which == "direct" else served_turn()
            (d_rate, _), (s_rate, s_engine, arrivals) = got["direct"], got["served"]
            latencies += [a - e for a, e in zip(arrivals, stamped.times)]
            added_ms = (1 / s_rate - 1 / d_rate) * 1000 if s_rate and d_rate else float("nan")
            rows.append((d_rate, s_rate, s_engine, s_rate / d_rate, added_ms))
            print(
                f"repeat {i + 1}: direct {d_rate:7.1f} tok/s | served {s_rate:7.1f} tok/s "
                f"(its engine {s_engine:7.1f}) | ratio {s_rate / d_rate:.3f} | added {added_ms:+.3f} ms/token",
                flush=True,
            )
        med = lambda k: statistics.median(r[k] for r in rows)  # noqa: E731
        print(
            f"median of {len(rows)}: direct {med(0):.1f} tok/s, served {med(1):.1f} tok/s "
            f"(served engine {med(2):.1f}), ratio {med(3):.3f}, added {med(4):+.3f} ms/token"
        )
        latencies.sort()
        q = lambda f: latencies[min(int(f * len(latencies)), len(latencies) - 1)] * 1000  # noqa: E731
        print(
            f"engine emit -> client parsed, per token over {len(latencies)} tokens: "
            f"median {q(0.5):.2f} ms, p90 {q(0.9):.2f} ms, p99 {q(0.99):.2f} ms"
        )
        return 0
    finally:
        child.stdin.close()
        child.wait(timeout=30)
        server.__exit__(None, None, None)
        engine.close()


if __name__ == "__main__":
    raise SystemExit(main())
