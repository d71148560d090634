"""`gemma-chat generate --tools`: calls printed as JSON, the conversation continued with --messages.

In-process like test_generate_cli.py, on the reference pack's dense-style pairing. The pack's model
never calls a tool by itself, so support.scripted_calls makes the target write the call (the
drafter and everything else are real); the continuation turn runs unscripted.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.tools import GET_CURRENT_TIME

from app.cli import main
from core.decode.prompt import encode_chat

PACK = Path("tests/data/pack/models")
PAIR = ["--model", str(PACK / "dense-style-target"), "--drafter", str(PACK / "dense-style-assistant")]
TOOLS = [GET_CURRENT_TIME]
ASK = "What time is it in Paris?"
REPLY = 'On it.<|tool_call>call:get_current_time{timezone:<|"|>Europe/Paris<|"|>}<tool_call|><|tool_response>'


@pytest.fixture(scope="module")
def tokenizer():
    from mlx_lm.tokenizer_utils import load

    return load(PACK / "tokenizer")


@pytest.fixture
def tools_file(tmp_path) -> Path:
    path = tmp_path / "tools.json"
    path.write_text(json.dumps(TOOLS))
    return path


@pytest.fixture
def scripted(monkeypatch, tokenizer):
    from support.scripted_calls import script_reply

    start = len(encode_chat(tokenizer, [{"role": "user", "content": ASK}], tools=TOOLS).ids)
    script_reply(monkeypatch, start, tokenizer._tokenizer.encode(REPLY, add_special_tokens=False))
    return monkeypatch


def _lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_json_prints_the_call_and_the_messages_to_continue(capsys, tools_file, scripted, tmp_path, tokenizer):
    rc = main(["generate", *PAIR, "--tools", str(tools_file), "--prompt", ASK, "--json"])
    lines = _lines(capsys.readouterr().out)
    assert rc == 0
    tokens = [x for x in lines if "id" in x]
    [call] = [x["tool_call"] for x in lines if "tool_call" in x]
    assert (call["index"], call["name"], call["arguments"]) == (0, "get_current_time", {"timezone": "Europe/Paris"})
    assert call["id"].startswith("call_")
    assert "".join(t["text"] for t in tokens) == "On it."  # the call's tokens carry no text
    # the call line comes right after the token that closed it, before the stop token's line
    at = lines.index({"tool_call": call})
    assert "id" in lines[at - 1] and lines[at + 1]["id"] == tokens[-1]["id"]
    [messages] = [x["messages"] for x in lines if "messages" in x]
    assert messages == [
        {"role": "assistant", "content": "On it."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call["id"],
                    "type": "function",
                    "function": {"name": "get_current_time", "arguments": '{"timezone": "Europe/Paris"}'},
                }
            ],
        },
    ]
    assert lines[-1]["stats"]["stop_reason"] == "tool_calls"

    # a script continues: the reply's messages, the tool's result, and the model answers (unscripted)
    scripted.undo()
    history = [{"role": "user", "content": ASK}, *messages]
    history.append({"role": "tool", "tool_call_id": call["id"], "content": '{"datetime": "10:04"}'})
    path = tmp_path / "messages.json"
    path.write_text(json.dumps(history))
    rc = main(["generate", *PAIR, "--tools", str(tools_file), "--messages", str(path), "--json", "--max-tokens", "6"])
    lines = _lines(capsys.readouterr().out)
    assert rc == 0, lines
    stats = lines[-1]["stats"]
    assert stats["prompt_tokens"] == len(encode_chat(tokenizer, history, tools=TOOLS).ids)
    assert stats["reused_tokens"] == 0  # a new process: nothing cached
    assert stats["stop_reason"] in ("eos", "max_tokens")


def test_plain_shows_the_call_as_json_on_its_own_line(capsys, tools_file, scripted):
    rc = main(["generate", *PAIR, "--tools", str(tools_file), "--prompt", ASK])
    out, err = capsys.readouterr()
    assert rc == 0
    text, call_line, rest = out.split("\n", 2)
    assert text == "On it." and rest == ""
    call = json.loads(call_line)["tool_call"]
    assert (call["name"], call["arguments"]) == ("get_current_time", {"timezone": "Europe/Paris"})
    assert "stop: tool_calls" in err


def test_bad_tools_files_are_refused_before_loading(capsys, tmp_path):
    cases = [
        ("{not json", "is not valid JSON"),
        ("[]", "the tools list is empty"),
        ('{"tools": []}', "tools must be a list"),
        ('[{"type": "function", "function": {"name": "a b"}}]', "tool 1: function.name must be a string of"),
    ]
    for text, why in cases:
        path = tmp_path / "tools.json"
        path.write_text(text)
        rc = main(["generate", *PAIR, "--tools", str(path), "--prompt", "hi", "--json"])
        [line] = _lines(capsys.readouterr().out)
        assert rc == 1 and why in line["error"], (text, line)
    rc = main(["generate", *PAIR, "--tools", str(tmp_path / "missing.json"), "--prompt", "hi", "--json"])
    assert rc == 1 and "cannot read --tools" in _lines(capsys.readouterr().out)[0]["error"]
    rc = main(["generate", *PAIR, "--tools", str(path), "--no-template", "--prompt", "hi"])
    assert rc == 1 and "--no-template takes no --tools" in capsys.readouterr().err


def test_messages_with_tool_results_need_no_tools_flag(capsys, tmp_path, tokenizer):
    history = [
        {"role": "user", "content": ASK},
        {
            "role": "assistant",
            "tool_calls": [{"id": "c", "function": {"name": "get_current_time", "arguments": '{"timezone": "UTC"}'}}],
        },
        {"role": "tool", "tool_call_id": "c", "content": "09:04"},
    ]
    path = tmp_path / "m.json"
    path.write_text(json.dumps(history))
    rc = main(["generate", *PAIR, "--messages", str(path), "--json", "--max-tokens", "4"])
    lines = _lines(capsys.readouterr().out)
    assert rc == 0 and not any("messages" in x for x in lines)  # no --tools: the output is as before
    assert lines[-1]["stats"]["prompt_tokens"] == len(encode_chat(tokenizer, history).ids)
