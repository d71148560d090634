"""Do tokens reach the screen as fast as the engine makes them? (issue "Chat screen")

    .venv/bin/python scripts/bench_ui.py [--tokens 600] [--repeats 8] [--block-size auto] [--floor] \
        [--model DIR --drafter DIR]
    .venv/bin/python scripts/bench_ui.py --ui-cost [--round-s 0.02]

Interleaved, on the same engine and pairing (default: the demo pairing):
- headless: `Engine.chat` alone, counting TokenEvents as the engine emits them;
- UI: the real `GemmaChatApp` driven by Textual's `run_test` (headless terminal), the same
  prompt sent through the chat screen; a token counts when the screen's drain has applied it
  to the conversation widget (`ChatScreen._append` returned).
Both rates are (tokens after the first) / (first to last token), EOS ignored, fixed max tokens.
Also shown: the engine's own rate while the UI runs (from the bridge's push stamps), which
tells contention (the engine slowed down) from drain latency, and the UI thread's share of a core
between the first and the last token on screen. `--floor` adds a third run to each repeat: a bare
Textual app that shows only the token view, drained the same way: what painting at the drain
rate costs the engine on this machine whatever the rest of the UI does. The order of the runs
rotates from one repeat to the next.
Single runs of the demo pairing vary by +-20 % on a shared 2-core machine (an occasional run is
half as fast), so the figure to read is the median of the per-repeat ratios over many repeats.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # tests/support: factory, fake engine

from core.user.kernel_cache import use_private_kernel_cache  # noqa: E402

use_private_kernel_cache()  # before mlx runs anything: its compiled kernels go to gemma-chat's private folder

PROMPT = "Tell me a long story about the sea."


def _rate(times: list[float], counts: list[int] | None = None) -> float:
    """(tokens after the first batch) / (first to last arrival)."""
    if len(times) < 2:
        return 0.0
    counts = counts or [1] * len(times)
    span = times[-1] - times[0]
    return (sum(counts) - counts[0]) / span if span > 0 else 0.0


def headless_run(engine, settings) -> float:
    from core.events import TokenEvent

    stamps: list[float] = []

    def on_event(e) -> None:
        if isinstance(e, TokenEvent):
            stamps.append(time.perf_counter())

    engine.reset().result()
    done = engine.chat([{"role": "user", "content": PROMPT}], settings, on_event).result()
    assert done.error is None, done.error
    assert len(stamps) == settings.max_tokens, (len(stamps), settings.max_tokens)
    return _rate(stamps)


async def ui_run(engine, spec, settings) -> tuple[float, float, float]:
    """(screen rate, engine rate while the UI ran, the UI thread's CPU share while streaming)."""
    from app.tui.app import GemmaChatApp
    from core.events import TokenEvent

    engine.reset().result()
    app = GemmaChatApp(engine, spec, settings)
    applied: list[float] = []
    counts: list[int] = []
    async with app.run_test(headless=True, size=(120, 40)) as pilot:
        chat = app.chat
        while not app.session.loaded:
            if app.session.load_error:
                raise RuntimeError(app.session.load_error)
            await pilot.pause(0.05)
        original = chat._append
        pushed: list[float] = []

        cpu_at: list[float] = []

        def timed_append(tokens, first_t, last_t):
            original(tokens, first_t, last_t)
            applied.append(time.perf_counter())
            cpu_at.append(time.thread_time())
            counts.append(len(tokens))

        chat._append = timed_append
        listener = chat.bridge.listener

        def stamping_listener(turn):
            inner = listener(turn)

            def on_event(e):
                if isinstance(e, TokenEvent):
                    pushed.append(time.perf_counter())
                inner(e)

            return on_event

        chat.bridge.listener = stamping_listener
        assert chat.send(PROMPT)
        while chat.generating:
            await asyncio.sleep(0.05)  # not pilot.pause: it would force extra screen updates
        # the UI thread's share of a core from the first token on screen to the last
        ui_cpu = (cpu_at[-1] - cpu_at[0]) / (applied[-1] - applied[0])
        chat.bridge.listener = listener
    assert sum(counts) == settings.max_tokens, (sum(counts), settings.max_tokens)
    return _rate(applied, counts), _rate(pushed), ui_cpu


async def floor_run(engine, settings) -> tuple[float, float]:
    """The floor any Textual UI pays here: a bare Textual app whose only widget is the chat's token
    view (`TokenText`, in a scrolling container), fed through the same `EventBridge` drained at the
    same `DRAIN_HZ`; no panels, prompt, footer or reply chrome. (rate on screen, the UI thread's
    CPU share while streaming)."""
    from textual.app import App
    from textual.containers import VerticalScroll

    from app.tui.bridge import DRAIN_HZ, EventBridge
    from app.tui.widgets.conversation import TokenText
    from core.events import TokenEvent

    bridge = EventBridge()
    applied: list[float] = []
    counts: list[int] = []
    cpu_at: list[float] = []

    class Floor(App):
        def compose(self):
            with VerticalScroll():
                yield TokenText()

        def on_mount(self) -> None:
            self.set_interval(1 / DRAIN_HZ, self.drain)

        def drain(self) -> None:
            tokens = [s.event for s in bridge.drain() if isinstance(s.event, TokenEvent)]
            if tokens:
                self.query_one(TokenText).append_tokens(tokens)
                applied.append(time.perf_counter())
                cpu_at.append(time.thread_time())
                counts.append(len(tokens))

    engine.reset().result()
    app = Floor()
    async with app.run_test(headless=True, size=(120, 40)):
        fut = engine.chat([{"role": "user", "content": PROMPT}], settings, bridge.listener(1))
        while not fut.done() or bridge.pending():
            await asyncio.sleep(0.05)
        assert fut.result().error is None
        await asyncio.sleep(2 / DRAIN_HZ)  # the last drain
    assert sum(counts) == settings.max_tokens, (sum(counts), settings.max_tokens)
    return _rate(applied, counts), (cpu_at[-1] - cpu_at[0]) / (applied[-1] - applied[0])


async def ui_cost_run(tokens: int, round_s: float, size: tuple[int, int]) -> tuple[float, float, float]:
    """The UI's own cost, without an engine to share the CPU with: the scripted fake engine streams a
    long reply (paragraphs of words, ~2.6 tokens a round, sleeping `round_s` per round) into the
    real chat screen. (idle UI CPU share, UI CPU share while streaming, tokens/s)."""
    from support.fake_engine import FakeEngine, PairingSpec

    from app.tui.app import GemmaChatApp
    from core.settings import GenerationSettings

    words = ("the", "sea", "was", "calm", "and", "a", "ship", "sailed", "into", "night,", "while", "stars")
    reply = "".join(" " + words[(i * 7) % len(words)] + ("\n\n" if i % 40 == 39 else "") for i in range(tokens))
    engine = FakeEngine(replies=[reply], delay_s=round_s)
    app = GemmaChatApp(
        engine, PairingSpec("fake (scripted)", "t", "d"), GenerationSettings(max_tokens=tokens, ignore_eos=True)
    )
    try:
        async with app.run_test(headless=True, size=size):
            chat = app.chat
            while not app.session.loaded:
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)
            cpu0, wall0 = time.thread_time(), time.perf_counter()
            await asyncio.sleep(2.0)
            idle = (time.thread_time() - cpu0) / (time.perf_counter() - wall0)
            cpu0, wall0 = time.thread_time(), time.perf_counter()
            assert chat.send("go")
            while chat.generating:
                await asyncio.sleep(0.05)
            wall = time.perf_counter() - wall0
            busy = (time.thread_time() - cpu0) / wall
    finally:
        engine.close()
    return idle, busy, len(engine.tokens) / wall


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, help="per run (default 600; --ui-cost: 1200)")
    p.add_argument("--repeats", type=int, help="interleaved pairs (default 8; --ui-cost: 3 runs)")
    p.add_argument("--block-size", default="auto")
    p.add_argument("--no-draft", action="store_true")
    p.add_argument("--model")
    p.add_argument("--drafter")
    p.add_argument(
        "--ui-cost",
        action="store_true",
        help="measure only the UI thread's CPU share, with the scripted fake engine (no MLX): "
        "a steadier figure than the ratio on a noisy machine",
    )
    p.add_argument("--round-s", type=float, default=0.02, help="--ui-cost: seconds per fake round")
    p.add_argument(
        "--floor",
        action="store_true",
        help="also run, interleaved, a bare Textual app showing only the token view at the same "
        "drain rate: what any Textual UI costs the engine on this machine",
    )
    a = p.parse_args()

    if a.ui_cost:
        tokens = a.tokens or 1200
        results = [asyncio.run(ui_cost_run(tokens, a.round_s, (120, 40))) for _ in range(a.repeats or 3)]
        for idle, busy, rate in results:
            print(
                f"fake engine {rate:.0f} tok/s | UI thread CPU idle {idle:.1%}, streaming {busy:.1%}", file=sys.stderr
            )
        print(
            f"UI thread CPU while streaming ~{statistics.median(r[2] for r in results):.0f} tok/s "
            f"(120x40, {tokens} tokens): median {statistics.median(r[1] for r in results):.1%} of one core "
            f"(idle {statistics.median(r[0] for r in results):.1%})"
        )
        return 0

    from core.engine.contract import PairingSpec
    from core.engine.local import Engine
    from core.settings import GenerationSettings

    if a.model:
        spec = PairingSpec(Path(a.model).name, a.model, None if a.no_draft else a.drafter)
    else:
        from core.hub.demo import ensure_demo_pairing

        target, drafter = ensure_demo_pairing()
        spec = PairingSpec("demo (random weights)", str(target), None if a.no_draft else str(drafter), demo=True)
    a.tokens, a.repeats = a.tokens or 600, a.repeats or 8
    block = a.block_size if a.block_size == "auto" else int(a.block_size)
    settings = GenerationSettings(
        max_tokens=a.tokens, ignore_eos=True, block_size=block, drafter_enabled=not a.no_draft
    )
    engine = Engine()
    try:
        engine.load(spec, None).result()
        headless_run(engine, GenerationSettings(max_tokens=16, ignore_eos=True))  # warm-up
        heads, screens, under_ui, cpus, floors, floor_cpus = [], [], [], [], [], []
        for rep in range(a.repeats):
            # the order within a repeat rotates: the machine drifts in phases of seconds
            runs = ["headless", "ui"] + (["floor"] if a.floor else [])
            runs = runs[rep % len(runs) :] + runs[: rep % len(runs)]
            for run in runs:
                if run == "headless":
                    heads.append(headless_run(engine, settings))
                elif run == "floor":
                    rate, cpu = asyncio.run(floor_run(engine, settings))
                    floors.append(rate)
                    floor_cpus.append(cpu)
                else:
                    screen, engine_rate, cpu = asyncio.run(ui_run(engine, spec, settings))
            screens.append(screen)
            cpus.append(cpu)
            under_ui.append(engine_rate)
            print(
                f"repeat {rep + 1}: headless {heads[-1]:.1f} tok/s | on screen {screen:.1f} tok/s "
                f"| engine under the UI {engine_rate:.1f} tok/s | UI thread CPU {cpu:.0%}"
                + (f" | bare Textual floor {floors[-1]:.1f} tok/s, UI CPU {floor_cpus[-1]:.0%}" if floors else ""),
                file=sys.stderr,
                flush=True,
            )
    finally:
        engine.close()
    h, s, u = statistics.median(heads), statistics.median(screens), statistics.median(under_ui)
    ratios = sorted(x / y for x, y in zip(screens, heads))
    paired = statistics.median(ratios)
    print(f"pairing {spec.name} | {a.tokens} tokens | block {a.block_size} | median of {a.repeats} interleaved")
    print(f"headless engine     {h:8.1f} tok/s")
    print(f"engine under the UI {u:8.1f} tok/s  ({u / h:.3f}x headless)")
    print(f"tokens on screen    {s:8.1f} tok/s  ({s / h:.3f}x headless)")
    print(
        f"median of the per-repeat ratios (screen / headless): {paired:.3f}  "
        f"(all: {' '.join(f'{r:.2f}' for r in ratios)})"
    )
    print(f"UI thread CPU while streaming {statistics.median(cpus):.0%} of one core")
    if floors:
        f = statistics.median(floors)
        fr = sorted(x / y for x, y in zip(floors, heads))
        print(
            f"bare Textual floor  {f:8.1f} tok/s  ({f / h:.3f}x headless; median of per-repeat ratios "
            f"{statistics.median(fr):.3f}; all: {' '.join(f'{r:.2f}' for r in fr)}) | its UI thread CPU "
            f"{statistics.median(floor_cpus):.0%} of one core"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
