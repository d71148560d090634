"""Measure the demo pairing the way a new user meets it: greedy, first-minute prompts, timed from outside.

    .venv/bin/python scripts/measure_demo.py [--repeats 3] [--model DIR --drafter DIR] [--max-tokens 160]

For each prompt and repeat it runs `gemma-chat generate --json` twice, interleaved: drafter on (auto
block size, the default) and `--no-draft`. The parent process timestamps every JSON token line as it
arrives on the pipe, so the decode rate is what a reader of the stream sees (first token to last,
tokens after the first), not the engine's own clock. It reports, per prompt and overall:

- share of tokens from accepted drafts (accepted / tokens, the figure the issue's >= 30 % is about),
- accepted tokens per round, the block sizes auto chose,
- decode tok/s with and without the drafter (medians over repeats) and their ratio.

Greedy output with the drafter must equal the output without it; the script checks that on every pair
of runs and fails loudly if not. By default it measures the shipped demo (`--demo`); `--model/--drafter`
point it at a candidate pairing (e.g. a `scripts/train_demo.py --out DIR` result before it ships).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# What a new user types in the first minute: greetings, the app, speculative decoding, Gemma 4, keys,
# short Python. Some are phrased as in the corpus, some are not.
PROMPTS = [
    "Hi!",
    "Who are you?",
    "What is speculative decoding?",
    "What is gemma-chat?",
    "How do I change the block size?",
    "What is Gemma 4?",
    "Write a Python function that reverses a string.",
    "What does json.dumps do?",
]


def gemma_chat() -> list[str]:
    exe = Path(sys.executable).with_name("gemma-chat")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "app"]


def run_once(pairing: list[str], prompt: str, draft: bool, max_tokens: int) -> dict:
    cmd = [*gemma_chat(), "generate", *pairing, "--json", "--prompt", prompt, "--max-tokens", str(max_tokens)]
    if not draft:
        cmd.append("--no-draft")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    assert proc.stdout is not None
    ids: list[int] = []
    arrivals: list[float] = []
    stats: dict = {}
    for line in proc.stdout:
        now = time.perf_counter()
        obj = json.loads(line)
        if "stats" in obj:
            stats = obj["stats"]
        elif "id" in obj:
            ids.append(obj["id"])
            arrivals.append(now)
    err = proc.stderr.read() if proc.stderr else ""
    if proc.wait() != 0 or not stats:
        raise SystemExit(f"gemma-chat generate failed ({' '.join(cmd)}):\n{err}")
    # tokens arrive in bursts (a round's accepted run at once): rate = tokens after the first / span
    span = arrivals[-1] - arrivals[0] if len(arrivals) > 1 else float("nan")
    return {
        "ids": ids,
        "outside_tps": (len(ids) - 1) / span if span > 0 else float("nan"),
        "engine_tps": stats.get("decode_tps") or float("nan"),
        "tokens": stats["tokens"],
        "accepted": stats.get("accepted", 0),
        "rounds": stats.get("rounds", 0),
        "decode_tokens": stats.get("decode_tokens", 0),
        "blocks": stats.get("block_size_counts", {}),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--model", help="target directory (default: the shipped demo)")
    ap.add_argument("--drafter", help="drafter directory (with --model)")
    ap.add_argument("--prompt", action="append", help="measure these prompts instead of the built-in list")
    args = ap.parse_args(argv)
    pairing = ["--model", args.model, "--drafter", args.drafter] if args.model else ["--demo"]
    prompts = args.prompt or PROMPTS

    on_tps: list[float] = []
    off_tps: list[float] = []
    tot_tokens = tot_accepted = tot_rounds = tot_decode = 0
    blocks: dict[str, int] = {}
    print(f"{'prompt':<50} {'tok':>4} {'drafts':>7} {'tok/rnd':>7} {'on':>7} {'off':>7} {'ratio':>6}")
    for prompt in prompts:
        on_r, off_r = [], []
        for rep in range(args.repeats):
            # alternate which goes first so a slow moment of the machine hits both sides alike
            order = (True, False) if rep % 2 == 0 else (False, True)
            for draft in order:
                (on_r if draft else off_r).append(run_once(pairing, prompt, draft, args.max_tokens))
        for a, b in zip(on_r, off_r):
            if a["ids"] != b["ids"]:
                raise SystemExit(f"greedy output differs with the drafter on {prompt!r}: exactness broken")
        first = on_r[0]
        tot_tokens += first["tokens"]
        tot_accepted += first["accepted"]
        tot_rounds += first["rounds"]
        tot_decode += first["decode_tokens"]
        for k, v in first["blocks"].items():
            blocks[k] = blocks.get(k, 0) + v
        on = statistics.median(r["outside_tps"] for r in on_r)
        off = statistics.median(r["outside_tps"] for r in off_r)
        on_tps.append(on)
        off_tps.append(off)
        share = first["accepted"] / max(first["tokens"], 1)
        per_round = first["decode_tokens"] / max(first["rounds"], 1)
        print(
            f"{prompt[:50]:<50} {first['tokens']:>4} {share:>6.0%} {per_round:>7.2f} {on:>7.1f} {off:>7.1f} "
            f"{on / off:>5.2f}x"
        )
    ratios = [a / b for a, b in zip(on_tps, off_tps)]
    print()
    print(f"tokens from accepted drafts: {tot_accepted}/{tot_tokens} = {tot_accepted / max(tot_tokens, 1):.1%}")
    print(
        f"tokens per round: {tot_decode / max(tot_rounds, 1):.2f}; block sizes chosen: {dict(sorted(blocks.items()))}"
    )
    print(
        f"decode tok/s (outside, medians of {args.repeats}): drafter on {statistics.median(on_tps):.1f}, "
        f"off {statistics.median(off_tps):.1f}; speed-up median over prompts {statistics.median(ratios):.2f}x "
        f"(range {min(ratios):.2f}-{max(ratios):.2f}x)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
