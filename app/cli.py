"""`gemma-chat` command line.

Parsing stays import-light: `gemma-chat --help` (and every sub-command's --help) must not import
mlx or textual. Each sub-command's handler is imported only when it runs.
"""

from __future__ import annotations

import argparse
import errno
import sys
from typing import Any

from app.commands.common import discard_stdout
from core.limits import BLOCK_SIZE_RANGE, IMAGE_BUDGETS, MAX_BLOCK_SIZE, MIN_BLOCK_SIZE, is_block_size

_BUDGETS_OR = ", ".join(map(str, IMAGE_BUDGETS[:-1])) + f" or {IMAGE_BUDGETS[-1]}"  # "70, ... or 1120"


def _block_size(value: str) -> int | str:
    if value == "auto":
        return "auto"
    try:
        k = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"block size must be an integer {BLOCK_SIZE_RANGE} or 'auto', got {value!r}"
        ) from None
    if not is_block_size(k):
        raise argparse.ArgumentTypeError(f"block size must be between {MIN_BLOCK_SIZE} and {MAX_BLOCK_SIZE}, got {k}")
    return k


def _add_pairing_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model", metavar="PATH_OR_REPO", help="target checkpoint: a local directory or a Hugging Face repo id"
    )
    p.add_argument(
        "--drafter", metavar="PATH_OR_REPO", help="assistant (MTP) drafter checkpoint: a local directory or a repo id"
    )
    p.add_argument("--pairing", metavar="NAME", help="a downloaded catalogue pairing (see `gemma-chat models list`)")
    p.add_argument(
        "--offline", action="store_true", help="never touch the network; use only what is in the local cache"
    )


def _add_drafter_convention_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--drafter-position",
        choices=["P-1", "P"],
        default="P-1",
        help=(
            "RoPE position of the drafter's query: the last cached position (P-1, default) "
            "or the bonus token's (P, as HF)"
        ),
    )
    p.add_argument(
        "--drafter-window",
        choices=["W", "W+1"],
        default="W",
        help="keys the drafter's sliding layers see: |q-k| < W (default) or the last W+1 (as HF)",
    )


def _add_connect_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--connect",
        metavar="URL",
        help="use a running OpenAI-compatible server (gemma-chat serve, vLLM) instead of a local model",
    )
    p.add_argument(
        "--api-key",
        metavar="KEY",
        default=None,
        help="API key for --connect; other users can read it in the process list: prefer $GEMMA_CHAT_API_KEY",
    )
    p.add_argument("--api-key-file", metavar="PATH", default=None, help="read the API key from this file's first line")


def _add_serve_parser(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("serve", help="serve the engine over an OpenAI-compatible HTTP API")
    _add_pairing_args(s)
    s.add_argument("--demo", action="store_true", help="serve the offline demo pairing")
    s.add_argument("--no-draft", action="store_true", help="load no drafter")
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; others need an API key)")
    s.add_argument("--port", type=int, default=8000, help="port (default 8000; 0: a free one, said at the start)")
    s.add_argument(
        "--api-key",
        metavar="KEY",
        default=None,
        help="require 'Authorization: Bearer KEY'; other users can read it in the process list: "
        "prefer $GEMMA_CHAT_API_KEY or --api-key-file",
    )
    s.add_argument("--api-key-file", metavar="PATH", default=None, help="read the API key from this file's first line")
    s.add_argument("--parallel", type=int, default=4, metavar="N", help="requests decoded together (1: one at a time)")
    s.add_argument(
        "--max-waiting", type=int, default=4, metavar="M", help="requests queued behind the running ones (429 past it)"
    )
    s.add_argument(
        "--max-connections", type=int, default=256, metavar="N", help="open connections; more are answered 503"
    )
    s.add_argument("--max-body-mb", type=float, default=64, metavar="MB", help="largest request body (default 64)")
    s.add_argument(
        "--header-timeout",
        type=float,
        default=10,
        metavar="S",
        help="seconds a connection has to send its request headers (default 10)",
    )
    s.add_argument(
        "--body-timeout",
        type=float,
        default=30,
        metavar="S",
        help="seconds a request has for its body (default 30)",
    )
    s.add_argument("--max-tokens", type=int, default=2048, metavar="N", help="default max_tokens of a request")
    s.add_argument("--model-id", metavar="NAME", default=None, help="the model name /v1/models reports")
    s.add_argument("--dtype", choices=["float32", "bfloat16"], default=None, help="cast float weights to this dtype")
    _add_drafter_convention_args(s)


class _Parser(argparse.ArgumentParser):
    """An option of the app given before a command counts for the command: `gemma-chat --demo generate …`
    (the app's --demo, then the command) ran generate without it and said "say which model to run … or
    --demo". argparse lets a command's own default overwrite the value given before it; here the command's
    copies of the app's options default to nothing (`carry_options`), and where its own default differs
    from the app's, it is filled in after parsing when neither place gave the option."""

    command_defaults: dict[str, dict[str, object]]
    app_only: dict[str, dict[str, tuple[str, object]]]  # per command: the app's options it does not take

    def _print_message(self, message: str, file: Any = None) -> None:  # file: a text stream
        # argparse drops a failed write (`--help > /dev/full` said nothing and ended 0); `main` says it
        if message:
            out = file or sys.stderr
            out.write(message)
            out.flush()

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[no-untyped-def]
        ns, extra = super().parse_known_args(args, namespace)
        command = getattr(ns, "command", None) or ""
        for dest, (flag, default) in getattr(self, "app_only", {}).get(command, {}).items():
            if getattr(ns, dest, default) != default:  # `gemma-chat --temp 0.5 serve`: it was ignored
                self.error(f"{flag} is an option of the chat app, not of '{command}' (see gemma-chat {command} --help)")
        for dest, default in getattr(self, "command_defaults", {}).get(command, {}).items():
            if getattr(ns, dest, None) is None:
                setattr(ns, dest, default)
        return ns, extra


def carry_options(parser: _Parser, sub: argparse._SubParsersAction) -> None:
    """See `_Parser`: each command's options that the app also takes default to the app's value."""
    app = [a for a in parser._actions if a.dest not in ("help", "command", "version")]
    top = {a.dest: a.default for a in app}
    parser.command_defaults, parser.app_only = {}, {}
    for name, command in sub.choices.items():
        takes = set()
        for depth, p in enumerate([command, *_nested(command)]):  # `gemma-chat --offline models download NAME`
            for action in p._actions:
                takes.add(action.dest)
                if action.dest not in top:
                    continue
                if action.default != top[action.dest]:
                    if depth:  # a sub-command's own default: it wins (it cannot be told from the app's)
                        continue
                    parser.command_defaults.setdefault(name, {})[action.dest] = action.default
                action.default = argparse.SUPPRESS
        parser.app_only[name] = {a.dest: (a.option_strings[0], a.default) for a in app if a.dest not in takes}


def _nested(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """A command's sub-commands, theirs included (`models download`)."""
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for nested in action.choices.values():
                out += [nested, *_nested(nested)]
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="gemma-chat",
        description="Chat with Gemma 4 in the terminal, on MLX, sped up by Gemma 4's own MTP drafter.",
    )
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    _add_pairing_args(parser)
    parser.add_argument(
        "--demo",
        action="store_true",
        help="open the offline demo pairing (a tiny trained model; short answers, real speculative decoding)",
    )
    _add_connect_args(parser)
    chat = parser.add_argument_group("chat settings (this session only; the config file keeps the defaults)")
    chat.add_argument("--temp", type=float, default=None, metavar="T", help="temperature; 0 is greedy")
    chat.add_argument("--top-p", type=float, default=None, metavar="P")
    chat.add_argument("--top-k", type=int, default=None, metavar="K", help="0 disables top-k")
    chat.add_argument("--seed", type=int, default=None, metavar="S")
    chat.add_argument("--max-tokens", type=int, default=None, metavar="N", help="per reply")
    chat.add_argument("--system", "--system-prompt", dest="system", metavar="TEXT", help="system prompt")
    chat.add_argument(
        "--block-size", type=_block_size, default=None, metavar="K|auto", help="tokens verified per round, or auto"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_generate_parser(sub)
    _add_serve_parser(sub)
    _add_bench_parser(sub)
    _add_models_parser(sub)
    sub.add_parser("doctor", help="report the MLX backend, versions, cache paths, disk and terminal support")
    carry_options(parser, sub)
    return parser


def _add_generate_parser(sub: argparse._SubParsersAction) -> None:
    g = sub.add_parser("generate", help="generate headlessly and print the answer (or JSON events)")
    _add_pairing_args(g)
    g.add_argument("--demo", action="store_true", help="use the offline demo pairing")
    g.add_argument("--no-draft", action="store_true", help="plain decoding: no drafter")
    src = g.add_mutually_exclusive_group()
    src.add_argument(
        "--prompt",
        metavar="TEXT",
        help="the user message; '-' reads it from stdin, as does a pipe when nothing else is asked",
    )
    src.add_argument(
        "--messages",
        metavar="FILE.json",
        help="a JSON list of chat messages ({role, content}; assistant tool_calls and role 'tool' results too); "
        "'-' reads it from stdin",
    )
    g.add_argument(
        "--image", metavar="PATH", action="append", default=[], help="attach an image to the prompt (repeatable)"
    )
    g.add_argument(
        "--image-budget",
        type=int,
        default=None,
        metavar="N",
        help=f"soft tokens per image: {_BUDGETS_OR} (default: the checkpoint's)",
    )
    g.add_argument(
        "--audio",
        metavar="FILE",
        action="append",
        default=[],
        help="attach an audio clip (WAV, FLAC, OGG, MP3; E2B, E4B and 12B) to the prompt (repeatable)",
    )
    g.add_argument("--system", metavar="TEXT", help="system prompt")
    g.add_argument(
        "--tools",
        metavar="FILE.json",
        help="an OpenAI-style tools list the model may call; calls print as {'tool_call': ...} JSON",
    )
    g.add_argument(
        "--mcp",
        action="store_true",
        help="offer the tools of config.toml's MCP servers and run their calls once allowed (see --yes)",
    )
    g.add_argument(
        "--yes", action="store_true", help="with --mcp: run every MCP tool call without asking (default: ask)"
    )
    g.add_argument(
        "--tool-choice",
        metavar="auto|required|none|NAME",
        default="auto",
        help="auto (default: the model decides), required (a call), a tool's name (a call to it), none",
    )
    g.add_argument(
        "--block-size",
        type=_block_size,
        default="auto",
        metavar="K|auto",
        help="tokens verified per round (drafts + 1), or auto (default)",
    )
    g.add_argument("--temp", type=float, default=0.0, metavar="T", help="temperature; 0 is greedy (default)")
    g.add_argument("--top-p", type=float, default=1.0, metavar="P")
    g.add_argument("--top-k", type=int, default=0, metavar="K", help="0 disables top-k")
    g.add_argument("--seed", type=int, default=None, metavar="S")
    g.add_argument("--max-tokens", type=int, default=256, metavar="N")
    g.add_argument("--ignore-eos", action="store_true", help="do not stop at end-of-turn tokens")
    g.add_argument("--no-template", action="store_true", help="feed the prompt as-is (BOS + text), no chat template")
    g.add_argument("--thinking", action="store_true", help="turn thinking on where the chat template supports it")
    g.add_argument("--dtype", choices=["float32", "bfloat16"], default=None, help="cast float weights to this dtype")
    g.add_argument("--json", action="store_true", help="one JSON object per token, then a final {'stats': ...}")
    g.add_argument(
        "--build-kernels",
        action="store_true",
        help="CPU only: when this machine has no compiled kernels for the pairing yet, build them first (once, a "
        "minute or two) so this reply and every later one runs compiled, about twice as fast; without it such a "
        "reply runs uncompiled (the app and serve build them in the background)",
    )
    _add_drafter_convention_args(g)
    _add_connect_args(g)


def _add_bench_parser(sub: argparse._SubParsersAction) -> None:
    b = sub.add_parser("bench", help="measure tok/s: mlx-lm baseline vs ours, drafter off and on, per block size")
    _add_pairing_args(b)
    b.add_argument("--demo", action="store_true", help="benchmark the offline demo pairing")
    b.add_argument("--prompt", metavar="TEXT", default=None)
    b.add_argument("--max-tokens", type=int, default=128, metavar="N")
    b.add_argument("--block-sizes", default="2,3,4,5,6,auto", metavar="LIST")
    b.add_argument("--repeats", type=int, default=3, metavar="N", help="interleaved repetitions of every run")
    b.add_argument(
        "--simulate-acceptance",
        type=float,
        default=None,
        metavar="ALPHA",
        help="replace each draft by the target's greedy token with probability ALPHA (synthetic checkpoints)",
    )
    b.add_argument(
        "--prefill-tokens",
        type=int,
        default=512,
        metavar="N",
        help="prompt length for the prefill timing, mlx-lm vs ours (0: skip; capped at half the context)",
    )
    b.add_argument("--dtype", choices=["float32", "bfloat16"], default=None)
    b.add_argument("--json", action="store_true")
    b.add_argument(
        "--report", metavar="PATH", default=None, help="also write a Markdown table to paste (machine, device, ratios)"
    )
    _add_drafter_convention_args(b)


def _add_models_parser(sub: argparse._SubParsersAction) -> None:
    m = sub.add_parser("models", help="list, download and remove pairings")
    msub = m.add_subparsers(dest="models_command", metavar="ACTION")
    ml = msub.add_parser("list", help="the pairing catalogue with local status")
    ml.add_argument("--json", action="store_true")
    ml.add_argument("--offline", action="store_true")
    md = msub.add_parser("download", help="download a pairing into the Hugging Face cache")
    md.add_argument(
        "name", metavar="NAME", help="a catalogue pairing (see `models list`) or one repository id owner/name"
    )
    md.add_argument("--offline", action="store_true")
    mr = msub.add_parser("rm", help="remove a pairing's files from the Hugging Face cache")
    mr.add_argument("name", metavar="NAME")
    mr.add_argument("--yes", action="store_true", help="do not ask for confirmation")


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # whoever read the output went away (`gemma-chat generate ... | head`): stop quietly, as `yes | head`
        # does, with the status a shell gives a process ended by SIGPIPE
        discard_stdout()
        return 128 + 13
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        discard_stdout()  # most likely stdout itself (`> /dev/full`): said once, on stderr
        print(f"gemma-chat: cannot write: {e.strerror}", file=sys.stderr)
        return 1


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.version:
        from app import __version__

        print(f"gemma-chat {__version__}")
        sys.stdout.flush()  # here, where a failed write is said (`main`), not at the interpreter's exit
        return 0
    # before anything imports mlx: its compiled CPU kernels go to gemma-chat's private cache, not /tmp
    from core.user.kernel_cache import use_private_kernel_cache

    kernels = use_private_kernel_cache()
    if kernels.problem and kernels.folder is None and args.command is not None:  # the app shows it itself
        print(f"gemma-chat: {kernels.problem}", file=sys.stderr)
    if args.command is None:
        from app.commands.tui import run
    elif args.command == "generate":
        from app.commands.generate import run
    elif args.command == "bench":
        from app.commands.bench import run
    elif args.command == "models":
        if args.models_command is None:
            parser.parse_args(["models", "--help"])
        from app.commands.models import run
    elif args.command == "doctor":
        from app.commands.doctor import run
    elif args.command == "serve":
        from app.commands.serve import run
    else:  # pragma: no cover - argparse rejects unknown commands
        parser.error(f"unknown command {args.command}")
    return int(run(args) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
