"""`gemma-chat` argument parsing: an app option given before a command counts for the command."""

from __future__ import annotations

import pytest

from app.cli import build_parser


@pytest.mark.parametrize(
    "argv",
    [
        ["--demo", "generate", "--prompt", "hi"],  # the app's form of --demo, then the command
        ["generate", "--demo", "--prompt", "hi"],
    ],
)
def test_demo_before_or_after_the_command_picks_the_demo(argv):
    args = build_parser().parse_args(argv)
    assert args.command == "generate" and args.demo is True


def test_a_commands_own_defaults_stay_unless_given_before_or_after_it():
    parse = build_parser().parse_args
    assert parse(["generate", "--prompt", "x"]).max_tokens == 256  # generate's own default
    assert parse(["serve", "--demo"]).max_tokens == 2048  # serve's
    assert parse(["--max-tokens", "5", "generate", "--prompt", "x"]).max_tokens == 5
    assert parse(["--max-tokens", "5", "generate", "--max-tokens", "7", "--prompt", "x"]).max_tokens == 7
    assert parse(["--model", "/m", "bench"]).model == "/m"
    args = parse(["generate", "--prompt", "x"])
    assert (args.temp, args.top_p, args.top_k, args.block_size, args.demo, args.model) == (
        0.0,
        1.0,
        0,
        "auto",
        False,
        None,
    )
    app = parse([])  # the app itself keeps "not given" (the config file decides)
    assert (app.command, app.max_tokens, app.temp, app.block_size, app.demo) == (None, None, None, None, False)
