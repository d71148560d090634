"""The README's contract: every command line it shows runs, as a process, and exits as documented.

`readme_commands()` collects every line of the README's ```sh blocks and every inline `code` span that
is a command (it starts with gemma-chat, python, .venv/bin/, curl, ...). Each must be a key of
`COMMANDS`: either the runs that stand for it (the same command on the offline demo pairing, a free
port instead of 8000/8080, a sample image for photo.jpg, short benchmark settings) with the exit
status and the output the README promises, or `Offline(reason)` when it cannot run here. A command
added to the README without an entry fails `test_every_readme_command_has_an_entry`, and an entry
whose command left the README fails it too.

The TUI commands start in tmux, wait for their first screen and quit with Ctrl+Q (exit 0); servers
start, answer, and stop on Ctrl+C (exit 0).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from serve_process import GEMMA_CHAT, ServeProcess
from tmux_session import FAKE_UI, Tmux, _ensure_tmux, shows_ready

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PY = sys.executable
DEMO_TARGET = str(ROOT / "core" / "data" / "demo" / "target")
DEMO_DRAFTER = str(ROOT / "core" / "data" / "demo" / "assistant")
IMAGE = str(ROOT / "assets" / "images" / "chart.png")
PACK_MODELS = ROOT / "tests" / "data" / "pack" / "models"
AUDIO_TARGET = (
    "--model",
    str(PACK_MODELS / "e-style-audio-target"),
    "--drafter",
    str(PACK_MODELS / "e-style-assistant"),
)
UNIFIED_TARGET = str(PACK_MODELS / "unified-style-target")
CLIP = str(ROOT / "tests" / "data" / "pack" / "references" / "audio" / "inputs" / "sine_1s.pcm16.wav")
LONG_CLIP = str(ROOT / "tests" / "data" / "pack" / "references" / "audio" / "inputs" / "long_31s.pcm16.flac")
AUDIO_MESSAGES = str(ROOT / "tests" / "data" / "audio_messages.json")  # a sine_1s audio item and a question
KEY = "readme-test-key"
SERVER = "{server}"  # in a Run's argv: the demo server's URL (started once for the module)
KEYED = "{keyed}"  # the demo server that wants KEY
PORT = "{port}"  # a free loopback port
TMP = "{tmp}"  # a fresh temporary directory

# a program name at the start of an inline span that makes it a command (not a flag or a file name)
_COMMAND_START = re.compile(r"(gemma-chat|python3? |\.venv/bin/|curl |vllm |ssh |apt-get |[A-Z_]+=\S+ \S)")


@dataclass(frozen=True)
class Run:
    """One process that stands for a README command."""

    argv: tuple[str, ...]
    rc: int = 0
    expect: str = ""  # must appear in stdout + stderr (or on the first screen, for a TUI)
    tui: str = ""  # a TUI: the text its first screen shows; it is then quit with Ctrl+Q
    server: bool = False  # a server: it answers /health, then stops on Ctrl+C
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Offline:
    """A README command that cannot run in this test, and why."""

    reason: str


def gc(*args: str, **kw) -> Run:
    return Run((str(GEMMA_CHAT), *args), **kw)


NOT_DOWNLOADED = "is not downloaded"
DEMO_READY = "· ready"
BENCH_SHORT = ("--repeats", "1", "--max-tokens", "8", "--block-sizes", "2,auto", "--prefill-tokens", "16")

COMMANDS: dict[str, tuple[Run, ...] | Offline] = {
    # -- Set up --------------------------------------------------------------------------------------
    "python3 dev.py run": (Run((PY, "dev.py", "run", "--version"), expect="gemma-chat "),),
    "python3 dev.py test": Offline("the README's test command: this test is part of what it runs"),
    "python3 dev.py run --demo": (Run((PY, "dev.py", "run", "--demo"), tui=DEMO_READY),),
    ".venv/bin/gemma-chat": (gc("--version", expect="gemma-chat "),),
    "gemma-chat": (gc(tui="Welcome!"),),  # first start: the models screen over the demo
    # -- Use ------------------------------------------------------------------------------------------
    "gemma-chat --demo": (gc("--demo", tui=DEMO_READY),),
    "gemma-chat --pairing e4b-4bit": (
        gc("--pairing", "e4b-4bit", tui="e4b-4bit is not downloaded yet: press d"),
        gc("--pairing", "e4b-4bit", "--offline", rc=2, expect=NOT_DOWNLOADED),
    ),
    "gemma-chat --model PATH_OR_REPO --drafter PATH_OR_REPO": (
        gc("--model", DEMO_TARGET, "--drafter", DEMO_DRAFTER, tui=DEMO_READY),
    ),
    'gemma-chat --temp 0.7 --system "Be brief."': (
        gc("--demo", "--temp", "0.7", "--system", "Be brief.", tui=DEMO_READY),
    ),
    'gemma-chat generate --pairing e2b --prompt "Why is the sky blue?" [--json] [--image photo.jpg]': (
        gc("generate", "--pairing", "e2b", "--prompt", "Why is the sky blue?", rc=1, expect=NOT_DOWNLOADED),
        gc("generate", "--demo", "--prompt", "Why is the sky blue?", expect="tokens/round"),
        gc("generate", "--demo", "--prompt", "Why is the sky blue?", "--json", expect='"stats"'),
        gc("generate", "--demo", "--prompt", "What is this?", "--image", IMAGE, expect="tokens/round"),
    ),
    # audio: no audio pairing is downloaded here, so the pack's audio-capable checkpoints stand in
    'gemma-chat generate --pairing e4b --audio clip.wav --prompt "Transcribe this."': (
        gc(
            "generate", "--pairing", "e4b", "--audio", CLIP, "--prompt", "Transcribe this.", rc=1, expect=NOT_DOWNLOADED
        ),
        gc("generate", *AUDIO_TARGET, "--audio", CLIP, "--prompt", "Transcribe this.", expect="tokens/round"),
        gc("generate", "--demo", "--audio", CLIP, "--prompt", "Hi", rc=1, expect="does not take audio"),
    ),
    'gemma-chat generate --pairing e2b --audio speech.wav --prompt "Transcribe the following speech segment in '
    'English."': (
        gc(
            "generate",
            *AUDIO_TARGET,
            "--audio",
            LONG_CLIP,
            "--prompt",
            "Transcribe.",
            expect="hears only its first 30 s",
        ),
    ),
    'gemma-chat generate --pairing e4b --audio a.flac --audio b.mp3 --prompt "What differs between the two?"': (
        gc(
            "generate",
            *AUDIO_TARGET,
            "--audio",
            LONG_CLIP,
            "--audio",
            CLIP,
            "--prompt",
            "Two?",
            "--json",
            expect='"stats"',
        ),
    ),
    "gemma-chat generate --pairing 12b --messages chat.json": (
        gc("generate", "--pairing", "12b", "--messages", AUDIO_MESSAGES, rc=1, expect=NOT_DOWNLOADED),
        gc("generate", "--model", UNIFIED_TARGET, "--messages", AUDIO_MESSAGES, expect="tokens/round"),
    ),
    'gemma-chat generate --demo --mcp --yes --prompt "What time is it in Tokyo?"': (
        # the default MCP server (mcp-server-time) runs the call; the demo may answer in prose instead of calling
        gc("generate", "--demo", "--mcp", "--yes", "--prompt", "What time is it in Tokyo?", "--max-tokens", "48"),
    ),
    'gemma-chat generate --demo --build-kernels --prompt "Hi"': (
        # with the suite's uncompiled MLX there is nothing to build: it answers (the build itself, with a stub
        # child, is tests/engine/test_kernels.py's; the real one is a minute of C++)
        gc("generate", "--demo", "--build-kernels", "--prompt", "Hi", expect="tokens/round"),
    ),
    "gemma-chat bench --demo": (gc("bench", "--demo", *BENCH_SHORT, expect="x mlx-lm"),),
    "gemma-chat models list | download NAME [--offline] | rm NAME": (
        gc("models", "list", expect="demo"),
        gc("models", "download", "e2b", "--offline", rc=1, expect="e2b"),
        gc("models", "rm", "e2b", "--yes", expect="e2b"),
    ),
    "gemma-chat doctor": (gc("doctor", expect="MLX"),),
    "gemma-chat models list": (gc("models", "list", expect="e4b-4bit"),),
    "gemma-chat models download NAME": (gc("models", "download", "no-such-pairing", rc=2, expect="no-such-pairing"),),
    # -- Serve ----------------------------------------------------------------------------------------
    "gemma-chat serve": (gc("serve", rc=2, expect="say which model to run"),),
    "gemma-chat serve --pairing e4b-4bit": (gc("serve", "--pairing", "e4b-4bit", rc=2, expect=NOT_DOWNLOADED),),
    "gemma-chat serve --demo --port 8080": (gc("serve", "--demo", "--port", PORT, server=True),),
    'GEMMA_CHAT_API_KEY="$KEY" gemma-chat serve --model DIR --drafter DIR --host 0.0.0.0': (
        gc(
            "serve",
            "--model",
            DEMO_TARGET,
            "--drafter",
            DEMO_DRAFTER,
            "--host",
            "0.0.0.0",
            "--port",
            PORT,
            server=True,
            env={"GEMMA_CHAT_API_KEY": KEY},
        ),
        gc("serve", "--demo", "--host", "0.0.0.0", rc=2, expect="without an API key"),
    ),
    "curl http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' -d "
    '\'{"messages": [{"role": "user", "content": "Why is the sky blue?"}], "stream": true}\'': (
        Run(
            (
                "curl",
                "-sS",
                "-N",
                f"{SERVER}/v1/chat/completions",
                "-H",
                "Content-Type: application/json",
                "-d",
                '{"messages": [{"role": "user", "content": "Why is the sky blue?"}], "stream": true}',
            ),
            expect="data: [DONE]",
        ),
    ),
    "python scripts/bench_serve.py": (
        Run((PY, "scripts/bench_serve.py", "--fake", "--tokens", "50", "--repeats", "1"), expect="tok/s"),
    ),
    "gemma-chat --connect http://127.0.0.1:8000": (
        gc("--connect", SERVER, tui=DEMO_READY),
        gc("--connect", KEYED, tui=DEMO_READY, env={"GEMMA_CHAT_API_KEY": KEY}),  # after the README's export
    ),
    # the README's server is an E2B/E4B/12B one; the demo server here has no audio: its 400, said in one line
    'gemma-chat generate --connect http://127.0.0.1:8000 --audio clip.wav --prompt "What is this sound?"': (
        gc(
            "generate",
            "--connect",
            SERVER,
            "--audio",
            CLIP,
            "--prompt",
            "What is this sound?",
            rc=1,
            expect="does not take audio: Gemma 4 E2B, E4B and 12B do",
        ),  # fmt: skip
    ),
    'gemma-chat generate --connect http://127.0.0.1:8000 --prompt "Hi" --json': (
        gc("generate", "--connect", SERVER, "--prompt", "Hi", "--json", expect='"from_draft": true'),
    ),
    # -- Big models with vLLM -------------------------------------------------------------------------
    'VLLM_API_KEY="$KEY" vllm serve google/gemma-4-31B-it --tensor-parallel-size 2 --max-model-len 8192 '
    '--speculative-config \'{"method": "mtp", "model": "google/gemma-4-31B-it-assistant", '
    '"num_speculative_tokens": 1}\'': Offline(
        "needs vLLM, GPUs and the 31B weights; tests/e2e/test_serve.py's vLLM stand-in "
        "covers what gemma-chat reads from it"
    ),
    "ssh -L 8000:127.0.0.1:8000 gpu-box": Offline("an SSH tunnel to a machine with GPUs"),
    'export GEMMA_CHAT_API_KEY="$KEY"': Offline(
        "a shell assignment, no process: the two commands after it run with it in their environment"
    ),
    'gemma-chat generate --connect http://127.0.0.1:8000 --prompt "Hi"': (
        gc("generate", "--connect", KEYED, "--prompt", "Hi", expect="tokens/round", env={"GEMMA_CHAT_API_KEY": KEY}),
        gc("generate", "--connect", KEYED, "--prompt", "Hi", rc=1, expect="API key"),
    ),
    # -- Development ----------------------------------------------------------------------------------
    ".venv/bin/ruff check .": Offline("the README's test command runs it before pytest starts"),
    ".venv/bin/mypy": Offline("the README's test command runs it before pytest starts"),
    ".venv/bin/lint-imports": Offline("the README's test command runs it before pytest starts"),
    ".venv/bin/pytest tests/unit": Offline("part of this test run"),
    "apt-get install tmux": Offline("a system package (.ci/run installs it)"),
    "GEMMA_CHAT_SLOW=1 .venv/bin/pytest -m slow": Offline(
        "opt-in: a real-shape checkpoint needs ~10 GB of disk and RAM"
    ),
    ".venv/bin/python scripts/fake_ui.py [--delay S]": (Run((*FAKE_UI.split(), "--delay", "0.1"), tui="ready"),),
    "gemma-chat bench": (gc("bench", rc=1, expect="say which model to run"), gc("bench", "--demo", *BENCH_SHORT)),
    "python scripts/build_bench_pairing.py OUT --size small": (
        Run((PY, "scripts/build_bench_pairing.py", TMP, "--size", "small"), expect="--drafter"),
    ),
    "python scripts/hostile_report.py": Offline(
        "runs the hostile test modules, which this suite runs anyway (several minutes: timeouts on purpose)"
    ),
    "python scripts/bench_ui.py": Offline(
        "a benchmark of several minutes (interleaved repeats); scripts are not timed tests"
    ),
}


def readme_commands(text: str) -> list[str]:
    """Every command line the README shows: ```sh lines (continuations joined, comments dropped) and
    inline spans that start like a command."""
    found: list[str] = []
    for block in re.findall(r"```sh\n(.*?)```", text, flags=re.S):
        for line in re.sub(r"\\\n\s*", "", block).splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line:
                found.append(re.sub(r"\s+", " ", line))
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    found += [span for span in re.findall(r"`([^`\n]+)`", prose) if _COMMAND_START.match(span)]
    return list(dict.fromkeys(found))


def test_every_readme_command_has_an_entry():
    shown = readme_commands(README.read_text(encoding="utf-8"))
    missing = [c for c in shown if c not in COMMANDS]
    gone = [c for c in COMMANDS if c not in shown]
    assert not missing, f"README commands with no entry in COMMANDS (add how to run them, or why not): {missing}"
    assert not gone, f"COMMANDS entries the README no longer shows (remove them): {gone}"


# -- running them -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def servers():
    """The demo servers that --connect and curl lines talk to: one open, one behind KEY."""
    with ServeProcess(["--demo"]) as open_server, ServeProcess(["--demo", "--api-key", KEY]) as keyed:
        yield {SERVER: open_server.url, KEYED: keyed.url}


@pytest.fixture
def home(tmp_path):
    """A user with no config, history or downloads: what a new user runs the README's commands as."""
    env = {
        "GEMMA_CHAT_CONFIG": str(tmp_path / "config.toml"),
        "GEMMA_CHAT_DATA_DIR": str(tmp_path / "data"),
        "HF_HUB_OFFLINE": "1",
        "TERM": "xterm-256color",
        "PATH": os.environ.get("PATH", ""),
    }
    # the session's kernel folder and its uncompiled MLX (tests/conftest.py): a cold compile is the
    # cold-kernel tests' subject, not this one's (it was a minute of `gemma-chat bench --demo`)
    for name in ("GEMMA_CHAT_CACHE_DIR", "HF_HOME", "HOME", "GEMMA_CHAT_KERNEL_DIR", "MLX_DISABLE_COMPILE"):
        if name in os.environ:
            env[name] = os.environ[name]
    return env


def _argv(run: Run, servers: dict[str, str], tmp: Path) -> list[str]:
    from serve_process import free_port

    out = []
    for a in run.argv:
        for placeholder, url in servers.items():
            a = a.replace(placeholder, url)
        out.append(a.replace(PORT, str(free_port())).replace(TMP, str(tmp / "out")))
    return out


def _run_tui(argv: list[str], run: Run, env: dict[str, str], tmp: Path) -> None:
    # a shell around the app keeps the pane (and the exit status) after the app is gone
    script = tmp / "run.sh"
    script.write_text(f"cd {shlex.quote(str(ROOT))}\n{shlex.join(argv)}\necho EXIT=$?\nsleep 30\n")
    t = Tmux(_ensure_tmux(), {**env, **run.env}, ["sh", str(script)])
    try:
        # the demo's "ready" reads differently in the side panel and in a narrow screen's compact line
        seen = shows_ready if run.tui == DEMO_READY else (lambda screen: run.tui in screen)
        t.wait(lambda: seen(t.text()) or "EXIT=" in t.text(), f"{run.tui!r} on the first screen", 120)
        assert "EXIT=" not in t.text(), f"the app ended before its first screen:\n{t.text()}"
        t.keys("C-q")
        t.wait(lambda: "EXIT=" in t.text(), "Ctrl+Q to quit", 30)
        assert f"EXIT={run.rc}" in t.text(), t.text()
        assert "Traceback" not in t.text()
    finally:
        t.kill()


def _run_server(argv: list[str], run: Run, env: dict[str, str]) -> None:
    port = argv[argv.index("--port") + 1]
    s = ServeProcess([], port=int(port), env={**env, **run.env})
    s.args = argv  # exactly the README's command, with its port
    s.start(headers={"Authorization": f"Bearer {KEY}"})
    rc, err = s.stop()
    assert rc == run.rc, err
    assert "Traceback" not in err


def _run_plain(argv: list[str], run: Run, env: dict[str, str]) -> None:
    done = subprocess.run(argv, cwd=ROOT, env={**env, **run.env}, capture_output=True, text=True, timeout=300)
    output = done.stdout + done.stderr
    assert done.returncode == run.rc, f"{argv}: exit {done.returncode}, wanted {run.rc}\n{output[-3000:]}"
    assert run.expect in output, f"{argv}: {run.expect!r} not in the output\n{output[-3000:]}"
    assert "Traceback" not in output, output[-3000:]


RUNNABLE = [
    (line, i, run) for line, runs in COMMANDS.items() if not isinstance(runs, Offline) for i, run in enumerate(runs)
]


@pytest.mark.parametrize(("line", "i", "run"), RUNNABLE, ids=[f"{line[:60]}#{i}" for line, i, _ in RUNNABLE])
def test_readme_command_runs_and_exits_as_documented(line, i, run, servers, home, tmp_path):
    if run.argv[0] == "curl" and shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    argv = _argv(run, servers, tmp_path)
    started = time.monotonic()
    if run.tui:
        _run_tui(argv, run, home, tmp_path)
    elif run.server:
        _run_server(argv, run, home)
    else:
        _run_plain(argv, run, home)
    assert time.monotonic() - started < 300
