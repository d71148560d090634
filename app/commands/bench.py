"""`gemma-chat bench`: decode tok/s of mlx-lm's stream_generate and of our loop, drafter off and on.

Prints a table (or `--json`): per configuration the median tok/s over interleaved repeats, the
ratio to mlx-lm, acceptance, tokens per round, and the efficiency against the cost bound built
from the measured verify and draft costs. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from app.commands.common import UsageError, fit_to, output_columns, pairing_from_args, printable


def run(args: argparse.Namespace) -> int:
    def fail(message: str) -> int:
        if args.json:
            print(json.dumps({"error": message}))
        else:
            print(f"error: {printable(message)}", file=sys.stderr)
        return 1

    try:
        from core.frontends.bench import (
            BenchError,
            BenchOptions,
            format_markdown,
            format_table,
            parse_block_sizes,
            run_bench,
        )

        try:
            block_sizes = parse_block_sizes(args.block_sizes)
        except ValueError as e:
            return fail(f"--block-sizes: {e}")
        if args.repeats < 1 or args.max_tokens < 2 or args.prefill_tokens < 0:
            return fail("--repeats must be >= 1, --max-tokens >= 2 and --prefill-tokens >= 0")
        if args.report and not Path(args.report).expanduser().parent.is_dir():
            return fail(f"--report {args.report}: no such directory")
        spec = pairing_from_args(args)
        target, drafter = spec.target, spec.drafter
        options = BenchOptions(
            max_tokens=args.max_tokens,
            block_sizes=block_sizes,
            repeats=args.repeats,
            simulate_acceptance=args.simulate_acceptance,
            dtype=args.dtype,
            prefill_tokens=args.prefill_tokens,
        )
        if args.prompt is not None:
            options.prompt = args.prompt
        elif args.demo:
            from core.frontends.bench import DEMO_PROMPT

            options.prompt = DEMO_PROMPT  # a topic the demo was trained on (it knows no stories)
        report = run_bench(target, drafter, options, progress=lambda s: print(s, file=sys.stderr, flush=True))
    except UsageError as e:
        return fail(str(e))
    except BenchError as e:
        return fail(str(e))
    except (ValueError, OSError) as e:  # CheckpointError is a ValueError: a bad --model/--drafter
        from core.model.loader import CheckpointError

        return fail(str(e) if isinstance(e, CheckpointError) else f"{type(e).__name__}: {e}")
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        columns = output_columns()  # a terminal: the long lines (BLAS, costs, notes) wrap between words
        print("\n".join(fit_to(line, columns, hang=2) for line in format_table(report).splitlines()))
    if args.report:  # after the table, so a failed write loses nothing
        try:
            Path(args.report).write_text(format_markdown(report))
        except OSError as e:
            print(f"error: --report {args.report}: {e}", file=sys.stderr)
            return 1
        print(f"Markdown report written to {args.report}", file=sys.stderr)
    return 0
