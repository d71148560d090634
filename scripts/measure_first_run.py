"""Time what a new user waits for on a fresh machine: the first reply and every later first-of-a-kind prompt.

    .venv/bin/python scripts/measure_first_run.py [--repeats 1] [--warm-cache] [--no-prepare]
    .venv/bin/python scripts/measure_first_run.py --pause-ab 4 | --idle-trace 20 | --compare

Each repeat runs in a fresh child process with an EMPTY kernel cache (a new GEMMA_CHAT_CACHE_DIR), loads the
demo pairing as the app does, then, like a user:

  hello      "Hello" right after the load (the welcome screen's first prompt)
  second     a second-turn question
  image      a prompt with an image
  image 2    a prompt with another image, in a new chat (what an image costs once it is not the first)
  block 2    the next turn at block size 2 (a block-size change)
  sampled    a turn at temperature 0.8

then waits for the kernels to be ready and runs every kind again in a new chat (the first compiled turn of
each kind: what a later first-of-a-kind prompt costs once the kernels are built),

and prints each turn's TTFT and decode tok/s, the time the engine spent preparing kernels, and how many
kernels the cache holds at the end. `--read-s S` waits S seconds after the load before the first prompt
(a user reading the welcome screen; 0 = Enter at once, the worst case). `--warm-cache` reuses one cache
folder across repeats (the second start on a machine). `--no-prepare` skips the engine's kernel
preparation: kernels compile on first use, as before it existed. `--compare [--repeats N]` instead measures
what compiling buys: decode tok/s with compilation on and off, interleaved, on the demo and the reference
pack's pairings (float32 there, where the CPU backend compiles the layer pieces), drafter on and off.

Figures on the project's shared 2-core Linux CPU (load average 7-11 from other work, so absolute times are
loose; one repeat each), demo pairing, empty kernel cache, Enter at once:

    before (compile on first use)       TTFT hello 127.5 s (75 kernels built in all), second turn 4.5 s,
                                        first sampled turn 4.9 s, first image 2.8 s
    after  (prepared in a child)        TTFT hello 0.26 s, second 0.21 s, block 2 0.21 s, sampled 0.05 s
                                        (uncompiled, while the child built 48 kernels in 143 s); once ready,
                                        each kind again: hello 0.20, second 0.18, block 2 0.16, sampled 0.13 s
    --compare (median decode tok/s, compiled / uncompiled, drafter on): demo 59.2 / 33.5 (1.77x),
                                        e-style 1.81x, dense-style 2.23x, moe-style 1.37x, unified-style 2.35x

The first image turn takes 5-10 s either way on that machine (vision tower and a ~300-token prefill; no
kernel is built for it).

The `kernels` column counts the kernels that appeared in the cache during each turn (the child's too while it
prepares). First image vs second image (issue 23), demo, empty cache, load average 8-10 from other work:

    before (warm-up plan without an image step; child running during replies)
      image 14.59 s, image 2 13.56 s while preparing; image 6.66 s, image 2 9.85 s once ready; 48 kernels
    after (an image step in the plan; the child stopped during each reply)
      image  9.86 s, image 2 13.98 s while preparing (0 kernels built during any turn: the child was
      stopped); image 5.78 s, image 2 9.07 s once ready (0 kernels built by any turn); 48 kernels

So a first image costs what a later one does: no image kernel is built on first use (also checked on the
e-style and unified-style pack pairings: 0 kernels built by image prompts after the warm-up plan); its time is
the tower over ~2,500 patches and the ~280-token prefill. `--pause-ab N` interleaves image turns during the
preparation with the child stopped and running: on that machine, loaded by a dozen other processes, the
child is one of many, so stopping it gained little (median TTFT 6.29 s stopped vs 6.42 s running, 1.02x);
on an otherwise idle 2-core machine it is the reply's only competitor.

`--idle-trace N` (a second start: compiled, the warm-up steps traced between requests) sends N short replies,
one a second, while the steps are traced, and reports how long each waited before its prefill began. One
step runs up to 8 s there (block size 15: 32 tokens); a request now cuts it short at its next round:

    preempt=False: wait before the reply began, median 1.13 s, max 7.57 s over 20 replies
    preempt=True:  wait before the reply began, median 0.03 s, max 2.11 s over 20 replies
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
IMAGE = ROOT / "assets" / "images" / "chart.png"
IMAGE_2 = ROOT / "assets" / "images" / "landscape.jpg"  # a second, different image: its own encoding


def child(read_s: float, prepare: bool) -> None:
    sys.path.insert(0, str(ROOT))
    from core.user.kernel_cache import use_private_kernel_cache

    folder = use_private_kernel_cache().folder  # before mlx, as every entry point
    from core.engine.local import Engine
    from core.engine.pairings import demo_spec
    from core.events import KernelProgress, TurnDone
    from core.settings import GenerationSettings

    t0 = time.perf_counter()
    engine = Engine(kernels="background" if prepare else "first-use")
    progress: list[float] = []

    def on_load(ev: object) -> None:
        if isinstance(ev, KernelProgress) and ev.done:
            progress.append(time.perf_counter() - t0)

    spec = demo_spec()
    engine.load(spec, on_load).result()
    load_s = time.perf_counter() - t0
    time.sleep(read_s)
    rows = []

    def turn(name: str, messages: list[dict], **kw: object) -> None:
        done: list[TurnDone] = []
        settings = GenerationSettings(max_tokens=48, **kw)  # type: ignore[arg-type]
        before = kernel_count(folder) if folder is not None else 0
        t = time.perf_counter()
        engine.chat(messages, settings, lambda e: done.append(e) if isinstance(e, TurnDone) else None).result()
        wall = time.perf_counter() - t
        s = done[-1].stats
        built = kernel_count(folder) - before if folder is not None else 0  # compiled by this turn (or the child)
        rows.append(
            {"turn": name, "ttft_s": s.ttft_s, "wall_s": wall, "decode_tps": s.decode_tps, "tokens": s.tokens}
            | {"built": built}
        )

    hello = [{"role": "user", "content": "Hello"}]
    second = hello + [{"role": "assistant", "content": "Hi!"}, {"role": "user", "content": "What is gemma-chat?"}]
    image = [{"type": "image", "path": str(IMAGE)}, {"type": "text", "text": "What is this?"}]
    image_2 = [{"type": "image", "path": str(IMAGE_2)}, {"type": "text", "text": "What is this?"}]

    def kinds(tag: str) -> None:
        turn(f"hello{tag}", hello)
        turn(f"second{tag}", second)
        turn(f"image{tag}", [{"role": "user", "content": image}])
        engine.reset().result()  # a new chat: the second image's turn prefills from scratch as the first did
        turn(f"image 2{tag}", [{"role": "user", "content": image_2}])
        turn(f"block 2{tag}", [{"role": "user", "content": "What is speculative decoding?"}], block_size=2)
        turn(f"sampled{tag}", [{"role": "user", "content": "Who are you?"}], temperature=0.8, seed=1)
        engine.reset().result()

    kinds("")
    deadline = time.perf_counter() + 600
    while prepare and not progress and time.perf_counter() < deadline:
        time.sleep(0.5)
    kinds(" (after)")  # every kind again, in a new chat: compiled now, each for the first time
    print(json.dumps({"load_s": load_s, "prepared_at_s": progress[-1] if progress else None, "rows": rows}), flush=True)
    os._exit(0)  # as the engine's own processes: MLX 0.32 may abort at exit after compiled code ran on a thread


def pause_ab(pairs: int) -> None:
    """While the child prepares the kernels (empty cache): image turns with the child stopped during each reply
    (KernelPreparer.pause) and left running, interleaved in one process, each in a new chat."""
    sys.path.insert(0, str(ROOT))
    from core.user.kernel_cache import use_private_kernel_cache

    use_private_kernel_cache()
    import statistics

    from core.engine import kernels as kernels_mod
    from core.engine.local import Engine
    from core.engine.pairings import demo_spec
    from core.events import TurnDone
    from core.settings import GenerationSettings

    engine = Engine(kernels="background")
    engine.load(demo_spec(), None).result()
    ttft: dict[bool, list[float]] = {True: [], False: []}
    for i in range(2 * pairs):
        paused = i % 4 in (0, 3)  # on, off, off, on, ...: neither side always goes first
        kernels_mod.PAUSABLE = paused
        content = [{"type": "image", "path": str(IMAGE if i % 2 else IMAGE_2)}, {"type": "text", "text": "What?"}]
        got: list[TurnDone] = []
        msgs = [{"role": "user", "content": content}]
        engine.chat(
            msgs,
            GenerationSettings(max_tokens=16),
            lambda e, got=got: got.append(e) if isinstance(e, TurnDone) else None,
        ).result()
        engine.reset().result()
        state = engine._kernels.state if engine._kernels is not None else "?"
        print(
            f"  image turn {i + 1}: child {'stopped' if paused else 'running'}, TTFT {got[-1].stats.ttft_s:6.2f} s"
            f" (kernels {state})",
            flush=True,
        )
        ttft[paused].append(got[-1].stats.ttft_s)
    on, off = statistics.median(ttft[True]), statistics.median(ttft[False])
    print(f"median image TTFT while preparing: child stopped {on:.2f} s, running {off:.2f} s ({off / on:.2f}x)")
    os._exit(0)


def idle_trace(preempt: bool, n: int) -> None:
    """Prepared kernels (a first run in this cache), then `n` short replies, one a second, while the engine
    traces the warm-up steps at idle time: how long each waited before its prefill began (submit to start),
    with a request cutting the running step short (`preempt`) or waiting for it."""
    sys.path.insert(0, str(ROOT))
    from core.user.kernel_cache import use_private_kernel_cache

    use_private_kernel_cache()
    import statistics

    from core.engine.local import Engine
    from core.engine.pairings import demo_spec
    from core.events import KernelProgress, TurnDone
    from core.settings import GenerationSettings

    done_at: list[float] = []
    engine = Engine(kernels="background")
    engine.load(
        demo_spec(), lambda e: done_at.append(1.0) if isinstance(e, KernelProgress) and e.done else None
    ).result()
    if engine._kernels is not None and engine._kernels.state == "preparing":
        while not done_at:
            time.sleep(0.5)
        engine.close()
        engine = Engine(kernels="background")  # the second start: compiled, the steps traced at idle time
        engine.load(demo_spec(), None).result()
    if not preempt:
        engine._warm_cancel.set = lambda: None  # type: ignore[method-assign]
    waits = []
    for _ in range(n):
        time.sleep(1.0)
        got: list[TurnDone] = []
        t = time.perf_counter()
        msgs = [{"role": "user", "content": "Hello"}]
        settings = GenerationSettings(max_tokens=4)
        engine.chat(msgs, settings, lambda e, got=got: got.append(e) if isinstance(e, TurnDone) else None).result()
        s = got[-1].stats
        waits.append(time.perf_counter() - t - s.ttft_s - s.decode_s)
        engine.reset().result()
    busy = engine._kernels.busy if engine._kernels is not None else False
    print(
        f"preempt={preempt}: wait before the reply began, median {statistics.median(waits):.2f} s, "
        f"max {max(waits):.2f} s over {n} replies (steps left to trace: {busy})",
        flush=True,
    )
    os._exit(0)


def compare(repeats: int, pairings: list[tuple[str, str, str | None]]) -> None:
    """Decode tok/s with compilation on and off, interleaved in one process (both warmed first), per pairing."""
    sys.path.insert(0, str(ROOT))
    from core.user.kernel_cache import use_private_kernel_cache

    use_private_kernel_cache()
    import statistics

    import mlx.core as mx

    from core.engine.contract import PairingSpec
    from core.engine.local import Engine
    from core.events import TurnDone
    from core.settings import GenerationSettings

    prompts = [
        "Hi!",
        "What is speculative decoding?",
        "What is gemma-chat?",
        "Write a Python function that reverses a string.",
    ]
    print(f"{'pairing':<16} {'drafter':<8} {'compiled':>9} {'uncompiled':>11} {'ratio':>6}   (median decode tok/s)")
    for name, target, drafter in pairings:
        engine = Engine(kernels="first-use")
        engine.load(PairingSpec(name=name, target=target, drafter=drafter), None).result()
        for draft in (True, False):
            rates: dict[bool, list[float]] = {True: [], False: []}
            for r in range(repeats + 1):  # the first round warms both modes, untimed
                for compiled in (True, False) if r % 2 else (False, True):
                    (mx.enable_compile if compiled else mx.disable_compile)()
                    for p in prompts:
                        got: list[TurnDone] = []
                        settings = GenerationSettings(max_tokens=96, ignore_eos=True, drafter_enabled=draft)
                        msgs = [{"role": "user", "content": p}]
                        engine.chat(
                            msgs, settings, lambda e, got=got: got.append(e) if isinstance(e, TurnDone) else None
                        ).result()
                        if r:
                            rates[compiled].append(got[-1].stats.decode_tps)
            on, off = statistics.median(rates[True]), statistics.median(rates[False])
            print(f"{name:<16} {'on' if draft else 'off':<8} {on:9.1f} {off:11.1f} {on / off:6.2f}", flush=True)
        mx.enable_compile()
        engine.close()
    os._exit(0)


def kernel_count(cache: Path) -> int:
    return sum(1 for _ in cache.rglob("*.so"))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--read-s", type=float, default=0.0)
    p.add_argument("--warm-cache", action="store_true")
    p.add_argument("--no-prepare", action="store_true")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument(
        "--compare", action="store_true", help="decode tok/s compiled vs uncompiled, interleaved (demo + pack)"
    )
    p.add_argument(
        "--pause-ab", type=int, default=0, help="N pairs of image turns during preparation, child stopped/running"
    )
    p.add_argument("--idle-trace", type=int, default=0, help="N replies while the steps are traced at idle time")
    args = p.parse_args()
    if args.idle_trace:
        cache = Path(tempfile.mkdtemp(prefix="gemma-chat-first-run-"))
        env = {**os.environ, "GEMMA_CHAT_CACHE_DIR": str(cache)}
        for preempt in (False, True):
            code = f"import sys; sys.argv = ['x']; sys.path.insert(0, {str(ROOT)!r}); import runpy; "
            code += f"runpy.run_path({__file__!r})['idle_trace']({preempt}, {args.idle_trace})"
            subprocess.call([sys.executable, "-c", code], env=env)
        return 0
    if args.pause_ab:
        cache = Path(tempfile.mkdtemp(prefix="gemma-chat-first-run-"))
        env = {**os.environ, "GEMMA_CHAT_CACHE_DIR": str(cache)}
        code = f"import sys; sys.argv = ['x']; sys.path.insert(0, {str(ROOT)!r}); "
        code += f"import runpy; m = runpy.run_path({__file__!r}); m['pause_ab']({args.pause_ab})"
        return subprocess.call([sys.executable, "-c", code], env=env)
    if args.compare:
        from core.hub.demo import ensure_demo_pairing

        sys.path.insert(0, str(ROOT))
        target, drafter = ensure_demo_pairing()
        pack = ROOT / "tests" / "data" / "pack" / "models"
        pairings = [("demo", str(target), str(drafter))]
        for fam in ("e-style", "dense-style", "moe-style", "unified-style"):
            pairings.append((fam, str(pack / f"{fam}-target"), str(pack / f"{fam}-assistant")))
        compare(max(args.repeats, 2), pairings)
        return 0
    if args.child:
        child(args.read_s, not args.no_prepare)
        return 0
    shared = Path(tempfile.mkdtemp(prefix="gemma-chat-first-run-"))
    for r in range(args.repeats):
        cache = shared if args.warm_cache else Path(tempfile.mkdtemp(prefix="gemma-chat-first-run-"))
        # a private TMPDIR too: MLX before this change kept its kernels there
        tmp = Path(tempfile.mkdtemp(prefix="gemma-chat-first-run-tmp-"))
        env = {**os.environ, "GEMMA_CHAT_CACHE_DIR": str(cache), "TMPDIR": str(tmp)}
        cmd = [sys.executable, __file__, "--child", "--read-s", str(args.read_s)]
        if args.no_prepare:
            cmd.append("--no-prepare")
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if out.returncode != 0:
            print(out.stderr, file=sys.stderr)
            return 1
        res = json.loads(out.stdout.strip().splitlines()[-1])
        kernels = kernel_count(cache) + kernel_count(tmp)
        print(
            f"repeat {r + 1}: load {res['load_s']:.2f} s, kernels prepared by {res['prepared_at_s']}, {kernels} kernels"
        )
        print(f"  {'turn':<16} {'TTFT s':>8} {'wall s':>8} {'tok/s':>8} {'tokens':>7} {'kernels':>8}")
        for row in res["rows"]:
            cells = f"{row['ttft_s']:8.2f} {row['wall_s']:8.2f} {row['decode_tps']:8.1f} {row['tokens']:7d}"
            cells += f" {row['built']:8d}"
            print(f"  {row['turn']:<16} {cells}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
