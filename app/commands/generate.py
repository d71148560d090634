"""`gemma-chat generate`: one turn, headless.

Plain mode streams the answer to stdout and ends with a one-line summary on stderr (tokens, tok/s,
acceptance, tokens per round). `--json` prints one JSON object per line on stdout, flushed as each
token is decided ({"id", "text", "from_draft", "round"}), then {"stats": {...}}; a failure is
{"error": "..."} with exit status 1.

`--connect URL` runs the turn on a server instead (gemma-chat serve, vLLM or any OpenAI-compatible
one; `--model` then names the server's model); over vLLM, tokens have no origin (`from_draft` null).

`--image PATH` (repeatable) puts the images before the prompt text in the user message, at
`--image-budget` soft tokens each (default: the checkpoint's). `--audio FILE` (repeatable) puts audio
clips there too (after the images): E2B and E4B hear the first 30 s of each (a note on stderr says when
a clip was cut), the 12B up to 5 minutes. Audio needs a local pairing that takes it; the clips are checked
before the model loads. Notes go to stderr in both modes, so `--json` stays one object per line.
`--drafter-position` and `--drafter-window` pick the drafter's conventions (core.model.drafter; they change
acceptance only).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import sys
from typing import TYPE_CHECKING

from app.commands.common import UsageError, pairing_from_args, printable, remote_engine

if TYPE_CHECKING:
    from core.engine.contract import ChatEngine
    from core.events import TurnDone
    from core.settings import GenerationSettings


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
        raise UsageError(f"cannot read {what}: {e.strerror or e}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"{what} is not a regular file")
        if st.st_size > MESSAGES_MAX_BYTES:
            raise UsageError(f"{what} is {st.st_size} bytes; the limit is {MESSAGES_MAX_BYTES >> 20} MiB")
        try:
            data = f.read(MESSAGES_MAX_BYTES + 1)
        except OSError as e:
            raise UsageError(f"cannot read {what}: {e.strerror or e}") from None
    if len(data) > MESSAGES_MAX_BYTES:
        raise UsageError(f"{what} is larger than {MESSAGES_MAX_BYTES >> 20} MiB")
    try:
        messages = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise UsageError(f"{what} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise UsageError(f"{what} is not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}") from None
    except RecursionError:
        raise UsageError(f"{what} nests brackets too deeply to be a list of messages") from None
    try:
        check_messages(messages)
    except ValueError as e:
        raise UsageError(f"{what}: {e}") from None
    return messages


def _messages(args) -> list[dict]:
    if args.messages:
        messages = read_messages_file(args.messages)
    else:
        messages = [{"role": "user", "content": args.prompt if args.prompt is not None else ""}]
    audio = getattr(args, "audio", None) or []
    if args.image or audio:
        last = messages[-1] if messages and messages[-1].get("role") == "user" else None
        if last is None:
            last = {"role": "user", "content": ""}
            messages.append(last)
        content = last["content"]
        items = [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
        attached = [{"type": "image", "path": p} for p in args.image] + [{"type": "audio", "path": p} for p in audio]
        last["content"] = attached + items
    return messages


def _check_audio(spec, messages: list[dict] | None, connect: bool) -> None:
    """Refuse audio before the model loads: over --connect, on a pairing that takes none, or a clip
    that cannot be used."""
    from core.decode.prompt import media_items
    from core.engine.local import no_audio_message
    from core.model.audio_input import AudioError, AudioSpec, audio_source, prepare_audio

    items = media_items(messages or [], "audio")
    if not items:
        return
    if connect:
        raise UsageError("audio needs a local model (--model, --pairing): the server API takes no audio yet")
    audio_spec = AudioSpec.from_model_dir(spec.target)
    if audio_spec is None:
        raise UsageError(no_audio_message(spec.name))
    for item in items:
        try:
            prepare_audio(audio_source(item), audio_spec)
        except AudioError as e:
            raise UsageError(str(e)) from None


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


class _Output:
    """What `generate` prints: the reply as text (plain) or one JSON line per token (--json), the summary
    or the final stats line, and failures (exit status 1)."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self.out = sys.stdout

    def on_event(self, e: object) -> None:
        from core.events import Notice, TokenEvent

        if isinstance(e, Notice):  # stderr in both modes: --json stays one object per line
            print(f"note: {printable(e.text)}", file=sys.stderr, flush=True)
            return
        if not isinstance(e, TokenEvent):
            return
        if self.as_json:
            line = {"id": e.id, "text": e.text, "from_draft": e.from_draft, "round": e.round}
            self.out.write(json.dumps(line) + "\n")
        else:
            self.out.write(printable(e.text))  # model text must not drive the terminal
        self.out.flush()

    def fail(self, message: str, *, mid_line: bool = False) -> int:
        if self.as_json:
            self.out.write(json.dumps({"error": message}) + "\n")
            self.out.flush()
        else:
            if mid_line:
                self.out.write("\n")
            print(f"error: {printable(message)}", file=sys.stderr)
        return 1

    def finished(self, stats: dict) -> int:
        if self.as_json:
            self.out.write(json.dumps({"stats": stats}) + "\n")
            self.out.flush()
        else:
            self.out.write("\n")
            self.out.flush()
            print(_summary(stats), file=sys.stderr)
        return 0


def _settings(args: argparse.Namespace) -> GenerationSettings:
    from core.settings import GenerationSettings

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
    settings.validate()
    return settings


def _wait(engine: ChatEngine, future: concurrent.futures.Future[TurnDone]) -> TurnDone:
    """The turn's end; Ctrl+C cancels it on the engine first (the partial turn ends within a round)."""
    try:
        return future.result()
    except KeyboardInterrupt:
        engine.cancel()
        future.result(timeout=30)
        raise


def run(args: argparse.Namespace) -> int:
    from core.engine.contract import EngineError, PairingSpec

    output = _Output(args.json)
    try:
        settings = _settings(args)
        if args.no_template and (args.messages or args.image or getattr(args, "audio", None)):
            raise UsageError("--no-template takes --prompt text only (no --messages, --image or --audio)")
        if args.connect and args.no_template:
            raise UsageError("--no-template is local only (a server applies its own chat template)")
        messages = None if args.no_template else _messages(args)
        if args.connect:
            engine: ChatEngine = remote_engine(args)
            spec = PairingSpec(name="server", target=args.connect, drafter=None)
        else:
            spec = pairing_from_args(args)
        _check_audio(spec, messages, bool(args.connect))
    except (UsageError, ValueError) as e:
        return output.fail(str(e))
    if not args.connect:
        from core.engine.local import Engine

        local = Engine(kernels="eager-if-cold")  # one reply: uncompiled beats building kernels for it
        engine = local
    try:
        try:
            engine.load(spec, None).result()
        except EngineError as e:
            return output.fail(str(e))
        if messages is None:  # --no-template: BOS + the prompt's tokens (local only, checked above)
            future = local.complete(args.prompt or "", settings, output.on_event)
        else:
            future = engine.chat(messages, settings, output.on_event)
        done = _wait(engine, future)
        if done.error:
            return output.fail(done.error, mid_line=True)
        return output.finished(done.stats.as_dict())
    finally:
        engine.close()
