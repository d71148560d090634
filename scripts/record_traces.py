"""Record acceptance traces for the auto block size benchmark (scripts/replay_autoblock.py).

    .venv/bin/python scripts/record_traces.py [--pairing demo|e-style|moe-style|dense-style ...] [--out DIR]
        [--held-out] [--keep-costs]

For every case of scripts/autoblock_prompts.py, greedy and sampled (T=1.0, top-p 0.95, top-k 64): the
target alone writes the reply (plain decoding, as `--no-draft` would), then, at every position of that
reply where a round could start, the drafter drafts K_MAX - 1 tokens and the target verifies them in one
forward, as a round of block size K_MAX would (greedy: the longest matching prefix; sampled: rejection
sampling, the engine's own `verify_speculative`). The trace keeps, per position, how many drafts were
accepted (0..K_MAX-1, capped so a round never runs past the reply's end). A round of any block size K
started there accepts min(that, K - 1): acceptance is a prefix, so the trace answers every K, and a
controller can be replayed on it under any cost model without this machine's timing noise.

It also measures this machine's costs for the pairing (bench.measure_costs: one verify of K tokens and
one draft chain of n steps, in units of one plain decode step), the "cpu" cost model of the replay.

Output: DIR/<pairing>.json (default tests/data/traces/), small: one digit per position, and the
drafter's probability of each of the K_MAX - 1 drafts there (two digits each: what a confidence gate
would see, read with `Drafter.draft(gate=...)`). `--held-out` records the held-out replies
(scripts/autoblock_prompts.py) into tests/data/traces-held-out/, with the main set's cpu costs: a
second set that no controller change is tuned on. `--keep-costs` records the replies again but keeps
the main set's cpu costs (this shared machine's timings move between sessions).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from autoblock_prompts import PACK_FAMILIES, SAMPLED, Case, cases_for  # noqa: E402
from replay_autoblock import HELD_OUT_TRACES, TRACES  # noqa: E402  (pure Python: no mlx before the cache below)

from core.user.kernel_cache import use_private_kernel_cache  # noqa: E402

use_private_kernel_cache()  # before mlx: the private kernel folder and the OpenBLAS forwarder, as every entry point

K_MAX = 8
PACK = ROOT / "tests" / "data" / "pack" / "models"


def load(pairing: str):
    from core.engine.contract import PairingSpec
    from core.engine.loading import load_pairing
    from core.hub.demo import ensure_demo_pairing

    if pairing == "demo":
        target, drafter = ensure_demo_pairing()
    else:
        target, drafter = PACK / f"{pairing}-target", PACK / f"{pairing}-assistant"
    return load_pairing(PairingSpec(pairing, str(target), str(drafter)), vision=False)


def plain_reply(p, ids: list[int], case: Case, sampling: dict, seed: int) -> list[int]:
    """The target's own reply (drafter off), exactly as `--no-draft` decodes it."""
    from core.decode.spec import Decoder, Prompt
    from core.settings import GenerationSettings

    settings = GenerationSettings(
        max_tokens=case.max_tokens, ignore_eos=case.ignore_eos, seed=seed, drafter_enabled=False, **sampling
    )
    result = Decoder(p.target, None, None, p.stop_ids).run(p.target.make_cache(), Prompt(ids), settings, lambda e: None)
    return result.token_ids


def acceptance_runs(p, ids: list[int], reply: list[int], sampling: dict, seed: int) -> tuple[str, str]:
    """Per round start along `reply`: drafts accepted by a block of K_MAX (one digit each), and the
    drafter's probability of each of its K_MAX - 1 drafts (two digits each, floor(100 p), 99 at most)."""
    import mlx.core as mx

    from core import sampling as smp

    tg, dr = p.target, p.drafter
    temp = sampling.get("temperature", 0.0)
    keys = smp.KeyStream(seed + 7919) if temp > 0 else None
    cache = tg.make_cache()
    _, hidden = tg.forward(ids, cache, logits=None)
    h = hidden[-1]
    P = len(ids)
    out, conf = [], []

    def keep(j: int, prob: float) -> bool:
        conf.append(f"{min(99, int(prob * 100)):02d}")
        return True

    for i in range(len(reply) - 1):
        b = mx.array([reply[i]], dtype=mx.uint32)
        room = len(reply) - i - 2  # drafts a round here may still emit before the reply ends
        draft_keys = keys.split(K_MAX - 1) if keys is not None else None
        drafts, q_lp = dr.draft(tg, cache, b, h, K_MAX - 1, keys=draft_keys, gate=keep, **sampling)
        logits, H = tg.forward(mx.concatenate([b, drafts]), cache, logits="all", softcap=temp > 0)
        if keys is not None:
            p_lp = smp.transform_logits_compiled(logits, temp, sampling["top_k"], sampling["top_p"])
            n, _ = smp.verify_speculative(drafts, q_lp, p_lp, keys.next())
        else:
            n, _ = smp.verify_greedy(drafts, logits)
        out.append(min(int(n.item()), room))
        cache.trim_to(P + i + 1)  # keep b, as the plain step would
        h = H[0]
    return "".join(str(n) for n in out), "".join(conf)


def messages_for(p, case: Case, sampling: dict, seed: int) -> list[dict]:
    from core.decode import prompt as prompt_mod

    msgs: list[dict] = [{"role": "system", "content": case.system}] if case.system else []
    if case.first_turn is not None:
        first = msgs + [{"role": "user", "content": case.first_turn}]
        ids = prompt_mod.encode_messages(p.tokenizer, first)
        reply = [
            t for t in plain_reply(p, ids, Case("first", "", case.first_turn), sampling, seed) if t not in p.stop_ids
        ]
        msgs = first + [{"role": "assistant", "content": p.tokenizer.decode(reply)}]
    return msgs + [{"role": "user", "content": case.user}]


def costs(p, repeats: int = 40) -> dict:
    """This machine's costs: verify(K) for K = 1..K_MAX and a draft chain of n = 1..K_MAX-1 steps, in plain
    steps. The machine is shared, so every piece is timed once per repeat, interleaved, and each cost is
    the lower quartile of its repeats (a slow moment of another process inflates a time, never shrinks it)."""
    import mlx.core as mx

    from core.decode import prompt as prompt_mod

    tg, dr = p.target, p.drafter
    ids = prompt_mod.encode_messages(p.tokenizer, [{"role": "user", "content": "What is speculative decoding?"}])
    cache = tg.make_cache()
    _, hidden = tg.forward(ids, cache, logits=None)
    h = hidden[-1]
    mx.eval(h)
    P = cache.offset
    b = mx.array([3], dtype=mx.uint32)

    def verify(k: int) -> None:
        logits, H = tg.forward([3] * k, cache, logits="all")
        mx.eval(mx.argmax(logits, axis=-1), H)
        cache.trim_to(P)

    def chain(n: int) -> None:
        drafts, _ = dr.draft(tg, cache, b, h, n)
        mx.eval(drafts)

    pieces = [("v", k) for k in range(1, K_MAX + 1)] + [("d", n) for n in range(1, K_MAX)]
    times: dict[tuple[str, int], list[float]] = {x: [] for x in pieces}
    for rep in range(repeats + 2):
        for kind, k in pieces:
            t0 = time.perf_counter()
            (verify if kind == "v" else chain)(k)
            if rep >= 2:  # two warm-up passes
                times[(kind, k)].append(time.perf_counter() - t0)
    q = {x: sorted(v)[len(v) // 4] for x, v in times.items()}
    step = q[("v", 1)]
    return {
        "verify": [round(q[("v", k)] / step, 3) for k in range(1, K_MAX + 1)],
        "draft_chain": [round(q[("d", n)] / step, 3) for n in range(1, K_MAX)],
    }


def record(pairing: str, held_out: bool = False, keep_costs: bool = False) -> dict:
    """The pairing's traces; `held_out`: of the held-out replies, with the main set's costs (so the two
    sets differ only in their replies) when that set has the pairing; `keep_costs`: the main set's costs
    as they are (re-recording replies without re-timing this shared machine)."""
    from core.decode import prompt as prompt_mod

    p = load(pairing)
    traces = []
    for mode, sampling in (("greedy", {}), ("sampled", SAMPLED)):
        for seed, case in enumerate(cases_for(pairing, held_out)):
            t0 = time.perf_counter()
            msgs = messages_for(p, case, sampling, seed)
            ids = prompt_mod.encode_messages(p.tokenizer, msgs)
            reply = plain_reply(p, ids, case, sampling, seed)
            runs, conf = acceptance_runs(p, ids, reply, sampling, seed)
            traces.append(
                {
                    "case": case.name,
                    "category": case.category,
                    "mode": mode,
                    "tokens": len(reply),
                    "runs": runs,
                    "conf": conf,
                }
            )
            took = time.perf_counter() - t0
            print(f"{pairing} {mode:<7} {case.name:<18} {len(reply):>4} tokens  {took:5.1f} s  {runs[:60]}")
    main = TRACES / f"{pairing}.json"
    cpu = json.loads(main.read_text())["cpu_costs"] if (held_out or keep_costs) and main.exists() else costs(p)
    return {"pairing": pairing, "k_max": K_MAX, "sampled": SAMPLED, "cpu_costs": cpu, "traces": traces}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairing", action="append", choices=["demo", *PACK_FAMILIES])
    ap.add_argument("--out", help=f"default {TRACES} ({HELD_OUT_TRACES} with --held-out)")
    ap.add_argument(
        "--held-out", action="store_true", help="the held-out replies (autoblock_prompts.cases_for(..., held_out=True))"
    )
    ap.add_argument("--keep-costs", action="store_true", help="keep the main set's cpu costs instead of timing")
    args = ap.parse_args(argv)
    out = Path(args.out or (HELD_OUT_TRACES if args.held_out else TRACES))
    out.mkdir(parents=True, exist_ok=True)
    for pairing in args.pairing or ["demo", *PACK_FAMILIES]:
        data = record(pairing, args.held_out, args.keep_costs)
        (out / f"{pairing}.json").write_text(json.dumps(data, indent=1) + "\n")
        print(f"wrote {out / f'{pairing}.json'}: cpu costs {data['cpu_costs']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
