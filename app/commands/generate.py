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
per call, to continue the conversation. `--tool-choice required|NAME|none` forces a call (or declares no
tools): core.decode.forced.

`--mcp` adds the tools of config.toml's MCP servers and runs their calls once allowed (`--yes`, a trusted
server, or an answer on the terminal), each result a `{"tool_result": ...}` line, and the model goes on
with them (app.commands.generate_tools). `{"messages": [...]}` then holds every message the run added.

`--image PATH` (repeatable) puts the images before the prompt text in the user message, at
`--image-budget` soft tokens each (default: the checkpoint's). `--audio FILE` (repeatable) puts audio
clips there too (after the images): E2B and E4B hear the first 30 s of each (a note on stderr says when
a clip was cut), the 12B up to 5 minutes. Audio needs a local pairing that takes it; the clips are checked
before the model loads. Notes go to stderr in both modes, so `--json` stays one object per line. On a
terminal, a prefill that takes longer than PREFILL_NOTE_AFTER_S (a long pasted prompt) shows its progress
on stderr, on one line redrawn in place and wiped before the reply starts.
`--drafter-position` and `--drafter-window` pick the drafter's conventions (core.model.drafter; they change
acceptance only).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import shutil
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from app.commands.common import UsageError, discard_stdout, pairing_from_args, printable, remote_engine
from app.prefill_eta import PrefillClock

if TYPE_CHECKING:
    from app.commands.generate_tools import CallRunner
    from core.engine.contract import ChatEngine, PairingSpec
    from core.events import TurnDone
    from core.settings import GenerationSettings
    from core.user.config import Config
    from core.user.mcp_client import McpHub


MESSAGES_MAX_BYTES = 16 << 20  # a conversation far beyond any context; bounds what a stray file costs
PREFILL_NOTE_AFTER_S = 2.0  # a prefill still running after this long shows its progress (on a terminal)
POLL_S = 0.25


def read_messages_file(path: str) -> list[dict]:
    """The --messages file ('-': stdin), checked: a regular file (a FIFO or /dev/zero would block or never
    end), at most MESSAGES_MAX_BYTES, JSON, and a list of well-formed messages (core.decode.prompt.check_messages)."""
    from core.decode.prompt import check_messages

    if path == "-":
        what = "the messages on stdin"
        messages = _parse_json(_stdin_bytes(what), what)
    else:
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
    """A JSON file given on the command line: a regular file of at most MESSAGES_MAX_BYTES, UTF-8, JSON
    (`_parse_json`)."""
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
    return _parse_json(data, what)


def _stdin_bytes(what: str) -> bytes:
    """All of stdin (`--prompt -`, `--messages -`), at most MESSAGES_MAX_BYTES."""
    if sys.stdin is None:
        raise UsageError(f"{what}: there is no standard input to read")
    data = sys.stdin.buffer.read(MESSAGES_MAX_BYTES + 1)
    if len(data) > MESSAGES_MAX_BYTES:
        raise UsageError(f"{what} is larger than {MESSAGES_MAX_BYTES >> 20} MiB")
    return data


def _parse_json(data: bytes, what: str) -> Any:
    try:
        messages = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise UsageError(f"{what} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise UsageError(f"{what} is not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}") from None
    except RecursionError:
        raise UsageError(f"{what} nests brackets too deeply to be a list") from None
    return messages


def read_prompt(args: argparse.Namespace) -> None:
    """`--prompt -`, or nothing to ask at all (no prompt, messages or media) with stdin piped in: the
    prompt is stdin's text (`cat notes.txt | gemma-chat generate`). With nothing to ask and nothing piped,
    say what to give instead of sending an empty message. Stdin is read only then: a script's loop that
    runs generate with --prompt keeps the rest of its input."""
    media = args.image or getattr(args, "audio", None)
    empty = args.prompt is not None and args.prompt != "-" and not args.prompt.strip()
    if empty and not media and not getattr(args, "no_template", False):
        # as an empty stdin is (a script's unset variable, `--prompt "$q"`): the demo would greet it, a real
        # model answer something, and neither is what was meant. --no-template with nothing after the BOS
        # asks for text from nothing, which is a question
        raise UsageError("--prompt is empty: nothing to ask (give the question, or an --image/--audio to ask about)")
    asks = args.prompt is not None or args.messages or media
    piped = sys.stdin is not None and not sys.stdin.isatty()
    if args.prompt != "-" and (asks or not piped):
        if not asks:
            raise UsageError(
                "nothing to ask: give --prompt TEXT, --messages FILE.json or an --image/--audio, or pipe the "
                "prompt in (echo 'Why is the sky blue?' | gemma-chat generate ...)"
            )
        return
    data = _stdin_bytes("the prompt on stdin")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"the prompt on stdin is not UTF-8 text (byte {e.start} of {len(data)})") from None
    if not text.strip():
        raise UsageError("the prompt on stdin is empty")
    args.prompt = text.rstrip("\n")


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
        self.progress: PrefillProgress | None = None  # the running turn's, on a terminal
        # writing to stdout failed: its reader went away (`| head`) or the disk is full; the turn is cancelled (_wait)
        self.write_error: OSError | None = None

    @property
    def broken(self) -> bool:
        return self.write_error is not None

    def on_event(self, e: object) -> None:
        if self.broken:
            return
        try:
            self._show(e)
        except OSError as err:  # stdout's write (the engine's own errors end the turn, not here)
            self.write_error = err

    def write_failed(self) -> int:
        """After a failed write to stdout: a closed pipe ends quietly (app.cli, status 141), any other
        failure is said once on stderr (status 1)."""
        err = self.write_error
        assert err is not None
        if isinstance(err, BrokenPipeError):
            raise err
        discard_stdout()
        print(f"error: cannot write the answer: {err.strerror or err}", file=sys.stderr)
        return 1

    def _show(self, e: object) -> None:
        from core.events import Notice, PrefillDone, TokenEvent, ToolCall, ToolCallError

        if self.progress is not None:
            self.progress.clear(over=isinstance(e, (PrefillDone, TokenEvent)))
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

    def tool_result(self, call_id: str, name: str, content: str, is_error: bool) -> None:
        self._line({"tool_result": {"id": call_id, "name": name, "content": content, "is_error": is_error}})
        self.out.flush()

    def finished(self, done: TurnDone, with_tools: bool, added: list[dict] | None = None) -> int:
        stats = done.stats.as_dict()
        if self.as_json:
            if with_tools:
                self.out.write(json.dumps({"messages": (added or []) + reply_messages(done)}) + "\n")
            self.out.write(json.dumps({"stats": stats}) + "\n")
            self.out.flush()
        else:
            if self._mid_line or not (done.tool_calls or done.tool_errors):  # a JSON line ended the line
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


def _tool_choice(args: argparse.Namespace, tools: list[dict] | None) -> tuple[list[dict] | None, str | None]:
    """--tool-choice: (the tools to declare, GenerationSettings.tool_choice)."""
    from core.decode.forced import REQUIRED

    choice = getattr(args, "tool_choice", None) or "auto"
    if choice == "auto":
        return tools, None
    if not tools:
        raise UsageError("--tool-choice needs tools (--tools FILE or --mcp)")
    if choice == "none":
        return None, None
    if choice == "required":
        return tools, REQUIRED
    names = [t["function"]["name"] for t in tools]
    if choice not in names:
        raise UsageError(f"--tool-choice {choice}: no such tool (the tools are {', '.join(names)})")
    return tools, choice


def _converse(
    engine: ChatEngine,
    messages: list[dict],
    settings: GenerationSettings,
    tools: list[dict] | None,
    runner: CallRunner | None,
    output: _Output,
) -> tuple[TurnDone, list[dict]]:
    """The turn and, with an MCP runner, one more after each round of calls that ran: (the last turn's
    TurnDone, the messages the rounds before it added: their replies and the tools' results)."""
    import dataclasses

    from app.commands.generate_tools import MAX_ROUNDS, tool_messages

    added: list[dict] = []
    for round_no in range(MAX_ROUNDS + 1):
        done = _wait(engine, engine.chat(messages + added, settings, output.on_event, tools=tools), output)
        if done.error or output.broken or not done.tool_calls or runner is None or not runner.runnable(done.tool_calls):
            break
        if round_no == MAX_ROUNDS:
            print(f"note: stopped after {MAX_ROUNDS} rounds of tool calls", file=sys.stderr)
            break
        outcomes = [runner.run(c) for c in done.tool_calls]
        for c, o in zip(done.tool_calls, outcomes):
            output.tool_result(c.id, c.name, o.content, o.is_error)
        added += reply_messages(done) + tool_messages(done.tool_calls, outcomes)
        settings = dataclasses.replace(settings, tool_choice=None)  # a forced call is the first reply's only
    return done, added


def _note(text: str) -> None:
    print(f"note: {printable(text)}", file=sys.stderr, flush=True)


class KernelBuildProgress:
    """`--build-kernels` on a machine without the pairing's kernels: the build's progress on stderr (one line
    redrawn in place on a terminal; elsewhere a line when it starts and one when it ends)."""

    def __init__(self, name: str, stream: Any) -> None:
        self.name, self.stream = name, stream
        self.tty = stream.isatty()
        self.t0: float | None = None
        self.quiet = False  # Ctrl+C: the build is being stopped, nothing more to say about it
        self.shown = False  # the progress line is on the terminal now

    def interrupted(self) -> None:
        """Ctrl+C: closing the engine stops the build, which is no failure to report; the line goes."""
        self.quiet = True
        if self.shown:  # not after the build: the reply's own line would go
            try:
                self.stream.write("\r\x1b[K")
                self.stream.flush()
            except OSError:
                pass

    def on_event(self, e: object) -> None:
        from core.events import KernelProgress

        if not isinstance(e, KernelProgress) or self.quiet:
            return
        try:
            self._show(e)
        except OSError:  # stderr gone: the build goes on, unseen
            pass

    def _show(self, e: Any) -> None:
        what = f"building the compiled kernels for {self.name} on this machine (once)"
        if self.t0 is None:
            self.t0 = time.monotonic()
            if not self.tty:
                print(f"{what}: a minute or two ...", file=self.stream, flush=True)
        if e.done:
            wipe = "\r\x1b[K" if self.shown else ""
            self.shown = False
            if e.error:
                print(
                    f"{wipe}note: the kernels were not built ({printable(e.error)}): this reply runs uncompiled",
                    file=self.stream,
                    flush=True,
                )
            else:
                took = time.monotonic() - self.t0
                print(f"{wipe}built the compiled kernels for {self.name} in {took:.0f} s", file=self.stream, flush=True)
        elif self.tty:
            steps = f", step {e.steps_done} of {e.steps}" if e.steps else ""
            line = f"building kernels (once): {e.fraction:.0%}{steps}, {e.kernels} built"
            width = shutil.get_terminal_size().columns - 1  # one row: `\r` redraws only the cursor's row
            self.stream.write(f"\r{line[:width]}\x1b[K")
            self.stream.flush()
            self.shown = True


class PrefillProgress:
    """A long prefill's progress on stderr, one line redrawn in place: "prefilling the prompt: 12,288 of
    40,000 tokens (30 %), about 75 s left". Drawn from the waiting thread, wiped (under a lock) by the
    engine's first event that prints, for good once the prefill is done."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.lock = threading.Lock()
        self.shown = False
        self.over = False
        self.clock: PrefillClock | None = None

    def draw(self, engine: ChatEngine) -> None:
        started = engine.prefilling
        if started is None or started.done is None or started.prefill_tokens <= 0:
            return
        elapsed = time.monotonic() - started.started
        if elapsed < PREFILL_NOTE_AFTER_S:
            return
        total, done = started.prefill_tokens, min(started.done(), started.prefill_tokens)
        if self.clock is None or self.clock.started != started.started:
            self.clock = PrefillClock(started.started)
        seconds = self.clock.seconds_left(done, total)
        left = f", about {seconds:.0f} s left" if seconds is not None else ""
        line = f"prefilling the prompt: {done:,} of {total:,} tokens ({100 * done // total} %){left}"
        with self.lock:
            if not self.over:
                self.stream.write(f"\r{line}\x1b[K")
                self.stream.flush()
                self.shown = True

    def clear(self, over: bool) -> None:
        """Wipe the line (before anything else prints); over: the prefill is done, draw no more."""
        with self.lock:
            if self.shown:
                self.stream.write("\r\x1b[K")
                self.stream.flush()
                self.shown = False
            self.over = self.over or over


def _wait(engine: ChatEngine, future: concurrent.futures.Future[TurnDone], output: _Output) -> TurnDone:
    """The turn's end; Ctrl+C cancels it on the engine first (the partial turn ends within a round), and so
    does a failed write to stdout. With stderr a terminal, a long prefill's progress shows meanwhile."""
    progress = output.progress = PrefillProgress(sys.stderr) if sys.stderr.isatty() else None
    cancelled = False
    try:
        while True:
            try:
                return future.result(timeout=POLL_S)
            except concurrent.futures.TimeoutError:
                if output.broken and not cancelled:  # nobody reads the rest: stop the turn within a round
                    engine.cancel()
                    cancelled = True
                if progress is not None:
                    progress.draw(engine)
    except KeyboardInterrupt:
        engine.cancel()
        future.result(timeout=30)
        raise
    finally:
        if progress is not None:
            progress.clear(over=True)


def run(args: argparse.Namespace) -> int:
    from core.engine.contract import EngineError, PairingSpec
    from core.user.config import ConfigError, load_config

    output = _Output(args.json)
    try:
        config = load_config()  # generate takes its settings from its flags, but a broken config is said
    except ConfigError as e:
        return output.fail(str(e))
    try:
        settings = _settings(args)
        read_prompt(args)
        if args.no_template and (args.messages or args.image or getattr(args, "audio", None)):
            raise UsageError("--no-template takes --prompt text only (no --messages, --image or --audio)")
        if args.connect and args.no_template:
            raise UsageError("--no-template is local only (a server applies its own chat template)")
        if args.no_template and args.tools:
            raise UsageError("--no-template takes no --tools (the tools go into the chat template's system turn)")
        if args.no_template and getattr(args, "mcp", False):
            raise UsageError("--no-template takes no --mcp (the tools go into the chat template's system turn)")
        messages = None if args.no_template else _messages(args)
        tools = read_tools_file(args.tools) if args.tools else None
        if args.connect and args.build_kernels:
            raise UsageError("--build-kernels is local only (a server builds its own)")
        if args.connect:
            remote = remote_engine(args)
            engine: ChatEngine = remote
            spec = PairingSpec(name="server", target=remote.url, drafter=None)
        else:
            spec = pairing_from_args(args)
        _check_audio(spec, messages, bool(args.connect))
    except (UsageError, ValueError) as e:
        return output.fail(str(e))
    local = None
    if not args.connect:
        from core.engine.local import Engine

        # one reply: uncompiled beats building kernels for it, unless asked to build them for later replies too
        local = Engine(kernels="build-first" if args.build_kernels else "eager-if-cold")
        engine = local
    hub = None
    builder = KernelBuildProgress(spec.name, sys.stderr)
    try:
        try:
            engine.load(spec, builder.on_event).result()
            hub, runner, tools = _mcp(args, config, tools)
            tools, settings.tool_choice = _tool_choice(args, tools)
        except (EngineError, UsageError) as e:
            return output.fail(str(e))
        added: list[dict] = []
        if messages is None:  # --no-template: BOS + the prompt's tokens (local only, checked above)
            assert local is not None
            done = _wait(engine, local.complete(args.prompt or "", settings, output.on_event), output)
        else:
            done, added = _converse(engine, messages, settings, tools, runner, output)
        if output.broken:
            return output.write_failed()
        if done.error:
            return output.fail(done.error, mid_line=True)
        try:
            code = output.finished(done, with_tools=bool(tools), added=added)
        except OSError as err:
            output.write_error = err
            return output.write_failed()
        if local is not None and local.kernels_missing:
            _note(
                f"this reply ran uncompiled, at about half speed: this machine has no compiled kernels for {spec.name} "
                "yet. Add --build-kernels once to build them (a minute or two); every reply after that runs "
                "compiled. The app and serve build them in the background."
            )
        return code
    except KeyboardInterrupt:
        builder.interrupted()
        raise
    finally:
        engine.close()
        if hub is not None:
            hub.close()


def _mcp(
    args: argparse.Namespace, config: Config, tools: list[dict] | None
) -> tuple[McpHub | None, CallRunner | None, list[dict] | None]:
    """--mcp: the started hub, the runner of its calls, and the tools with the servers' added."""
    if not getattr(args, "mcp", False):
        if getattr(args, "yes", False):
            raise UsageError("--yes runs MCP tools: it needs --mcp")
        return None, None, tools
    from app.commands.generate_tools import CallRunner, merged_tools, start_hub

    hub = start_hub(config, _note)
    try:
        merged = merged_tools(tools, hub)
    except UsageError:
        hub.close()
        raise
    runner = CallRunner(hub, bool(args.yes), sys.stdin if sys.stdin.isatty() else None, _note)
    return hub, runner, merged
