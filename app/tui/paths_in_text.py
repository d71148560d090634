"""Image and audio paths inside pasted text. Pure: no Textual, no Pillow, no audio decoder.

Terminals deliver a dropped file as pasted text, spelled the way a shell would take it:
  /Users/me/cat.png               plain
  '/Users/me/my cat.png'          quoted (single or double)
  /Users/me/my\\ cat\\ \\(1\\).png    backslash-escaped spaces and shell characters
  file:///Users/me/my%20cat.png   a URL (GNOME terminals)
and several files dropped at once arrive as several of these separated by spaces or newlines.

`find_image_paths` splits the text into shell-like words, keeps the words that name an image file
(or, with `accept=is_attachment_name`, an image or audio file), and returns them with the text that
is left once they are taken out.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import unquote, urlparse

from core.limits import AUDIO_SUFFIXES

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".gif", ".webp", ".bmp", ".tif", ".tiff")
_QUOTES = "'\""
# What a shell-escaping terminal puts a backslash before. A backslash before anything else stays,
# so a Windows path (C:\Users\x.png) survives.
_ESCAPABLE = set(" \t'\"\\()[]{}&;|<>$`!*?#~=%,")
_HSPACE = " \t"


@dataclass(frozen=True)
class Word:
    start: int  # span in the original text [start, end)
    end: int
    value: str  # unquoted, unescaped


@dataclass(frozen=True)
class Found:
    paths: list[str]  # in the order they appear, as written (expanded ~, decoded URLs), no duplicates
    text: str  # the text with those words taken out
    missing: tuple[str, ...] = ()  # image paths that name no file here: left in `text`, untouched


def split_words(text: str) -> list[Word]:
    """Shell-like words. A quote opens a quoted part only at the start of a word and only if it is
    closed later on the same word (so "don't" is one plain word); backslash escapes as in `_ESCAPABLE`."""
    words: list[Word] = []
    i, n = 0, len(text)
    while i < n:
        if text[i].isspace():
            i += 1
            continue
        start = i
        out: list[str] = []
        while i < n and not text[i].isspace():
            c = text[i]
            if c in _QUOTES and (i == start or text[i - 1] in _QUOTES):
                close = text.find(c, i + 1)
                if close != -1:
                    inner = text[i + 1 : close]
                    if c == '"':
                        inner = inner.replace('\\"', '"').replace("\\\\", "\\")
                    out.append(inner)
                    i = close + 1
                    continue
            if c == "\\" and i + 1 < n and text[i + 1] in _ESCAPABLE:
                out.append(text[i + 1])
                i += 2
                continue
            out.append(c)
            i += 1
        words.append(Word(start, i, "".join(out)))
    return words


def file_path(value: str) -> str:
    """A word as a filesystem path: file:// URLs decoded, ~ expanded (anything else as it is)."""
    return _as_path(value) or value


def _as_path(value: str) -> str | None:
    """The filesystem path a word spells (file:// decoded, ~ expanded), or None."""
    if value.lower().startswith("file://"):
        parsed = urlparse(value)
        if parsed.netloc not in ("", "localhost"):
            return None
        return unquote(parsed.path)
    return os.path.expanduser(value)


def is_image_name(path: str) -> bool:
    return path.lower().endswith(IMAGE_SUFFIXES)


def is_audio_name(path: str) -> bool:
    return path.lower().endswith(AUDIO_SUFFIXES)


def is_attachment_name(path: str) -> bool:
    """An image or an audio file, by its name."""
    return is_image_name(path) or is_audio_name(path)


def _looks_like_path(word: str, path: str, exists: Callable[[str], bool]) -> bool:
    """A dropped file always comes as an absolute path (or a URL); a bare name counts only when
    such a file exists here, so 'compare a.png and b.png' in prose stays prose."""
    if word.lower().startswith("file://") or word.startswith(("/", "~", "./", "../")):
        return True
    if len(word) > 2 and word[1] == ":" and word[2] in "\\/":  # C:\... or C:/...
        return True
    return exists(path)


def find_image_paths(
    text: str,
    exists: Callable[[str], bool] = os.path.isfile,
    *,
    keep_missing: bool = False,
    accept: Callable[[str], bool] = is_image_name,
) -> Found:
    """The image paths in `text` (the paths whose name `accept` takes) and the text without them (see
    the module docstring). `keep_missing`: a path that names no file stays in the text (a paste must
    lose nothing) and is listed in `missing` instead."""
    taken: list[tuple[int, int]] = []
    paths: list[str] = []
    missing: list[str] = []
    for word in split_words(text):
        path = _as_path(word.value)
        if not path or not accept(path) or not _looks_like_path(word.value, path, exists):
            continue
        if keep_missing and not exists(path):
            if path not in missing:
                missing.append(path)
            continue
        taken.append((word.start, word.end))
        if path not in paths:
            paths.append(path)
    return Found(paths, remove_spans(text, taken), tuple(missing))


def remove_spans(text: str, spans: list[tuple[int, int]]) -> str:
    """`text` without the spans, each taking its following spaces along (or, at the end of a line,
    its preceding ones), so no double spaces or trailing blanks are left where a word was."""
    if not spans:
        return text
    out: list[str] = []
    pos = 0
    for start, end in spans:
        while end < len(text) and text[end] in _HSPACE:
            end += 1
        if end == len(text) or text[end] == "\n":
            while start > pos and text[start - 1] in _HSPACE:
                start -= 1
        out.append(text[pos:start])
        pos = end
    out.append(text[pos:])
    rest = "".join(out)
    return "" if not rest.strip() else rest
