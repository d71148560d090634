"""`gemma-chat generate`: one turn, headless.

Plain mode streams the answer to stdout and ends with a one-line summary on stderr (tokens, tok/s,
acceptance, tokens per round). `--json` prints one JSON object per line on stdout, flushed as each
token is decided ({"id", "text", "from_draft", "round"}), then {"stats": {...}}; a failure is
{"error": "..."} with exit status 1.

`--connect URL` runs the turn on a server instead (gemma-chat serve, vLLM or any OpenAI-compatible
one; `--model` then names the server's model); over vLLM, tokens have no origin (`from_draft` null).

`--tools FILE.json` (an OpenAI-style `tools` list) lets the model call them. A call is printed as one
JSON line, `{"tool_call": {"index", "id", "name", "arguments": {...}}}`, among the token lines with
`--json` and on its own line of the answer without; a call the model wrote malformed is
`{"tool_call_error": {"index", "message", "raw"}}`. A reply that ends in calls has stop reason
`tool_calls`, and `--json` then prints `{"messages": [...]}` before the stats: the assistant
message(s) to append to `--messages`, followed by one `{"role": "tool", "tool_call_id", "content"}`
per call, to continue the conversation.

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
from typing import TYPE_CHECKING, Any

from app.commands.common import UsageError, pairing_from_args, printable, remote_engine

if TYPE_CHECKING:
    from core.engine.contract import ChatEngine, PairingSpec
    from core.events import TurnDone
    from core.settings import GenerationSettings


MESSAGES_MAX_BYTES = 16 << 20  # a conversation far beyond any context; bounds what a stray file costs


def read_messages_file(path: str) -> list[dict]:
    """The --messages file, checked: a regular file (a FIFO or /dev/zero would block or never end),
    at most MESSAGES_MAX_BYTES, JSON, and a list of well-formed messages (core.decode.prompt.check_messages)."""
    from core.decode.prompt import check_messages

    what = f"--messages {path}"
    messages = _read_json_file(path, what)
    try:
        check_messages(messages)
    except ValueError as e:
        raise UsageError(f"{what}: {e}") from None
    return messages


def read_tools_file(path: str) -> list[dict]:
    """The --tools file: an OpenAI-style tools list, checked as the engine will render it."""
    from core.decode.chat_format import normalize_tools

    what = f"--tools {path}"
    tools = _read_json_file(path, what)
    try:
        normalize_tools(tools)
        if not tools:
            raise ValueError("the tools list is empty")
    except ValueError as e:
        raise UsageError(f"{what}: {e}") from None
    return tools


def _read_json_file(path: str, what: str) -> Any:
    """A JSON file given on the command line: a regular file of at most MESSAGES_MAX_BYTES, UTF-8, JSON."""
    import os
    import stat

    try:
        # O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise UsageError(f"cannot read {what}: {e.strerror or e}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):  # before fdopen, which refuses a folder with a traceback of its own
        os.close(fd)
        raise UsageError(f"{what} is not a regular file")
    with os.fdopen(fd, "rb") as f:
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
        raise UsageError(f"{what} nests brackets too deeply to be a list") from None
    return messages


def _messages(args: argparse.Namespace) -> list[dict]:
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


def _check_audio(spec: PairingSpec, messages: list[dict] | None, connect: bool) -> None:
    """Refuse audio before the model loads (or a server is asked): a clip that cannot be read, or, on
    this machine, a pairing that takes none or a clip it cannot use. Over --connect the clips go as
    input_audio parts and the server says whether its model hears them."""
    from core.decode.prompt import media_items
    from core.engine.local import no_audio_message
    from core.model.audio_input import AudioError, AudioSpec, audio_source, decode_audio, prepare_audio

    items = media_items(messages or [], "audio")
    if not items:
        return
    if connect:
        for item in items:
            try:
                decode_audio(audio_source(item), 0.0)  # readable and audio: the server decodes it whole
            except AudioError as e:
                raise UsageError(str(e)) from None
        return
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
    """What `generate` prints: the reply as text (plain) or one JSON line per token (--json), tool calls
    as JSON lines in both, the summary or the final stats line, and failures (exit status 1)."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self.out = sys.stdout
        self._mid_line = False  # plain mode: the answer's last character was not a newline

    def on_event(self, e: object) -> None:
        from core.events import Notice, TokenEvent, ToolCall, ToolCallError

        if isinstance(e, Notice):  # stderr in both modes: --json stays one object per line
            print(f"note: {printable(e.text)}", file=sys.stderr, flush=True)
            return
        if isinstance(e, TokenEvent):
            if self.as_json:
                line = {"id": e.id, "text": e.text, "from_draft": e.from_draft, "round": e.round}
                self.out.write(json.dumps(line) + "\n")
            elif e.text:
                self.out.write(printable(e.text))  # model text must not drive the terminal
                self._mid_line = not e.text.endswith("\n")
        elif isinstance(e, ToolCall):
            self._line({"tool_call": {"index": e.index, "id": e.id, "name": e.name, "arguments": e.arguments}})
        elif isinstance(e, ToolCallError):
            self._line({"tool_call_error": {"index": e.index, "message": e.message, "raw": e.raw}})
        else:
            return
        self.out.flush()

    def _line(self, obj: dict) -> None:
        """One JSON object on a line of its own (ensure_ascii: no model text reaches the terminal raw)."""
        if self._mid_line:
            self.out.write("\n")
            self._mid_line = False
        self.out.write(json.dumps(obj) + "\n")

    def fail(self, message: str, *, mid_line: bool = False) -> int:
        if self.as_json:
            self.out.write(json.dumps({"error": message}) + "\n")
            self.out.flush()
        else:
            if mid_line:
                self.out.write("\n")
            print(f"error: {printable(message)}", file=sys.stderr)
        return 1

    def finished(self, done: TurnDone, with_tools: bool) -> int:
        stats = done.stats.as_dict()
        if self.as_json:
            if with_tools:
                self.out.write(json.dumps({"messages": reply_messages(done)}) + "\n")
            self.out.write(json.dumps({"stats": stats}) + "\n")
            self.out.flush()
        else:
            if self._mid_line or not done.tool_calls:
                self.out.write("\n")
            self.out.flush()
            print(_summary(stats), file=sys.stderr)
        return 0


def reply_messages(done: TurnDone) -> list[dict]:
    """The reply as messages for the next `--messages`: its text, then its calls in OpenAI's shape.

    Text written before the calls is a message of its own: Gemma 4's template puts a message's content
    after its calls and results, so one message would not render what the model wrote."""
    from core.decode.prompt import ThinkingMarkers, split_thinking

    thinking, answer = split_thinking(done.text, ThinkingMarkers("<|channel>", "<channel|>"))
    out: list[dict] = []
    if answer.strip() or not done.tool_calls:
        out.append({"role": "assistant", "content": answer})
    if done.tool_calls:
        out.append({"role": "assistant", "content": None, "tool_calls": [c.openai() for c in done.tool_calls]})
    if thinking:  # the template replays it while the turn goes on (after the last user message)
        out[0]["reasoning_content"] = thinking
    return out


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
    from core.user.config import ConfigError, load_config

    output = _Output(args.json)
    try:
        load_config()  # generate takes its settings from its flags, but a broken config is said, as the app says it
    except ConfigError as e:
        return output.fail(str(e))
    try:
        settings = _settings(args)
        if args.no_template and (args.messages or args.image or getattr(args, "audio", None)):
            raise UsageError("--no-template takes --prompt text only (no --messages, --image or --audio)")
        if args.connect and args.no_template:
            raise UsageError("--no-template is local only (a server applies its own chat template)")
        if args.no_template and args.tools:
            raise UsageError("--no-template takes no --tools (the tools go into the chat template's system turn)")
        messages = None if args.no_template else _messages(args)
        tools = read_tools_file(args.tools) if args.tools else None
        if args.connect:
            remote = remote_engine(args)
            engine: ChatEngine = remote
            spec = PairingSpec(name="server", target=remote.url, drafter=None)
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
            future = engine.chat(messages, settings, output.on_event, tools=tools)
        done = _wait(engine, future)
        if done.error:
            return output.fail(done.error, mid_line=True)
        return output.finished(done, with_tools=bool(tools))
    finally:
        engine.close()
