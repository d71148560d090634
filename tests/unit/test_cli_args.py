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
    assert parse(["--offline", "models", "download", "e2b"]).offline is True  # a sub-command's too
    assert parse(["models", "download", "e2b", "--offline"]).offline is True
    assert parse(["models", "download", "e2b"]).offline is False
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


@pytest.mark.parametrize(
    ("argv", "flag", "command"),
    [
        (["--temp", "0.5", "serve", "--demo"], "--temp", "serve"),  # serve takes sampling per request
        (["--demo", "doctor"], "--demo", "doctor"),
        (["--block-size", "3", "bench", "--demo"], "--block-size", "bench"),
    ],
)
def test_an_app_option_a_command_does_not_take_is_refused_not_ignored(argv, flag, command, capsys):
    # it was dropped without a word: `gemma-chat --temp 0.5 serve` served at each request's own temperature
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(argv)
    assert exit_.value.code == 2
    assert f"{flag} is an option of the chat app, not of '{command}'" in capsys.readouterr().err
