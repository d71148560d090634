"""`gemma-chat generate` end to end on the pack's tiny checkpoints (in-process, no network)."""

import json

import pytest

from app.cli import main

PACK = "tests/data/pack/models"
REFS = "tests/data/pack/references"


def _pair(family):
    return ["--model", f"{PACK}/{family}-target", "--drafter", f"{PACK}/{family}-assistant"]


def _json_lines(text):
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_json_stream_matches_reference_greedy(capsys):
    ref = json.load(open(f"{REFS}/text/moe-style.json"))["prompts"]["short"]
    rc = main(
        [
            "generate",
            *_pair("moe-style"),
            "--prompt",
            "How do I reverse a list in place?",
            "--json",
            "--block-size",
            "4",
        ]
    )
    lines = _json_lines(capsys.readouterr().out)
    assert rc == 0
    tokens, final = lines[:-1], lines[-1]
    assert [t["id"] for t in tokens] == ref["greedy_eos_stop"]["ids"]
    assert all(set(t) == {"id", "text", "from_draft", "round"} for t in tokens)
    assert "".join(t["text"] for t in tokens) == ref["greedy_eos_stop"]["text_until_eos"]
    s = final["stats"]
    assert s["stop_reason"] == "eos" and s["prompt_tokens"] == len(ref["prompt_ids"])
    assert s["accepted"] == sum(t["from_draft"] for t in tokens) and s["drafted"] > 0
    assert s["block_size_counts"] and 0 <= s["acceptance"] <= 1
    # one token count: the JSON's `tokens` is every token line (the prefill's first included); the
    # rates' decode_tokens is the rounds' share, one fewer
    assert s["tokens"] == len(tokens) and s["decode_tokens"] == len(tokens) - 1


def test_plain_prints_answer_and_summary(capsys):
    ref = json.load(open(f"{REFS}/text/dense-style.json"))["prompts"]["short"]
    # a fixed block size: auto's first reply times plain steps before it drafts, so this 6-token reply
    # would draft nothing, and the summary names acceptance only for a reply that drafted
    rc = main(["generate", *_pair("dense-style"), "--prompt", "How do I reverse a list in place?", "--block-size", "3"])
    out, err = capsys.readouterr()
    assert rc == 0
    assert out == ref["greedy_eos_stop"]["text_until_eos"] + "\n"
    n = len(ref["greedy_eos_stop"]["ids"])
    assert err.startswith(f"{n} tokens | ") and "tok/s" in err and "acceptance" in err and "tokens/round" in err


def test_no_draft_no_template_and_max_tokens(capsys):
    rc = main(
        [
            "generate",
            *_pair("e-style"),
            "--no-draft",
            "--no-template",
            "--prompt",
            "def reverse(items):",
            "--max-tokens",
            "7",
            "--ignore-eos",
            "--json",
        ]
    )
    lines = _json_lines(capsys.readouterr().out)
    assert rc == 0 and len(lines) == 8
    s = lines[-1]["stats"]
    assert s["drafted"] == 0 and not any(t["from_draft"] for t in lines[:-1]) and s["stop_reason"] == "max_tokens"
    from core.model.loader import load_tokenizer

    tok = load_tokenizer(f"{PACK}/e-style-target")
    assert s["prompt_tokens"] == 1 + len(tok.encode("def reverse(items):", add_special_tokens=False))


def test_image_prompt_matches_hf(capsys):
    meta = json.load(open(f"{REFS}/images/dense-style.json"))
    rc = main(
        [
            "generate",
            *_pair("dense-style"),
            "--image",
            f"{REFS}/images/test_image.png",
            "--prompt",
            "Describe this picture in one sentence.",
            "--ignore-eos",
            "--max-tokens",
            "30",
            "--json",
        ]
    )
    lines = _json_lines(capsys.readouterr().out)
    assert rc == 0
    assert [t["id"] for t in lines[:-1]] == meta["hf"]["greedy_ids"]


def test_messages_file_and_system(tmp_path, capsys):
    ref = json.load(open(f"{REFS}/text/e-style.json"))["prompts"]["multiturn"]
    path = tmp_path / "m.json"
    path.write_text(json.dumps(ref["messages"]))
    rc = main(["generate", *_pair("e-style"), "--messages", str(path), "--json", "--max-tokens", "40"])
    lines = _json_lines(capsys.readouterr().out)
    assert rc == 0 and [t["id"] for t in lines[:-1]] == ref["greedy_eos_stop"]["ids"]
    # --system becomes the system turn of the rendered prompt
    from core.decode.prompt import encode_messages
    from core.model.loader import load_tokenizer

    rc = main(["generate", *_pair("e-style"), "--system", "Be brief.", "--prompt", "Hi", "--json", "--max-tokens", "1"])
    stats = _json_lines(capsys.readouterr().out)[-1]["stats"]
    tok = load_tokenizer(f"{PACK}/e-style-target")
    want = encode_messages(tok, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    assert rc == 0 and stats["prompt_tokens"] == len(want)


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--model", f"{PACK}/e-style-target", "--drafter", f"{PACK}/moe-style-assistant"], "does not fit"),
        (["--model", f"{PACK}/e-style-assistant"], "not a target"),
        (["--model", "/no/such/dir"], "no such checkpoint"),
        ([], "--model"),
        (["--model", f"{PACK}/e-style-target", "--top-p", "0"], "top_p"),
    ],
)
def test_errors_are_one_json_line_and_status_1(argv, message, capsys):
    rc = main(["generate", *argv, "--prompt", "hi", "--json"])
    out = capsys.readouterr().out
    assert rc == 1
    assert message in json.loads(out.strip().splitlines()[-1])["error"]


def test_demo_uses_the_demo_pairing(monkeypatch, capsys):
    from pathlib import Path

    import core.hub.demo

    monkeypatch.setattr(
        core.hub.demo,
        "ensure_demo_pairing",
        lambda: (Path(f"{PACK}/e-style-target"), Path(f"{PACK}/e-style-assistant")),
    )
    rc = main(
        [
            "generate",
            "--demo",
            "--prompt",
            "How do I reverse a list in place?",
            "--max-tokens",
            "12",
            "--block-size",
            "3",
            "--json",
        ]
    )
    lines = _json_lines(capsys.readouterr().out)
    ref = json.load(open(f"{REFS}/text/e-style.json"))["prompts"]["short"]
    assert rc == 0 and [t["id"] for t in lines[:-1]] == ref["greedy_no_eos_stop"]["ids"][:12]
    assert lines[-1]["stats"]["drafted"] > 0


class _Terminal:
    """stdout and stderr of one terminal: what each wrote, in order; stderr says it is a tty."""

    def __init__(self) -> None:
        self.log: list[tuple[str, str]] = []

    def stream(self, name: str, tty: bool):  # type: ignore[no-untyped-def]
        term = self

        class Stream:
            def write(self, text: str) -> int:
                term.log.append((name, text))
                return len(text)

            def flush(self) -> None:
                pass

            def isatty(self) -> bool:
                return tty

        return Stream()


def test_a_long_prefill_shows_its_progress_on_a_terminal_and_wipes_it_before_the_reply(monkeypatch):
    """On a terminal, a prefill still running after PREFILL_NOTE_AFTER_S redraws one stderr line with the
    tokens done and the time left; the line is wiped before the reply's first character; without a
    terminal nothing is drawn."""
    from app.commands import generate

    monkeypatch.setattr(generate, "PREFILL_NOTE_AFTER_S", 0.0)
    monkeypatch.setattr(generate, "POLL_S", 0.005)
    prompt = "the cat sat on the mat. " * 600  # 5,4xx tokens: several prefill chunks on the demo
    for tty in (True, False):
        term = _Terminal()
        monkeypatch.setattr("sys.stdout", term.stream("out", False))
        monkeypatch.setattr("sys.stderr", term.stream("err", tty))
        assert main(["generate", "--demo", "--max-tokens", "4", "--prompt", prompt]) == 0
        drawn = [t for w, t in term.log if w == "err" and t.startswith("\rprefilling the prompt: ")]
        first_out = next(i for i, (w, t) in enumerate(term.log) if w == "out" and t.strip())
        if not tty:
            assert not drawn
            continue
        assert len(drawn) >= 2, term.log[:5]
        assert any(" s left" in t and " of 5,4" in t and ": 0 of" not in t for t in drawn), set(drawn)
        last_draw = max(i for i, (w, t) in enumerate(term.log) if t in drawn)
        wipes = [i for i, (w, t) in enumerate(term.log) if w == "err" and t == "\r\x1b[K"]
        assert any(last_draw < i < first_out for i in wipes)  # gone before the reply starts


@pytest.mark.parametrize("argv", [["generate", "--demo", "--prompt", "hi"], ["models", "list"]])
def test_a_reader_that_goes_away_ends_the_command_quietly(argv):
    """`gemma-chat generate ... | head -c 5`: once the pipe's reader is gone, the turn is cancelled and the
    process ends at once with the status of a SIGPIPE (141), no traceback: it spewed one per token and went
    on decoding to max_tokens."""
    import subprocess
    import sys
    import time

    more = ["--max-tokens", "20000", "--ignore-eos"] if argv[0] == "generate" else []
    proc = subprocess.Popen(
        [sys.executable, "-m", "app", *argv, *more], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.read(3)  # the first bytes, then the reader goes away
    proc.stdout.close()
    t0 = time.monotonic()
    err = proc.communicate(timeout=60)[1]
    assert proc.returncode == 141, err
    assert "Traceback" not in err and "Broken pipe" not in err, err
    assert time.monotonic() - t0 < 20  # 20,000 tokens would take minutes


def _generate_process(args, stdin_text, shell_tail=""):
    import subprocess
    import sys

    cmd = " ".join([sys.executable, "-m", "app", "generate", "--demo", "--json", "--max-tokens", "3", *args])
    data = stdin_text if isinstance(stdin_text, bytes) else stdin_text.encode()
    out = subprocess.run(f"({cmd}){shell_tail}", shell=True, input=data, capture_output=True, timeout=120)
    return subprocess.CompletedProcess(out.args, out.returncode, out.stdout.decode(), out.stderr.decode())


def test_the_prompt_can_come_from_stdin(capsys):
    """A pipe is the prompt when nothing else is asked (`echo ... | gemma-chat generate`), `--prompt -` reads
    stdin explicitly (`--messages -` a conversation), and each asks exactly what --prompt would; an empty or
    non-UTF-8 stdin is refused."""
    assert main(["generate", "--demo", "--json", "--max-tokens", "3", "--prompt", "Why is the sky blue?"]) == 0
    want = _json_lines(capsys.readouterr().out)
    as_messages = json.dumps([{"role": "user", "content": "Why is the sky blue?"}])
    for args, text in (
        ([], "Why is the sky blue?\n"),
        (["--prompt", "-"], "Why is the sky blue?"),
        (["--messages", "-"], as_messages),
    ):
        out = _generate_process(args, text)
        assert out.returncode == 0, out.stderr
        got = _json_lines(out.stdout)
        assert [e["id"] for e in got[:-1]] == [e["id"] for e in want[:-1]]
        assert got[-1]["stats"]["prompt_tokens"] == want[-1]["stats"]["prompt_tokens"]
    out = _generate_process([], "  \n")
    assert out.returncode == 1 and "the prompt on stdin is empty" in out.stdout
    out = _generate_process(["--prompt", "-"], b"caf\xe9")  # Latin-1
    assert out.returncode == 1 and "the prompt on stdin is not UTF-8 text (byte 3 of 4)" in out.stdout


def test_stdin_is_left_alone_when_the_prompt_is_given(monkeypatch, capsys):
    """`while read q; do gemma-chat generate --prompt "$q"; done < questions`: a command that was given its
    prompt leaves stdin to the loop; with nothing to ask and a terminal for stdin it says what to give."""
    out = _generate_process(["--prompt", "hi"], "second\nthird\n", shell_tail="; cat")
    assert out.returncode == 0 and out.stdout.splitlines()[-2:] == ["second", "third"]

    class Terminal:
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr("sys.stdin", Terminal())
    assert main(["generate", "--demo", "--json"]) == 1
    assert "nothing to ask: give --prompt TEXT" in capsys.readouterr().out
    # an empty --prompt (a script's unset variable) is refused as an empty stdin is, not answered
    for empty in ("", "  \n"):
        assert main(["generate", "--demo", "--prompt", empty]) == 1
        assert "error: --prompt is empty: nothing to ask" in capsys.readouterr().err
    # text from nothing but the BOS is a question without the chat template
    assert main(["generate", "--demo", "--no-template", "--prompt", "", "--max-tokens", "3"]) == 0


@pytest.mark.skipif(not __import__("os").path.exists("/dev/full"), reason="needs /dev/full (Linux)")
@pytest.mark.parametrize(
    "argv",
    [
        ["generate", "--demo", "--prompt", "hi"],
        ["generate", "--demo", "--prompt", "hi", "--json"],
        ["models", "list"],
        ["--help"],  # argparse dropped the failed write: nothing said, status 0
        ["serve", "--help"],
        ["models"],  # its help, asked for by the command
        ["--version"],  # a traceback
    ],
)
def test_a_full_disk_under_stdout_is_said_once(argv):
    """`> /dev/full`: one sentence on stderr and status 1; it was a traceback per token."""
    import subprocess
    import sys

    with open("/dev/full", "w") as full:
        run = subprocess.run(
            [sys.executable, "-m", "app", *argv], stdout=full, stderr=subprocess.PIPE, text=True, timeout=120
        )
    assert run.returncode == 1, run.stderr
    assert run.stderr.count("No space left on device") == 1 and "Traceback" not in run.stderr, run.stderr


def test_the_kernel_build_line_is_redrawn_on_a_terminal_and_ctrl_c_wipes_only_it(monkeypatch):
    """`--build-kernels` on a terminal: one line redrawn in place, cut to the terminal's width; Ctrl+C while it
    shows wipes it, and Ctrl+C during the reply after it wipes nothing (the reply's own line would go)."""
    import io
    import os

    from app.commands.generate import KernelBuildProgress
    from core.events import KernelProgress

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr("shutil.get_terminal_size", lambda *a: os.terminal_size((30, 24)))
    term = Terminal()
    progress = KernelBuildProgress("demo", term)
    progress.on_event(KernelProgress(0.5, steps_done=12, steps=24, kernels=31))
    assert term.getvalue() == "\r" + "building kernels (once): 50%, step 12 of 24, 31 built"[:29] + "\x1b[K"
    progress.interrupted()
    assert term.getvalue().endswith("\r\x1b[K")
    progress.on_event(KernelProgress(1.0, done=True))  # the killed child's end: nothing more is said
    assert term.getvalue().endswith("\r\x1b[K")

    term = Terminal()
    progress = KernelBuildProgress("demo", term)
    progress.on_event(KernelProgress(0.5, steps_done=12, steps=24, kernels=31))
    progress.on_event(KernelProgress(1.0, done=True))
    assert term.getvalue().endswith("\r\x1b[Kbuilt the compiled kernels for demo in 0 s\n")
    before = term.getvalue()
    progress.interrupted()
    assert term.getvalue() == before
