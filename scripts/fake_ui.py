#!/usr/bin/env python3
"""The chat app on the tests' scripted fake engine (no MLX, no model): for work on the screens, for
`scripts/bench_ui.py --ui-cost`'s kind of measurement by hand, and for the terminal tests.

    .venv/bin/python scripts/fake_ui.py [--delay SECONDS] [--hold-load | --hold-prefill] [gemma-chat's chat flags]

The fake engine (tests/support/fake_engine.py) streams a scripted reply in rounds shaped by the block
size and the drafter switch; `--delay` is its real seconds per round (default 0.05). `--hold-load` never
finishes loading, `--hold-prefill` never finishes a turn's prefill (for killing the app in that phase).
`--mcp` starts the config's MCP servers (the time server by default) and scripts a first reply that
calls get_current_time, then one that quotes the result.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


def main(argv: list[str] | None = None) -> int:
    from support.fake_engine import FakeEngine, PairingSpec

    from app.cli import build_parser
    from app.commands.tui import cli_settings, run_app
    from core.user.config import ConfigError, load_config

    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--delay", type=float, default=0.05)
    # hold a phase forever (the terminal tests kill the app there): the load, or every turn's prefill
    pre.add_argument("--hold-load", action="store_true")
    pre.add_argument("--hold-prefill", action="store_true")
    # the config's MCP servers (the time server by default), and a script whose first reply calls its tool
    pre.add_argument("--mcp", action="store_true")
    ours, rest = pre.parse_known_args(argv)
    args = build_parser().parse_args(rest)
    try:
        config = load_config()
        settings = cli_settings(args, config.generation_settings())
    except (ConfigError, ValueError) as e:
        print(f"fake_ui: {e}", file=sys.stderr)
        return 2
    replies = [TIME_CALL, TIME_ANSWER] if ours.mcp else None
    engine = FakeEngine(delay_s=ours.delay, hold_load=ours.hold_load, hold_prefill=ours.hold_prefill)
    if replies:
        engine.replies = replies
    spec = PairingSpec(name="fake (scripted)", target="fake-target", drafter="fake-drafter")
    return run_app(engine, spec, settings, config, offline=True, mcp=ours.mcp)


TIME_CALL = 'Let me look that up.<|tool_call>call:get_current_time{timezone:<|"|>Europe/Paris<|"|>}<tool_call|>'
TIME_ANSWER = "The time server says: {tool_result}"


if __name__ == "__main__":
    raise SystemExit(main())
