"""Messages in the conversation: the user's, and the model's reply in two views.

Token view: every token keeps its own span, coloured by origin. Draft tokens (drafted and accepted
by the target) are sky blue AND underlined; the target's own tokens are orange, not underlined, so
the distinction survives colour blindness and monochrome terminals (Okabe-Ito palette).
Rendered view: the same text as Markdown, refreshed at a lower rate while streaming.
"""

from __future__ import annotations

from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widget import Widget
from textual.widgets import Markdown, Static

from core.events import TokenEvent, TurnDone

from app.tui.live_stats import summary_line

DRAFT_COLOR = "#56B4E9"
TARGET_COLOR = "#E69F00"
DRAFT_STYLE = Style(color=DRAFT_COLOR, underline=True)
TARGET_STYLE = Style(color=TARGET_COLOR)


# Control characters in generated text (random demo weights produce them) would reach the terminal
# as raw bytes; show them as their Unicode "control picture" instead, one cell for one character,
# so token spans keep their offsets. Newlines and tabs stay.
_CONTROL_PICTURES = {c: 0x2400 + c for c in range(0x20) if chr(c) not in "\n\t"} | {0x7F: 0x2421}


def displayable(text: str) -> str:
    return text.translate(_CONTROL_PICTURES)


def legend() -> Text:
    t = Text("Token view: ")
    t.append("drafted + accepted", DRAFT_STYLE)
    t.append(" (underlined)   ")
    t.append("target's own token", TARGET_STYLE)
    return t


class UserMessage(Static):
    def __init__(self, text: str) -> None:
        body = Text.assemble(("You", "bold"), "\n", text)
        super().__init__(body, markup=False)
        self.message_text = text


class TokenChunk(Widget):
    """A run of whole lines of a reply. Only the last chunk of a streaming reply grows, so only it
    is re-wrapped and re-rendered per drain; sealed chunks keep Textual's render cache."""

    DEFAULT_CSS = "TokenChunk { height: auto; }"

    def __init__(self, crop_start: bool = False) -> None:
        super().__init__()
        self.text = Text()
        self.token_count = 0
        self.crop_start = crop_start  # starts with the line break that the widget boundary already makes
        self.crop_end = False  # ends with it

    def grow(self) -> None:
        """Text was appended: repaint; lay the conversation out again only if the line count changed
        (a layout re-arranges and repaints every visible message, a repaint only this chunk)."""
        self.refresh()
        width = self.content_size.width
        if width and self.get_content_height(self.content_size, self.content_size, width) == self.content_size.height:
            return
        self.refresh(layout=True)

    def render(self) -> Text:
        if not (self.crop_start or self.crop_end):
            return self.text
        t = self.text.copy()
        if self.crop_end:
            t.right_crop(1)
        return t[1:] if self.crop_start else t


class TokenText(Vertical):
    """A reply's tokens, one span per token, in chunks split at line breaks once they hold
    CHUNK_TOKENS tokens (a reply with no line breaks stays one chunk)."""

    DEFAULT_CSS = "TokenText { height: auto; }"
    CHUNK_TOKENS = 96

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._current: TokenChunk | None = None

    @property
    def text(self) -> Text:
        """The whole reply as one Text (spans exactly as appended)."""
        out = Text()
        for chunk in self.query(TokenChunk):
            out.append_text(chunk.text)
        return out

    def _chunk(self, crop_start: bool = False) -> TokenChunk:
        if self._current is None:
            self._current = TokenChunk(crop_start)
            self.mount(self._current)
        return self._current

    def _seal(self, chunk: TokenChunk) -> None:
        chunk.grow()
        self._current = None

    def append_tokens(self, tokens: list[TokenEvent]) -> None:
        chunk = self._chunk()
        for tok in tokens:
            full = chunk.token_count >= self.CHUNK_TOKENS
            if full and tok.text.startswith("\n"):  # the break opens the next chunk
                self._seal(chunk)
                chunk = self._chunk(crop_start=True)
            chunk.text.append(displayable(tok.text), DRAFT_STYLE if tok.from_draft else TARGET_STYLE)
            chunk.token_count += 1
            if chunk.token_count >= self.CHUNK_TOKENS and tok.text.endswith("\n"):  # it closes this one
                chunk.crop_end = True
                self._seal(chunk)
                chunk = self._chunk()
        chunk.grow()

    def append_plain(self, text: str) -> None:
        chunk = self._chunk()
        chunk.text.append(displayable(text))
        chunk.grow()


class ReplyView(Vertical):
    """One model reply: header, token view, rendered view, summary line."""

    def __init__(self) -> None:
        super().__init__(classes="reply")
        self.tokens = TokenText(classes="reply-tokens")
        self.markdown = Markdown("", classes="reply-markdown")
        self.header = Static("gemma", classes="reply-header", markup=False)
        self.summary = Static("…", classes="reply-summary", markup=False)
        self.chunks: list[str] = []
        self.token_count = 0
        self.draft_count = 0
        self.done: TurnDone | None = None
        self.stopped = False
        self.error: str | None = None
        self._markdown_dirty = False
        self._markdown_pending = None
        self._summary_count = -1
        self._summary_len = -1

    def compose(self) -> ComposeResult:
        yield self.header
        yield self.tokens
        yield self.markdown
        yield self.summary

    @property
    def plain(self) -> str:
        return "".join(self.chunks)

    @property
    def streaming(self) -> bool:
        return self.done is None

    def append_tokens(self, tokens: list[TokenEvent]) -> None:
        if not tokens:
            return
        self.tokens.append_tokens(tokens)
        self.chunks.extend(t.text for t in tokens)
        self.token_count += len(tokens)
        self.draft_count += sum(1 for t in tokens if t.from_draft)
        self._markdown_dirty = True

    def update_live_summary(self) -> None:
        if self.done is None and self._summary_count != self.token_count:
            self._summary_count = self.token_count
            line = f"streaming… {self.token_count} tokens, {self.draft_count} from drafts"
            # same length, same wrapping: repaint only, no layout of the whole conversation
            self.summary.update(line, layout=len(line) != self._summary_len)
            self._summary_len = len(line)

    def finish(self, done: TurnDone) -> None:
        self.done = done
        stats = done.stats
        if stats.stop_reason == "error":
            self.error = done.error or "generation failed"
            self.add_class("-error")
            self.header.update(f"gemma  ✗ error: {self.error}")
            self.summary.update("the message was not sent; it is back in the prompt")
            return
        self._take_final_text(done.text)
        self.stopped = stats.stop_reason == "cancelled"
        label = "gemma  ■ stopped" if self.stopped else "gemma"
        if stats.stop_reason == "max_tokens":
            label += "  (max tokens)"
        self.header.update(label)
        self.set_class(self.stopped, "-stopped")
        self.summary.update(summary_line(stats, len(done.token_ids)) if stats.rounds else "no tokens")
        self._markdown_dirty = True

    def _take_final_text(self, text: str) -> None:
        """TurnDone.text is the authoritative reply. A detokenizer may hold back the bytes of an
        incomplete character until the end of the turn, so the streamed deltas can fall short of
        it: show that tail unattributed (it belongs to no single token), and keep the full text."""
        streamed = self.plain
        if text == streamed:
            return
        if text.startswith(streamed):
            self.tokens.append_plain(text[len(streamed):])
        self.chunks = [text]

    def flush_markdown(self) -> None:
        """Re-render the Markdown if the text changed and the previous render has finished."""
        if not self._markdown_dirty:
            return
        if self._markdown_pending is not None and not self._markdown_pending.is_done:
            return
        self._markdown_dirty = False
        self._markdown_pending = self.markdown.update(displayable(self.plain))
