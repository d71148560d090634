"""`gemma-chat generate`: one turn, headless.

Plain mode streams the answer to stdout and ends with a one-line summary on stderr (tokens, tok/s,
acceptance, tokens per round). `--json` prints one JSON object per line on stdout, flushed as each
token is decided ({"id", "text", "from_draft", "round"}), then {"stats": {...}}; a failure is
{"error": "..."} with exit status 1.

`--connect URL` runs the turn on a server instead (gemma-chat serve, vLLM or any OpenAI-compatible
one; `--model` then names the server's model); over vLLM, tokens have no origin (`from_draft` null).

`--image PATH` (repeatable) puts the images before the prompt text in the user message, at
`--image-budget` soft tokens each (default: the checkpoint's). `--drafter-position` and
`--drafter-window` pick the drafter's conventions (core.model.drafter; they change acceptance only).
"""

from __future__ import annotations

import dataclasses
import json
import sys

from app.cli import printable


class _UsageError(Exception):
    pass


def _pairing(args):
    """The PairingSpec from --demo / --model [--drafter] / --pairing (--no-draft: without its drafter)."""
    from core.hub.pairing import PairingError
    from core.pairing_spec import catalogue_spec, checkpoint_spec, demo_spec

    with_drafter = not getattr(args, "no_draft", False)
    try:
        if getattr(args, "demo", False):
            return demo_spec(drafter=with_drafter, on_notice=lambda m: print(f"note: {printable(m)}", file=sys.stderr))
        if getattr(args, "model", None):
            return checkpoint_spec(args.model, args.drafter if args.drafter and with_drafter else None)
        if getattr(args, "pairing", None):
            return catalogue_spec(args.pairing, drafter=with_drafter)
    except PairingError as e:
        raise _UsageError(str(e)) from e
    raise _UsageError("say which model to run: --model PATH [--drafter PATH], --pairing NAME or --demo")


def _remote(args):
    """(RemoteEngine, spec) for --connect URL; --model names the server's model (default: its first)."""
    import os

    from core.remote import RemoteEngine, RemoteError

    try:
        engine = RemoteEngine(
            args.connect, args.api_key or os.environ.get("GEMMA_CHAT_API_KEY") or None, model=args.model
        )
    except RemoteError as e:
        raise _UsageError(str(e)) from e
    return engine, None


MESSAGES_MAX_BYTES = 16 << 20  # a conversation far beyond any context; bounds what a stray file costs


def read_messages_file(path: str) -> list[dict]:
    """The --messages file, checked: a regular file (a FIFO or /dev/zero would block or never end),
    at most MESSAGES_MAX_BYTES, JSON, and a list of well-formed messages (core.decode.prompt.check_messages)."""
    import os
    import stat

    from core.decode.prompt import check_messages

    what = f"--messages {path}"
    try:
        # O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise _UsageError(f"cannot read {what}: {e.strerror or e}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _UsageError(f"{what} is not a regular file")
        if st.st_size > MESSAGES_MAX_BYTES:
            raise _UsageError(f"{what} is {st.st_size} bytes; the limit is {MESSAGES_MAX_BYTES >> 20} MiB")
        try:
            data = f.read(MESSAGES_MAX_BYTES + 1)
        except OSError as e:
            raise _UsageError(f"cannot read {what}: {e.strerror or e}") from None
    if len(data) > MESSAGES_MAX_BYTES:
        raise _UsageError(f"{what} is larger than {MESSAGES_MAX_BYTES >> 20} MiB")
    try:
        messages = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise _UsageError(f"{what} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise _UsageError(f"{what} is not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}") from None
    except RecursionError:
        raise _UsageError(f"{what} nests brackets too deeply to be a list of messages") from None
    try:
        check_messages(messages)
    except ValueError as e:
        raise _UsageError(f"{what}: {e}") from None
    return messages


def _messages(args) -> list[dict]:
    if args.messages:
        messages = read_messages_file(args.messages)
    else:
        messages = [{"role": "user", "content": args.prompt if args.prompt is not None else ""}]
    if args.image:
        last = messages[-1] if messages and messages[-1].get("role") == "user" else None
        if last is None:
            last = {"role": "user", "content": ""}
            messages.append(last)
        content = last["content"]
        items = [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
        last["content"] = [{"type": "image", "path": p} for p in args.image] + items
    return messages


def _summary(stats: dict) -> str:
    parts = [
        f"{stats['tokens']} tokens",
        f"{stats['decode_tps']:.1f} tok/s",
        f"prefill {stats['prefill_tokens']} tok in {stats['prefill_s']:.2f}s",
        f"ttft {stats['ttft_s']:.2f}s",
    ]
    if stats["drafted"]:
        parts.append(f"acceptance {stats['acceptance']:.0%}")
    parts.append(f"{stats['tokens_per_round']:.2f} tokens/round")
    parts.append(f"stop: {stats['stop_reason']}")
    return " | ".join(parts)


def run(args) -> int:
    from core.engine import Engine, EngineError
    from core.events import TokenEvent
    from core.settings import GenerationSettings

    as_json = args.json
    out = sys.stdout

    def fail(message: str) -> int:
        if as_json:
            out.write(json.dumps({"error": message}) + "\n")
            out.flush()
        else:
            print(f"error: {printable(message)}", file=sys.stderr)
        return 1

    settings = GenerationSettings(
        max_tokens=args.max_tokens,
        temperature=args.temp,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
        block_size=args.block_size,
        drafter_enabled=not args.no_draft,
        ignore_eos=args.ignore_eos,
        thinking=args.thinking,
        system_prompt=args.system,
        image_budget=getattr(args, "image_budget", None),
    )
    connect = getattr(args, "connect", None)
    try:
        settings.validate()
        if connect:
            if args.no_template:
                raise _UsageError("--no-template is local only (a server applies its own chat template)")
            engine, spec = _remote(args)
        else:
            spec = dataclasses.replace(
                _pairing(args),
                dtype=args.dtype,
                drafter_position=getattr(args, "drafter_position", "P-1"),
                drafter_window=getattr(args, "drafter_window", "W"),
            )
        messages = None if args.no_template else _messages(args)
    except (_UsageError, ValueError) as e:
        return fail(str(e))
    if args.no_template and (args.messages or args.image):
        return fail("--no-template takes --prompt text only (no --messages or --image)")

    def on_event(e) -> None:
        if not isinstance(e, TokenEvent):
            return
        if as_json:
            out.write(json.dumps({"id": e.id, "text": e.text, "from_draft": e.from_draft, "round": e.round}) + "\n")
        else:
            out.write(printable(e.text))  # model text must not drive the terminal
        out.flush()

    if not connect:
        engine = Engine()
    try:
        try:
            engine.load(spec, None).result()
        except EngineError as e:
            return fail(str(e))
        if args.no_template:
            future = engine.complete(args.prompt or "", settings, on_event)
        else:
            assert messages is not None  # read above unless --no-template
            future = engine.chat(messages, settings, on_event)
        try:
            done = future.result()
        except KeyboardInterrupt:
            engine.cancel()
            future.result(timeout=30)
            raise
        if done.error:
            if not as_json:
                out.write("\n")
            return fail(done.error)
        stats = done.stats.as_dict()
        if as_json:
            out.write(json.dumps({"stats": stats}) + "\n")
            out.flush()
        else:
            out.write("\n")
            out.flush()
            print(_summary(stats), file=sys.stderr)
        return 0
    finally:
        engine.close()
