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


BAD_CALL = '<|tool_call>call:get_current_time{timezone:<|"|>Europe/Paris}<tool_call|>'


@pytest.mark.parametrize("as_json", [True, False])
def test_a_malformed_call_is_a_tool_call_error_line_with_the_raw_text(
    capsys, monkeypatch, tools_file, tokenizer, as_json
):
    from support.scripted_calls import script_reply

    start = len(encode_chat(tokenizer, [{"role": "user", "content": ASK}], tools=TOOLS).ids)
    reply = tokenizer._tokenizer.encode("On it." + BAD_CALL + "<|tool_response>", add_special_tokens=False)
    script_reply(monkeypatch, start, reply)
    rc = main(["generate", *PAIR, "--tools", str(tools_file), "--prompt", ASK, *(["--json"] if as_json else [])])
    out = capsys.readouterr().out
    assert rc == 0
    if not as_json:  # the answer's text, then the error as JSON on a line of its own
        text, error_line, rest = out.split("\n", 2)
        assert text == "On it." and rest == ""
        out = error_line
    lines = _lines(out)
    [error] = [x["tool_call_error"] for x in lines if "tool_call_error" in x]
    assert error["index"] == 0 and error["raw"] == BAD_CALL
    assert error["message"].startswith("the model produced a malformed tool call")
    assert not any("tool_call" in x for x in lines)  # nothing was taken for a call
    if as_json:
        assert "".join(x["text"] for x in lines if "id" in x) == "On it."


class _FakeHub:
    """What generate uses of core.user.mcp_client.McpHub, with one ready server's tools."""

    def __init__(self, tools: list) -> None:
        self._tools = tools
        self.closed = False

    def tools(self) -> list:
        return self._tools

    def find(self, name: str):
        return next((t for t in self._tools if t.name == name), None)

    def state(self, name: str):
        from core.user.mcp_client import ServerState

        return ServerState(name, "fake", "ready", tools=tuple(self._tools))

    def close(self) -> None:
        self.closed = True


def test_tools_file_and_mcp_together_offer_both_sets(capsys, monkeypatch, tools_file, tokenizer):
    from core.user.mcp_client import McpTool

    convert = McpTool("time", "convert_time", "Convert a time between timezones", {"type": "object"})
    hub = _FakeHub([convert])
    monkeypatch.setattr("app.commands.generate_tools.start_hub", lambda config, note, wait_s=30.0: hub)
    args = ["generate", *PAIR, "--tools", str(tools_file), "--mcp", "--prompt", ASK, "--json", "--max-tokens", "2"]
    rc = main(args)
    lines = _lines(capsys.readouterr().out)
    assert rc == 0, lines
    user = [{"role": "user", "content": ASK}]
    both = len(encode_chat(tokenizer, user, tools=[*TOOLS, convert.openai()]).ids)
    assert both > len(encode_chat(tokenizer, user, tools=TOOLS).ids)
    assert lines[-1]["stats"]["prompt_tokens"] == both  # the file's tool, then the server's, in the prompt
    assert hub.closed
    # either set's tool can be the forced call (the pack's model then babbles its arguments: a call or an error)
    for name in ("get_current_time", "convert_time"):
        rc = main([*args[:-1], "48", "--tool-choice", name])
        lines = _lines(capsys.readouterr().out)
        assert rc == 0, lines
        calls = [x["tool_call"]["name"] for x in lines if "tool_call" in x]
        calls += [x["tool_call_error"]["raw"] for x in lines if "tool_call_error" in x]
        [call] = calls
        assert call == name or call.startswith(f"<|tool_call>call:{name}{{"), call
    # a name in both is refused: which one would run?
    hub = _FakeHub([McpTool("time", "get_current_time", "", {"type": "object"})])
    rc = main(args)
    assert rc == 1 and "MCP server time also has: rename one" in _lines(capsys.readouterr().out)[0]["error"]
    assert hub.closed


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
