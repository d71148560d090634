"""Our loop against mlx-vlm's on the same pairing: MTP at block 4 and plain decoding, interleaved.

    python scripts/bench_mlx_vlm.py --model DIR --drafter DIR [--max-tokens 48] [--repeats 5] [--block-size 4]

mlx-vlm is not a dependency of gemma-chat: run this with a Python that has both (for example a
scratch venv with mlx-vlm installed and a .pth file pointing at this project's site-packages).
Both sides decode greedily with EOS ignored, from the same user message rendered by each side's
own chat template; tok/s is counted the same way for all (tokens after the first over the time
from the first to the last, as `gemma-chat bench`). The figure to read is the median of the
per-repeat ratios. Acceptance differs between the two only where their drafting conventions do.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core.user.kernel_cache import use_private_kernel_cache  # noqa: E402

use_private_kernel_cache()  # before mlx runs anything: its compiled kernels go to gemma-chat's private folder


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--drafter", required=True)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--block-size", type=int, default=4)
    args = p.parse_args()
    try:
        from mlx_vlm.generate.dispatch import stream_generate as vlm_stream
        from mlx_vlm.prompt_utils import apply_chat_template
        from mlx_vlm.speculative.drafters import load_drafter as vlm_load_drafter
        from mlx_vlm.utils import load as vlm_load
    except ImportError as e:
        print(f"mlx-vlm is not importable here ({e}); see this script's docstring", file=sys.stderr)
        return 1
    from core.decode import prompt as prompt_mod
    from core.frontends import bench
    from core.model.drafter import load_drafter
    from core.model.loader import load_tokenizer
    from core.model.target import load_target

    n, k = args.max_tokens, args.block_size
    vlm_model, processor = vlm_load(args.model)
    vlm_drafter, kind = vlm_load_drafter(args.drafter, kind="mtp")
    vlm_tok = processor.tokenizer if hasattr(processor, "tokenizer") else processor
    vlm_tok.stopping_criteria = lambda *a, **kw: False  # EOS ignored, as in `gemma-chat bench`
    text = apply_chat_template(processor, vlm_model.config, bench.DEFAULT_PROMPT)
    target, drafter = load_target(args.model), load_drafter(args.drafter)
    tokenizer = load_tokenizer(args.model)
    stops = prompt_mod.stop_ids(args.model, tokenizer)
    ids = prompt_mod.encode_messages(tokenizer, [{"role": "user", "content": bench.DEFAULT_PROMPT}])

    def vlm_run(draft: bool) -> float:
        kw: dict = {"max_tokens": n, "temperature": 0.0}
        if draft:
            kw.update(draft_model=vlm_drafter, draft_kind=kind, draft_block_size=k)
        clock = bench._Clock()
        for _ in vlm_stream(vlm_model, processor, text, **kw):
            clock.tick()
        return clock.tps

    runs = {
        "mlx-vlm plain": lambda: vlm_run(False),
        f"mlx-vlm MTP K={k}": lambda: vlm_run(True),
        "ours off": lambda: bench.run_ours(target, None, tokenizer, stops, ids, n, None).tps,
        f"ours K={k}": lambda: bench.run_ours(target, drafter, tokenizer, stops, ids, n, k).tps,
    }
    results: dict[str, list[float]] = {name: [] for name in runs}
    for rep in range(args.repeats + 1):  # repeat 0 warms up (kernel builds, compiled functions)
        for name, run in runs.items():
            tps = run()
            if rep:
                results[name].append(tps)
        print(f"repeat {rep}/{args.repeats} done", file=sys.stderr, flush=True)
    for name, tps in results.items():
        print(f"{name:<18} {statistics.median(tps):8.2f} tok/s  ({', '.join(f'{t:.1f}' for t in tps)})")
    names = list(runs)
    for ours, theirs in ((names[3], names[1]), (names[2], names[0])):
        ratio = statistics.median(a / b for a, b in zip(results[ours], results[theirs]))
        print(f"{ours} / {theirs}: {ratio:.3f} (median of per-repeat ratios)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
