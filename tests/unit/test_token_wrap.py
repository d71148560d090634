"""The token view's word wrap (app.tui.widgets.conversation.wrap_lines): greedy, prefix-stable, so
a streaming reply re-wraps only from the start of its last line."""

from __future__ import annotations

import random

import pytest
from rich.cells import cell_len

from app.tui.widgets.conversation import wrap_lines


def show(text: str, width: int) -> list[str]:
    return [text[a:b] for a, b in wrap_lines(text, 0, width)]


@pytest.mark.parametrize(
    "text, width, expected",
    [
        ("hello world foo bar", 11, ["hello world", "foo bar"]),
        ("hello world", 11, ["hello world"]),
        ("    indented code line here", 10, ["    indent", "ed code", "line here"]),  # indentation kept
        ("averyveryverylongword ok", 8, ["averyver", "yverylon", "gword ok"]),  # a long word is folded
        ("a\n\nb  ", 5, ["a", "", "b  "]),  # blank lines kept, trailing spaces hang
        ("", 5, [""]),
        ("x\n", 5, ["x", ""]),
        ("one  two", 3, ["one", "two"]),  # the spaces at a soft break go
        ("日本語のテキスト", 6, ["日本語", "のテキ", "スト"]),  # wide characters count two cells
        ("a\tb c", 6, ["a\tb", "c"]),  # a tab counts four cells
    ],
)
def test_wrap_examples(text, width, expected):
    assert show(text, width) == expected


def _cells(s: str) -> int:
    return cell_len(s.replace("\t", "    "))


@pytest.mark.parametrize("seed", range(40))
def test_incremental_wrap_equals_a_full_wrap(seed):
    """Appending pieces and re-wrapping from the last line's start gives exactly the full wrap,
    at every step; every line fits unless it is one character or ends in hanging spaces."""
    rng = random.Random(seed)
    alphabet = ["a", "b", "cd", "efghij", " ", "  ", "\n", "\t", "日", "verylongwordwithoutbreaks"]
    width = rng.randint(1, 30)
    text = ""
    lines: list[tuple[int, int]] = []
    for _ in range(rng.randint(1, 120)):
        text += "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4)))
        first = max(len(lines) - 1, 0)
        start = lines[first][0] if lines else 0
        lines[first:] = wrap_lines(text, start, width)
        assert lines == wrap_lines(text, 0, width)
    for a, b in lines:
        line = text[a:b]
        assert "\n" not in line
        assert _cells(line.rstrip(" \t")) <= width or len(line.rstrip(" \t")) == 1
    # nothing is lost: between consecutive lines there is only a line break or dropped spaces
    pos = 0
    for a, b in lines:
        assert text[pos:a].strip(" \t") in ("", "\n") and text[pos:a].count("\n") <= 1
        pos = b
    assert pos == len(text)
