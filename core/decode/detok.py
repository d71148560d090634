"""Streaming detokenizer: token ids in, UTF-8-safe text deltas out, O(1) work per token.

Written for SentencePiece-style tokenizers with byte fallback, which is what Gemma uses: the
Hugging Face decoder is `Replace("▁", " ") -> ByteFallback -> Fuse`, so the text of a sequence
is the concatenation of its pieces, with `<0xHH>` pieces contributing raw bytes. Each piece is
mapped to bytes once (memoised), and only an incomplete UTF-8 character at the end (at most 3
bytes) is held back, so nothing is ever re-decoded.

Special tokens: the reply text leaves out every special token (`<turn|>`, `<eos>`, `<|image|>`,
...) except the thinking-channel markers (`<|channel>`, `<channel|>`), which are kept so the
text can be split into thinking and answer (`core.decode.prompt.split_thinking`). The invariant the
tests check: the concatenation of the deltas plus `flush()` equals
`tokenizer.decode([i for i in ids if i not in skip_ids])` for valid UTF-8. For byte sequences
that are not valid UTF-8 both give U+FFFD, though not always the same number of them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _hf(tokenizer: Any) -> Any:
    return getattr(tokenizer, "_tokenizer", tokenizer)


def special_ids(tokenizer: Any) -> dict[int, str]:
    """id -> text of every added token flagged special."""
    decoder = getattr(_hf(tokenizer), "added_tokens_decoder", {}) or {}
    return {int(i): tok.content for i, tok in decoder.items() if getattr(tok, "special", False)}


def default_skip_ids(tokenizer: Any) -> set[int]:
    """Special tokens to leave out of reply text: all but the thinking-channel markers."""
    from core.decode.prompt import thinking_markers

    markers = thinking_markers(tokenizer)
    keep = {markers.start, markers.end} if markers else set()
    return {i for i, text in special_ids(tokenizer).items() if text not in keep}


def _incomplete_tail(buf: bytes | bytearray) -> int:
    """Length of a trailing, so far valid but unfinished UTF-8 character (0 if none)."""
    n = len(buf)
    for back in range(1, min(3, n) + 1):
        b = buf[n - back]
        if b & 0xC0 == 0x80:  # continuation byte: keep looking for the lead
            continue
        need = 2 if b & 0xE0 == 0xC0 else 3 if b & 0xF0 == 0xE0 else 4 if b & 0xF8 == 0xF0 else 1
        return back if need > back else 0
    return 0


class Detokenizer:
    """Feed ids with `add`, get text deltas; `flush` at the end of a reply.

    tokenizer: mlx-lm's TokenizerWrapper or a Hugging Face tokenizer.
    skip_ids: ids that produce no text (default: `default_skip_ids(tokenizer)`).
    The piece table is memoised per instance; build one per tokenizer and `reset()` it per reply.
    """

    def __init__(self, tokenizer: Any, skip_ids: Iterable[int] | None = None) -> None:
        self._tok = _hf(tokenizer)
        self.skip_ids = set(default_skip_ids(tokenizer) if skip_ids is None else skip_ids)
        self._specials = special_ids(tokenizer)
        self._bytes: dict[int, bytes] = {}
        self.reset()

    def reset(self) -> None:
        self.tokens: list[int] = []
        self._pending = b""  # an unfinished UTF-8 character
        self._parts: list[str] = []

    @property
    def text(self) -> str:
        """All text emitted so far (without the pending bytes)."""
        return "".join(self._parts)

    def piece_bytes(self, token_id: int) -> bytes:
        b = self._bytes.get(token_id)
        if b is None:
            b = self._bytes[token_id] = self._piece_bytes(token_id)
        return b

    def display_bytes(self, token_id: int) -> bytes:
        """The token as shown on its own (a logprob's alternative): a special token by its name."""
        special = self._specials.get(int(token_id))
        return special.encode("utf-8") if special is not None else self.piece_bytes(token_id)

    def _piece_bytes(self, token_id: int) -> bytes:
        if token_id in self.skip_ids:
            return b""
        if token_id in self._specials:
            return self._specials[token_id].encode("utf-8")
        piece = self._tok.convert_ids_to_tokens(token_id)
        if piece is None:  # outside the vocabulary (a padded embedding row)
            return b""
        m = _BYTE_PIECE.fullmatch(piece)
        if m:
            return bytes([int(m.group(1), 16)])
        return piece.replace("\u2581", " ").encode("utf-8")

    def add(self, token_id: int) -> str:
        """Consume one id; return the text it completes ("" while a character is unfinished)."""
        token_id = int(token_id)
        self.tokens.append(token_id)
        piece = self.piece_bytes(token_id)
        if not piece:
            return ""
        buf = self._pending + piece
        hold = _incomplete_tail(buf)
        self._pending = buf[len(buf) - hold :] if hold else b""
        delta = buf[: len(buf) - hold].decode("utf-8", "replace")
        if delta:
            self._parts.append(delta)
        return delta

    def add_many(self, token_ids: Iterable[int]) -> str:
        return "".join(self.add(t) for t in token_ids)

    def flush(self) -> str:
        """Emit what is still held (an unfinished character becomes U+FFFD)."""
        delta = self._pending.decode("utf-8", "replace")
        self._pending = b""
        if delta:
            self._parts.append(delta)
        return delta
