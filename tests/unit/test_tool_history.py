"""A reply that called tools, as the history keeps it (core.user.store: the calls and results in its
record) and gives it back: the messages the engine is sent when the chat is reopened, and the export."""

from __future__ import annotations

import json

from core.decode.chat_format import normalize_messages
from core.user.export import chat_to_markdown
from core.user.store import TOOL_CALLS, TOOL_RESULTS, Store

CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_current_time", "arguments": json.dumps({"timezone": "Europe/Paris"})},
}
RESULT = {"tool_call_id": "call_1", "name": "get_current_time", "content": '{"datetime": "14:05"}', "shown": "done"}


def saved_chat(tmp_path):
    with Store(tmp_path / "h.db") as store:
        chat_id = store.create_chat(title="t")
        store.append_user_message(chat_id, "What time is it in Paris?")
        store.append_assistant_message(
            chat_id, "Let me look.", stats={"tokens": 9, TOOL_CALLS: [CALL], TOOL_RESULTS: [RESULT]}
        )
        store.append_assistant_message(chat_id, "It is 14:05 in Paris.", stats={"tokens": 7})
        return store.load_chat(chat_id)


def test_a_reopened_chat_sends_the_calls_and_results_again(tmp_path):
    messages = saved_chat(tmp_path).engine_messages()
    assert messages == [
        {"role": "user", "content": "What time is it in Paris?"},
        {"role": "assistant", "content": "Let me look."},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"datetime": "14:05"}', "name": "get_current_time"},
        {"role": "assistant", "content": "It is 14:05 in Paris."},
    ]
    normalize_messages(messages)  # what the engine's renderer takes


def test_the_export_shows_each_call_and_its_result(tmp_path):
    text = chat_to_markdown(saved_chat(tmp_path))
    assert "**Tool call** `get_current_time`" in text
    assert '{"timezone": "Europe/Paris"}' in text
    assert "<details><summary>Result</summary>" in text and '{"datetime": "14:05"}' in text
    assert text.index("Let me look.") < text.index("**Tool call**") < text.index("It is 14:05")
