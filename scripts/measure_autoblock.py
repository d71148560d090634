"""Auto block size against drafter off, timed from outside, on the varied prompt set of
scripts/autoblock_prompts.py (the demo, or a reference-pack pairing).

    .venv/bin/python scripts/measure_autoblock.py [--pairing demo|e-style|moe-style|dense-style]
        [--repeats 3] [--before PATH-TO-ANOTHER-CHECKOUT [--own-caches EMPTY-DIR]] [--case NAME ...]

For every case and repeat it runs `gemma-chat generate --json` once per configuration, in an order that
rotates every repeat (so a slow moment of a shared machine hits each alike): `auto` (the default),
`--no-draft`, and `--block-size 1` with the drafter loaded; with --before, also `auto` and `--no-draft`
of the other checkout (run with its own code: PYTHONPATH and cwd set to it). Both versions share the
user's cache folder unless --own-caches gives each its own: the kept block costs are one file per
pairing, so one version's sessions would otherwise start from what the other's kept. The parent process
timestamps every token line as it arrives on the pipe: decode tok/s = tokens after the first over the
time from the first token to the last, as a reader of the stream sees it. The pairing's compiled kernels
are built first, as the app and `serve` build them (a one-shot `generate` without them runs uncompiled).
Each process is a fresh start, so every run is a first reply: the controller starts cold.

Reported per case: medians over repeats of tok/s, and the medians of the per-repeat ratios auto / off and
k1 / off (the ratio of two runs of the same repeat, which the machine's drift affects least). Greedy
output must be the same for every configuration; the script stops if not.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from _kernels import build_kernels  # noqa: E402
from autoblock_prompts import PACK_FAMILIES, Case, cases_for  # noqa: E402

PACK = ROOT / "tests" / "data" / "pack" / "models"


def pairing_args(pairing: str) -> list[str]:
    if pairing == "demo":
        return ["--demo"]
    return ["--model", str(PACK / f"{pairing}-target"), "--drafter", str(PACK / f"{pairing}-assistant")]


def messages_file(case: Case, tree: Path, pairing: str, folder: Path) -> Path:
    """The chat to send: one user message, or (a second turn) the first question, the target's own
    reply to it (greedy, drafter off, from this checkout) and the follow-up."""
    msgs: list[dict] = []
    if case.first_turn is not None:
        first = run(tree, pairing, [{"role": "user", "content": case.first_turn}], ["--no-draft"], 160, False, folder)
        msgs = [{"role": "user", "content": case.first_turn}, {"role": "assistant", "content": first["text"]}]
    msgs.append({"role": "user", "content": case.user})
    path = folder / f"{case.name}.json"
    path.write_text(json.dumps(msgs))
    return path


def run(
    tree: Path,
    pairing: str,
    msgs,
    flags: list[str],
    max_tokens: int,
    ignore_eos: bool,
    folder: Path,
    cache: Path | None = None,
) -> dict:
    if isinstance(msgs, Path):
        source = ["--messages", str(msgs)]
    else:
        path = folder / f"m{time.monotonic_ns()}.json"
        path.write_text(json.dumps(msgs))
        source = ["--messages", str(path)]
    cmd = [sys.executable, "-m", "app", "generate", *pairing_args(pairing), *source, "--json"]
    cmd += ["--max-tokens", str(max_tokens), *flags] + (["--ignore-eos"] if ignore_eos else [])
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(tree)}
    if cache is not None:  # this version's own cache folder (its kept block costs, its kernels)
        env["GEMMA_CHAT_CACHE_DIR"] = str(cache)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tree)
    assert proc.stdout is not None
    ids: list[int] = []
    text: list[str] = []
    arrivals: list[float] = []
    stats: dict = {}
    for line in proc.stdout:
        now = time.perf_counter()
        obj = json.loads(line)
        if "stats" in obj:
            stats = obj["stats"]
        elif "id" in obj:
            ids.append(obj["id"])
            text.append(obj.get("text", ""))
            arrivals.append(now)
    err = proc.stderr.read() if proc.stderr else ""
    if proc.wait() != 0 or not stats:
        raise SystemExit(f"generate failed ({' '.join(cmd)}):\n{err}")
    span = arrivals[-1] - arrivals[0] if len(arrivals) > 1 else float("nan")
    return {
        "ids": ids,
        "text": "".join(text),
        "tps": (len(ids) - 1) / span if span > 0 else float("nan"),
        "blocks": stats.get("block_size_counts", {}),
        "accepted": stats.get("accepted", 0),
    }


def measure(
    pairing: str, cases: list[Case], repeats: int, before: Path | None, own_caches: Path | None = None
) -> list[dict]:
    """own_caches: a folder for each version's own cache folder (kept block costs evolve per version, as a
    user's sessions do, and neither primes the other's); None: both use the user's cache."""
    configs = [("after", "auto", []), ("after", "off", ["--no-draft"]), ("after", "k1", ["--block-size", "1"])]
    if before is not None:
        configs += [("before", "auto", []), ("before", "off", ["--no-draft"])]
    trees = {"after": ROOT, "before": before}
    rows = []
    for version in {v for v, _, _ in configs}:
        cache = own_caches / version if own_caches is not None else None
        build_kernels(pairing_args(pairing), cache=cache, checkout=trees[version])
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for case in cases:
            msgs = messages_file(case, ROOT, pairing, folder)
            runs: dict[tuple[str, str], list[dict]] = {(v, c): [] for v, c, _ in configs}
            for rep in range(repeats):
                order = configs[rep % len(configs) :] + configs[: rep % len(configs)]
                for version, name, flags in order:
                    tree = trees[version]
                    assert tree is not None
                    cache = own_caches / version if own_caches is not None else None
                    runs[(version, name)].append(
                        run(tree, pairing, msgs, flags, case.max_tokens, case.ignore_eos, folder, cache)
                    )
            ref = runs[("after", "off")][0]["ids"]
            for key, rs in runs.items():
                if any(r["ids"] != ref for r in rs):
                    raise SystemExit(f"{pairing} {case.name}: {key} changed the greedy output")
            rows.append(summarise(pairing, case, runs, repeats))
            print_row(rows[-1], before is not None)
    return rows


def summarise(pairing: str, case: Case, runs: dict, repeats: int) -> dict:
    def med(version: str, name: str) -> float:
        return statistics.median(r["tps"] for r in runs[(version, name)])

    def ratio(a: tuple[str, str], b: tuple[str, str]) -> float:
        return statistics.median(x["tps"] / y["tps"] for x, y in zip(runs[a], runs[b]))

    row = {
        "pairing": pairing,
        "case": case.name,
        "category": case.category,
        "tokens": len(runs[("after", "off")][0]["ids"]),
        "auto_tps": med("after", "auto"),
        "off_tps": med("after", "off"),
        "k1_tps": med("after", "k1"),
        "auto_vs_off": ratio(("after", "auto"), ("after", "off")),
        "k1_vs_off": ratio(("after", "k1"), ("after", "off")),
        "blocks": runs[("after", "auto")][0]["blocks"],
        "repeats": repeats,
    }
    if ("before", "auto") in runs:
        row["before_auto_vs_off"] = ratio(("before", "auto"), ("before", "off"))
        row["before_auto_tps"] = med("before", "auto")
        row["before_off_tps"] = med("before", "off")
    return row


def print_row(r: dict, before: bool) -> None:
    head = f"{r['pairing']:<11} {r['case']:<17} {r['category']:<11} {r['tokens']:>4}"
    body = f" auto {r['auto_tps']:6.1f} off {r['off_tps']:6.1f} k1 {r['k1_tps']:6.1f} | auto/off {r['auto_vs_off']:.2f}"
    body += f" k1/off {r['k1_vs_off']:.2f}"
    if before:
        body += f" | before auto/off {r['before_auto_vs_off']:.2f}"
    print(head + body, flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairing", action="append", choices=["demo", *PACK_FAMILIES])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--before", type=Path, help="another checkout (e.g. main) to measure beside this one")
    ap.add_argument("--case", action="append", help="only these cases (names in scripts/autoblock_prompts.py)")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    ap.add_argument(
        "--own-caches",
        type=Path,
        help="a folder for each version's own cache folder, kept across pairings (empty at first: kept block "
        "costs and kernels start cold and evolve per version; else both versions share the user's cache, and "
        "one version's kept costs prime the other's sessions)",
    )
    args = ap.parse_args(argv)
    rows = []
    for pairing in args.pairing or ["demo"]:
        cases = [c for c in cases_for(pairing) if not args.case or c.name in args.case]
        rows += measure(pairing, cases, args.repeats, args.before, args.own_caches)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    worst = min(rows, key=lambda r: r["auto_vs_off"])
    print(f"\nworst auto/off: {worst['auto_vs_off']:.2f} ({worst['pairing']} {worst['case']}); repeats {args.repeats}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
