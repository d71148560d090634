"""The pairing's compiled kernels, before a benchmark's timed runs.

A one-shot `generate` on a machine without them answers uncompiled (about half speed on the demo), and
a `serve` process builds them in a background child while it already answers: a benchmark that starts
on such a machine times uncompiled replies against compiled ones, and the building child's two cores of
work against whichever run is timed meanwhile (`bench_serve.py --streams 4,8` on a new machine: "7.22x"
at 8 streams, 3.87x once built). This builds them first, with `generate --build-kernels`, and waits.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def build_kernels(pairing_args: list[str], *, cache: Path | None = None, checkout: Path | None = None) -> None:
    """`pairing_args`: `["--demo"]` or `["--model", DIR, "--drafter", DIR]`. Built by `checkout`'s code
    (default this one's): kernels are keyed by the code that traces them, so a before/after run builds
    each. A checkout from before `--build-kernels` existed is said and left uncompiled."""
    tree = checkout or ROOT
    cmd = [
        sys.executable,
        "-m",
        "app",
        "generate",
        *pairing_args,
        "--build-kernels",
        "--prompt",
        "Hi",
        "--max-tokens",
        "1",
    ]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    if cache is not None:
        env["GEMMA_CHAT_CACHE_DIR"] = str(cache)
    print(f"building the kernels for {' '.join(pairing_args)} ({tree}) if this machine has none ...", flush=True)
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tree)
    if done.returncode == 0:
        return
    if "unrecognized arguments: --build-kernels" in done.stderr and checkout is not None:
        print(f"  {tree} has no --build-kernels: its server builds them in the background while it runs", flush=True)
        return
    raise SystemExit(f"generate --build-kernels failed:\n{done.stderr}")
