"""Markdown export and code-block extraction."""

from __future__ import annotations

import pytest

from core.events import TurnStats
from core.user import paths
from core.user.export import chat_to_markdown, code_blocks, export_chat, last_code_block, stats_line
from core.user.store import Attachment, Chat, Message, Store

T0 = 1_790_000_000.0  # 2026-09-21 14:13:20 UTC


@pytest.fixture(autouse=True)
def _private_dirs(tmp_path, monkeypatch):
    monkeypatch.setenv(paths.DATA_DIR_ENV, str(tmp_path / "data"))
    monkeypatch.setenv(paths.CACHE_DIR_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv(paths.CONFIG_ENV, str(tmp_path / "cfg" / "config.toml"))


def fixture_chat() -> Chat:
    stats = TurnStats(
        tokens=43, decode_tokens=42, decode_s=2.0, ttft_s=0.25, rounds=15, drafted=45, accepted=27, stop_reason="eos"
    ).as_dict()
    return Chat(
        id=1,
        title="Reverse a list",
        created_at=T0,
        updated_at=T0 + 60,
        pairing="E2B",
        target_id="google/gemma-4-E2B-it",
        drafter_id="google/gemma-4-E2B-it-assistant",
        params={"temperature": 0.0, "block_size": "auto", "thinking": False, "seed": None},
        system_prompt="Be brief.",
        messages=[
            Message(
                1,
                1,
                0,
                "user",
                "How do I reverse a list in Python?\nShow code.",
                created_at=T0,
                attachments=[
                    Attachment("/home/me/My Pictures/list (1).png", "ab", 10, "image/png"),
                    Attachment("/tmp/b.jpg", "cd", 20, "image/jpeg"),
                ],
            ),
            Message(
                2,
                1,
                1,
                "assistant",
                "Use slicing:\n\n```python\nxs[::-1]\n```\n",
                thinking="Easy one.",
                stats=stats,
                created_at=T0 + 1,
            ),
            Message(3, 1, 2, "user", "And in place?", created_at=T0 + 2),
            Message(
                4,
                1,
                3,
                "assistant",
                "Call `xs.reverse()`, which",
                stopped=True,
                stats={"decode_tokens": 5, "drafter_enabled": False, "decode_tps": 10.0},
                created_at=T0 + 3,
            ),
        ],
    )


EXPECTED = """\
# Reverse a list

- Pairing: E2B (target `google/gemma-4-E2B-it`, drafter `google/gemma-4-E2B-it-assistant`)
- Started: 2026-09-21 14:13 UTC
- Parameters: block_size=auto, seed=none, temperature=0.0, thinking=false

## System

Be brief.

## User

How do I reverse a list in Python?
Show code.

![list (1).png](</home/me/My Pictures/list (1).png>)

![b.jpg](/tmp/b.jpg)

## Assistant

Use slicing:

```python
xs[::-1]
```

*43 tokens · 21.0 tok/s · TTFT 0.25 s · acceptance 60% · 2.80 tokens/round*

## User

And in place?

## Assistant

Call `xs.reverse()`, which

*(stopped)*

*6 tokens · 10.0 tok/s · drafter off*
"""


def test_markdown_exact():
    assert chat_to_markdown(fixture_chat()) == EXPECTED


def test_markdown_options():
    md = chat_to_markdown(fixture_chat(), include_stats=False, include_thinking=True)
    assert "tok/s" not in md
    assert "<details><summary>Thinking</summary>\n\nEasy one.\n\n</details>\n\nUse slicing:" in md
    assert "Easy one." not in chat_to_markdown(fixture_chat())


def test_minimal_chat():
    chat = Chat(id=2, title="Empty", created_at=T0, updated_at=T0)
    assert chat_to_markdown(chat) == "# Empty\n\n- Started: 2026-09-21 14:13 UTC\n"


def test_stats_line_error_reason():
    assert stats_line({"tokens": 3, "decode_tokens": 2, "stop_reason": "max_tokens"}) == "3 tokens · stop: max_tokens"
    # stats saved before `tokens` existed: the rounds' tokens plus the prefill's first one
    assert stats_line({"decode_tokens": 3, "stop_reason": "max_tokens"}) == "4 tokens · stop: max_tokens"


def test_export_from_store_never_overwrites(tmp_path):
    with Store(tmp_path / "h.db") as store:
        cid = store.create_chat("Zebras: a study!", pairing="demo")
        store.append_user_message(cid, "stripes?")
        store.append_assistant_message(cid, "yes")
        chat = store.load_chat(cid)
    first = export_chat(chat, tmp_path / "out")
    second = export_chat(chat, tmp_path / "out")
    assert first.name.startswith("zebras-a-study-") and first.suffix == ".md"
    assert second != first and second.name.endswith("-2.md")
    assert first.read_text() == second.read_text() == chat_to_markdown(chat)
    assert "## User\n\nstripes?\n\n## Assistant\n\nyes\n" in first.read_text()


REPLY = """\
Here are two ways.

```python
def rev(xs):
    return xs[::-1]
```

Or with a shell:

~~~bash title="x"
echo hi
```
not a fence end: the block opened with tildes
~~~

Done. Inline ```code``` is not a block.
"""


def test_code_blocks():
    blocks = code_blocks(REPLY)
    assert [(b.lang, b.closed) for b in blocks] == [("python", True), ("bash", True)]
    assert blocks[0].code == "def rev(xs):\n    return xs[::-1]"
    assert last_code_block(REPLY) == "echo hi\n```\nnot a fence end: the block opened with tildes"


def test_last_code_block_edge_cases():
    assert last_code_block("no code here") is None
    assert last_code_block("") is None
    # a stopped reply ends inside a block: what is there is still the code
    assert last_code_block("Try:\n```js\nconsole.log(1)\nconsole.") == "console.log(1)\nconsole."
    assert code_blocks("```\n```")[0] == code_blocks("```\n```")[0].__class__("", "", True)
    # a longer opening fence needs an at-least-as-long closing fence
    assert last_code_block("````md\n```py\nx\n```\n````") == "```py\nx\n```"
    # indented fence: content loses the same indent
    assert last_code_block("1. step\n   ```sh\n   ls -l\n     x\n   ```") == "ls -l\n  x"
