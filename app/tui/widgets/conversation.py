"""Messages in the conversation: the user's, and the model's reply in two views.

Token view: every token keeps its own span, coloured by origin. Draft tokens (drafted and accepted
by the target) are sky blue AND underlined; the target's own tokens are orange, not underlined, so
the distinction survives colour blindness and monochrome terminals (Okabe-Ito palette).
Rendered view: the same text as Markdown, refreshed at a lower rate while streaming.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rich.cells import cell_len, get_character_cell_size
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.await_complete import AwaitComplete
from textual.containers import ScrollableContainer, Vertical, VerticalScroll
from textual.geometry import Region, Size
from textual.selection import Selection
from textual.strip import Strip
from textual.widget import Widget
from textual.widgets import Collapsible, Markdown, Static

from core.events import (
    RoundEvent,
    TokenEvent,
    ToolCall,
    ToolCallDelta,
    ToolCallError,
    ToolCallStarted,
    TurnDone,
    TurnStats,
)
from core.user.export import DRAFTER_SWITCHES, stats_line, switches_text
from core.user.store import decode_origins, encode_origins

DRAFT_COLOR = "#56B4E9"
TARGET_COLOR = "#E69F00"
DRAFT_STYLE = Style(color=DRAFT_COLOR, underline=True)
TARGET_STYLE = Style(color=TARGET_COLOR)
# A remote server that does not say where a token came from (vLLM): neither colour, and dim, so it
# is never mistaken for either origin.
UNKNOWN_STYLE = Style(dim=True)


def origin_style(from_draft: bool | None) -> Style:
    return UNKNOWN_STYLE if from_draft is None else DRAFT_STYLE if from_draft else TARGET_STYLE


# Control characters in generated text (random demo weights produce them) would reach the terminal
# as raw bytes; show them as their Unicode "control picture" instead, one cell for one character,
# so token spans keep their offsets. Newlines and tabs stay.
_CONTROL_PICTURES = {c: 0x2400 + c for c in range(0x20) if chr(c) not in "\n\t"} | {0x7F: 0x2421}


def displayable(text: str) -> str:
    return text.translate(_CONTROL_PICTURES)


# Origins as stored with a reply (core.user.store.encode_origins): style of each run kind, and back.
ORIGIN_STYLES = {"d": DRAFT_STYLE, "t": TARGET_STYLE}


def origin_runs(text: Text) -> list[tuple[str, int]]:
    """A token view's Text as (origin, characters) runs: "d" drafted + accepted, "t" the target's
    own, "u" anything outside a token span."""
    runs: list[tuple[str, int]] = []
    pos = 0
    for span in sorted(text.spans, key=lambda s: s.start):
        kind = "d" if span.style == DRAFT_STYLE else "t" if span.style == TARGET_STYLE else None
        if kind is None or span.start < pos:
            continue
        if span.start > pos:
            runs.append(("u", span.start - pos))
        runs.append((kind, span.end - span.start))
        pos = span.end
    if pos < len(text):
        runs.append(("u", len(text) - pos))
    return runs


def text_with_origins(plain: str, runs: list[tuple[str, int]] | None) -> Text:
    """`plain` (already displayable) with the origin colours of `runs` (None: no colours)."""
    text = Text(plain)
    pos = 0
    for kind, n in runs or ():
        style = ORIGIN_STYLES.get(kind)
        if style is not None:
            text.stylize(style, pos, pos + n)
        pos += n
    return text


def legend(origin_known: bool = True) -> Text:
    t = Text("Tokens: ")
    if not origin_known:  # a server that streams text only (vLLM): fits the 80-column chat
        t.append("origin not reported", UNKNOWN_STYLE)
        t.append(" (dim)")
        return t
    t.append("drafted + accepted", DRAFT_STYLE)
    t.append(" (underlined) · ")
    t.append("target's own", TARGET_STYLE)
    return t


class Conversation(VerticalScroll):
    """The scrolling conversation. A click (to select text, to scroll) leaves the focus where it was,
    so typing goes on into the prompt; Tab gives it the focus, and then its plain-key shortcuts
    (`shortcuts`, Textual key names, bound on the screen) act while any other printable key is typed
    into the prompt (`type_into`): nothing typed is dropped."""

    FOCUS_ON_CLICK = False

    def __init__(self, shortcuts: set[str], type_into: Callable[[str], None], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.shortcuts = shortcuts
        self._type_into = type_into
        # a key went to the prompt: the user is typing, and the keys already on their way (a fast typist's,
        # a paste's) reach this widget before the focus moves: they are text too, shortcut letters included
        self._typing = False

    def on_key(self, event: events.Key) -> None:
        if event.is_printable and event.character and (self._typing or event.key not in self.shortcuts):
            event.stop()
            event.prevent_default()
            self._typing = True
            self._type_into(event.character)

    def on_focus(self, event: events.Focus) -> None:
        self._typing = False


class UserMessage(Static):
    def __init__(self, text: str) -> None:
        body = Text.assemble(("You", "bold"), "\n", text)
        super().__init__(body, markup=False)
        self.message_text = text


class TokenText(Widget):
    """A reply's tokens, one span per token, drawn line by line (Textual's line API).

    Streaming cost is what this widget is about: a reply grows at up to a few hundred tokens a
    second while the engine shares the GIL with the UI. Greedy word wrap is prefix-stable (text
    appended at the end only moves the last wrapped line and what follows), so an append re-wraps
    from the start of the last line only, renders just the lines it touched, and repaints only
    those rows. While streaming, the widget also reserves RESERVE_LINES blank rows below the text,
    so the conversation is laid out again (and, when following, scrolled: every visible row moves)
    once per few lines instead of once per line: half the visible conversation at a time, at least
    RESERVE_LINES (a relayout costs about four times a repaint of the rows that changed).
    """

    DEFAULT_CSS = "TokenText { height: auto; }"
    RESERVE_LINES = 8

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._text = Text()
        self._span_starts: list[int] = []  # span.start of every span, for bisect
        self._lines: list[tuple[int, int]] = []  # (start, end) offsets of each wrapped line
        self._wrap_width = 0
        self._strips: dict[int, Strip] = {}  # rendered lines, by line number
        self._reserved = 0  # rows reserved while streaming (0: none, height follows the text)
        self._base_style: Style | None = None  # self.rich_style, which walks the DOM: kept until styles change

    @property
    def text(self) -> Text:
        """The whole reply as one Text (spans exactly as appended)."""
        return self._text

    @property
    def line_count(self) -> int:
        return len(self._lines)

    def set_text(self, text: Text) -> None:
        """Replace everything (a finished reply whose thinking moved out of the token view)."""
        self._text = text.copy()
        self._span_starts = [span.start for span in self._text.spans]
        self._rewrap_all()
        self._reserved = 0
        self.refresh(layout=True)

    def append_tokens(self, tokens: list[TokenEvent]) -> None:
        append, starts = self._text.append, self._span_starts
        for tok in tokens:
            if tok.text:
                starts.append(len(self._text))
                append(displayable(tok.text), origin_style(tok.from_draft))
        self._grew()

    def append_plain(self, text: str) -> None:
        self._text.append(displayable(text))
        self._grew()

    def end_stream(self) -> None:
        """The reply is complete: give back the reserved rows."""
        if self._reserved:
            self._reserved = 0
            self.refresh(layout=True)

    # -- wrapping -----------------------------------------------------------------------------------
    def _rewrap_all(self) -> None:
        self._strips.clear()
        self._lines = wrap_lines(self._text.plain, 0, self._wrap_width) if self._wrap_width else []

    def _grew(self) -> None:
        width = self._wrap_width
        if not width:  # not laid out yet: the first layout wraps everything
            self.refresh(layout=True)
            return
        lines = self._lines
        old_height = len(lines)
        first = max(old_height - 1, 0)
        start = lines[first][0] if lines else 0
        lines[first:] = wrap_lines(self._text.plain, start, width)
        for y in [y for y in self._strips if y >= first]:
            del self._strips[y]
        height = len(lines)
        if self._reserved < height:
            # Grow in steps, not line by line (see the class docstring); end_stream gives the rows back.
            self._reserved = height + max(self.RESERVE_LINES, self._viewport_height() // 2) - 1
            self.refresh(layout=True)
        else:
            self.refresh(Region(0, first, width, max(height, old_height) - first))

    def _viewport_height(self) -> int:
        """Rows of the scrolling conversation this reply is in (0 outside one)."""
        for node in self.ancestors:
            if isinstance(node, ScrollableContainer):
                return node.scrollable_content_region.height
        return 0

    # -- Textual's side ----------------------------------------------------------------------------
    def get_content_width(self, container: Size, viewport: Size) -> int:
        return container.width

    def _wrap_to(self, width: int) -> None:
        if width != self._wrap_width:
            self._wrap_width = width
            self._rewrap_all()
            if self._reserved:
                self._reserved = max(self._reserved, len(self._lines))

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        self._wrap_to(width)
        return max(len(self._lines), self._reserved)

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._strips.clear()
        self._base_style = None

    def selection_updated(self, selection: Selection | None) -> None:
        self._strips.clear()
        self.refresh()

    def get_selection(self, selection: Selection) -> tuple[str, str] | None:
        plain = self._text.plain
        return selection.extract("\n".join(plain[a:b] for a, b in self._lines)), "\n"

    def render_line(self, y: int) -> Strip:
        width = self.content_size.width
        self._wrap_to(width)  # a no-op after layout, which wraps to this width first
        style = self._base_style
        if style is None:
            style = self._base_style = self.rich_style
        if y >= len(self._lines):
            return Strip.blank(width, style)
        strip = self._strips.get(y)
        if strip is None:
            strip = self._render_wrapped_line(y, style).crop_extend(0, width, style).apply_offsets(0, y)
            self._strips[y] = strip
        return strip

    def _render_wrapped_line(self, y: int, style: Style) -> Strip:
        start, end = self._lines[y]
        plain, spans = self._text.plain, self._text.spans
        segments: list[Segment] = []
        pos = start
        i = max(bisect_right(self._span_starts, start) - 1, 0)
        while i < len(spans) and spans[i].start < end:
            span = spans[i]
            i += 1
            a, b = max(span.start, start), min(span.end, end)
            if a >= b:
                continue
            if a > pos:
                segments.append(Segment(_cells(plain[pos:a]), style))
            span_style = span.style if isinstance(span.style, Style) else Style.parse(span.style)
            segments.append(Segment(_cells(plain[a:b]), style + span_style))
            pos = b
        if pos < end:
            segments.append(Segment(_cells(plain[pos:end]), style))
        selection = self.text_selection
        strip = Strip(segments)
        if selection is not None and (span_x := selection.get_span(y)) is not None:
            x0, x1 = span_x
            x1 = strip.cell_length if x1 == -1 else x1
            sel = self.screen.get_component_rich_style("screen--selection")
            strip = Strip.join([strip.crop(0, x0), strip.crop(x0, x1).apply_style(sel), strip.crop(x1)])
        return strip


TAB_CELLS = 4


def _cells(text: str) -> str:
    return text.replace("\t", " " * TAB_CELLS)


def _char_cells(ch: str) -> int:
    return TAB_CELLS if ch == "\t" else get_character_cell_size(ch)


_PIECE = re.compile(r"[ \t]*[^ \t]+|[ \t]+")


def wrap_lines(text: str, start: int, width: int) -> list[tuple[int, int]]:
    """Greedy word wrap of text[start:] (start must begin a line) into (start, end) offsets, one per
    screen line; hard line breaks end lines and are not part of them. Spaces at a soft break are
    dropped, spaces before the first word of a paragraph are kept (indentation), trailing spaces
    hang past the edge, and a word wider than the line is folded."""
    lines: list[tuple[int, int]] = []
    width = max(width, 1)
    para = start
    while True:
        nl = text.find("\n", para)
        stop = len(text) if nl < 0 else nl
        _wrap_paragraph(text, para, stop, width, lines)
        if nl < 0:
            return lines
        para = nl + 1


def _wrap_paragraph(text: str, start: int, stop: int, width: int, lines: list[tuple[int, int]]) -> None:
    line_start, col = start, 0
    for m in _PIECE.finditer(text, start, stop):
        a, b = m.span()
        piece = text[a:b]
        w = cell_len(_cells(piece))
        lead = len(piece) - len(piece.lstrip(" \t"))  # spaces in front of the word
        if col + w <= width or lead == len(piece):  # fits, or only spaces (they hang)
            col += w
            continue
        if col > 0:  # break before the word, dropping the spaces in front of it
            lines.append((line_start, a))
            line_start, col = a + lead, 0
        # fold what does not fit on an empty line
        for i in range(line_start, b):
            cw = _char_cells(text[i])
            if col + cw > width and col > 0:
                lines.append((line_start, i))
                line_start, col = i, 0
            col += cw
    lines.append((line_start, stop))


def thinking_section(thinking: str) -> Collapsible:
    """The model's thinking, folded away above its answer (Enter or a click opens it)."""
    body = Static(thinking, markup=False, classes="thinking-text")
    return Collapsible(body, title="thinking", collapsed=True, classes="thinking")


@dataclass
class Variant:
    """One generated version of the last reply (regenerate keeps them; Alt+Left/Right switch)."""

    text: str
    tokens: Text  # the token view, origin colours included
    summary: str
    header: str
    stopped: bool
    thinking: str | None
    record: dict[str, Any] | None  # the reply's figures as saved (DraftSwitches.record)


class DraftSwitches:
    """The drafter switched on or off while a reply streams (the live A/B), and from which token.

    A switch reaches the engine from its next round, while rounds decided before it are still coming
    in, so a press is settled by the rounds that follow it: the first round that drafts after a switch
    on (a round with the drafter off drafts nothing), the first plain round after a switch off. When
    none does (auto kept to plain rounds; another press came first), the first round after the press
    stands for it."""

    def __init__(self, drafter_on: bool) -> None:
        self.drafter_on = drafter_on  # as the reply's rounds run now
        self.switches: list[tuple[int, bool]] = []  # (first token with the new setting, on)
        self._pending: bool | None = None  # pressed, not yet seen in a round
        self._fallback: int | None = None  # the first token of the first round after the press

    def pressed(self, on: bool) -> None:
        if self._pending is not None and self._fallback is not None:
            self._settle(self._fallback, self._pending)  # rounds ran since the last press: it happened
        self._pending = None if on == self.drafter_on else on
        self._fallback = None

    def on_round(self, ev: RoundEvent, first_token: int) -> bool:
        """A round whose tokens start at `first_token` (1-based); True when it settled a switch."""
        pending = self._pending
        if pending is None:
            return False
        if self._fallback is None:
            self._fallback = first_token
        if (ev.drafted > 0) != pending:
            return False
        self._settle(first_token, pending)
        return True

    def finish(self) -> None:
        if self._pending is not None and self._fallback is not None:
            self._settle(self._fallback, self._pending)
        self._pending = None

    def _settle(self, token: int, on: bool) -> None:
        self.switches.append((token, on))
        self.drafter_on = on
        self._pending = self._fallback = None

    def record(self, stats: TurnStats) -> dict[str, Any]:
        """The reply's figures as they are saved: TurnStats.as_dict() and the switches, if any."""
        record = stats.as_dict()
        if self.switches:
            record[DRAFTER_SWITCHES] = [list(s) for s in self.switches]
        return record


WRITING = "writing…"


class CallDraft(Static):
    """A tool call while the model writes it, inside its reply: the call as the model writes it
    (`call:NAME{key:"value"}`, markers left out), each token in its origin's colour (drafted and
    accepted, or the target's own), so speculative decoding shows inside calls too. It stays with the
    reply once written; a call that cannot be decoded says so here, with its text kept whole.

    A server that streams no per-token call text (`--connect`) fills it from the call's argument JSON
    instead, uncoloured (the origin is not known)."""

    DEFAULT_CSS = """
    CallDraft {
        height: auto;
        margin: 0;
        padding: 0 1;
        border-left: thick $accent;
    }
    CallDraft.-failed { border-left: thick $error; }
    """

    def __init__(self, index: int | None) -> None:
        """index: the call's place in the reply (None until its first event says it)."""
        super().__init__("", markup=False, classes="call-draft")
        self.index = index
        self.tool_name: str | None = None
        self.body = Text()
        self.from_tokens = False  # the body is the model's tokens (not a server's argument JSON)
        self.state = WRITING
        self.failed = False

    @classmethod
    def failed_call(cls, message: str, raw: str) -> CallDraft:
        """A saved reply's call that could not be decoded: what was wrong, and the model's text of it."""
        draft = cls(None)
        draft.done(ToolCallError(0, message, raw))
        return draft

    @classmethod
    def restored(cls, saved: dict[str, Any]) -> CallDraft | None:
        """A saved reply's call as it was shown (`saved()`); None when the entry is not one."""
        text = saved.get("text")
        if not isinstance(text, str):
            return None
        draft = cls(None)
        draft.tool_name = saved["name"] if isinstance(saved.get("name"), str) else None
        draft.from_tokens = saved.get("from_tokens") is True
        draft.failed = saved.get("failed") is True
        state = saved.get("state")
        draft.state = "(not finished)" if not isinstance(state, str) or state == WRITING else state
        text = displayable(text)
        if draft.from_tokens:
            draft.body = text_with_origins(text, decode_origins(saved.get("origins"), len(text)))
        else:  # a server's argument JSON (origin unknown), or a malformed call's raw text
            draft.body = Text(text, style="" if draft.failed else UNKNOWN_STYLE)
        draft.set_class(draft.failed, "-failed")
        draft._show()
        return draft

    def saved(self) -> dict[str, Any]:
        """The call as the reply's record keeps it (core.user.store.CALL_DRAFTS)."""
        return {
            "name": self.tool_name,
            "text": self.body.plain,
            "origins": encode_origins(origin_runs(self.body)),
            "state": self.state,
            "failed": self.failed,
            "from_tokens": self.from_tokens,
        }

    def add_tokens(self, tokens: list[TokenEvent]) -> None:
        for tok in tokens:
            if tok.call_text:
                self.from_tokens = True
                self.body.append(displayable(tok.call_text), origin_style(tok.from_draft))
        self._show()

    def started(self, ev: ToolCallStarted) -> None:
        self.tool_name = ev.name
        if not self.from_tokens and not self.body:
            self.body.append(f"call:{ev.name}", UNKNOWN_STYLE)
        self._show()

    def add_arguments(self, text: str) -> None:
        """Argument JSON from a server that gives no call text per token (ignored when tokens came)."""
        if not self.from_tokens:
            self.body.append(displayable(text), UNKNOWN_STYLE)
            self._show()

    def done(self, ev: ToolCall | ToolCallError) -> None:
        if isinstance(ev, ToolCallError):
            self.failed = True
            self.add_class("-failed")
            self.state = f"✗ {ev.message}"
            if not self.from_tokens:  # the text the model wrote, kept whole
                self.body = Text(displayable(ev.raw))
        else:
            self.tool_name = ev.name
            self.state = ""
        self._show()

    def end(self) -> None:
        """The reply ended with the call still open (a stop, Esc)."""
        if self.state == WRITING:
            self.state = "(not finished)"
            self._show()

    def render_text(self) -> Text:
        head = Text("tool call", style="bold")
        if self.tool_name:
            head.append(f" {self.tool_name}", style="bold")
        if self.state:
            head.append(f" · {self.state}", style="bold red" if self.failed else "italic")
        return Text.assemble(head, "\n", self.body)

    def _show(self) -> None:
        self.update(self.render_text())


class ReplyView(Vertical):
    """One model reply: header, token view, rendered view, summary line."""

    def __init__(self, drafter_on: bool = True) -> None:
        super().__init__(classes="reply")
        self.tokens = TokenText(classes="reply-tokens")
        self.markdown = Markdown("", classes="reply-markdown")
        self.header_text = "gemma"
        self.header = Static(self.header_text, classes="reply-header", markup=False)
        # the live figures are in the side panel; repainting a count here would cost a frame's worth
        self.summary_text = "streaming…"
        self.summary = Static(self.summary_text, classes="reply-summary", markup=False)
        self.chunks: list[str] = []
        self.token_count = 0
        self.done: TurnDone | None = None
        self.record: dict[str, Any] | None = None  # the figures as saved (DraftSwitches.record)
        self.stopped = False
        self.error: str | None = None
        self.draft_switches = DraftSwitches(drafter_on)
        self._markdown_dirty = False
        self._markdown_pending: AwaitComplete | None = None
        self.thinking_text: str | None = None  # a finished reply's thinking, folded away (app.tui.history)
        self.variants: list[Variant] = []  # the versions of this reply, when it is the last (regenerate)
        self.variant_index = 0
        self.call_drafts: list[CallDraft] = []  # its tool calls as the model wrote them, in order
        self._open_call: CallDraft | None = None

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

    def set_header(self, text: str) -> None:
        self.header_text = text
        self.header.update(text)

    def set_summary(self, text: str) -> None:
        self.summary_text = text
        self.summary.update(text)

    def append_tokens(self, tokens: list[TokenEvent]) -> None:
        if not tokens:
            return
        self.tokens.append_tokens(tokens)
        self.chunks.extend(t.text for t in tokens)
        self.token_count += len(tokens)
        self._markdown_dirty = True
        in_call = [t for t in tokens if t.call_text]
        if in_call:
            self._call_draft(None).add_tokens(in_call)

    # -- tool calls as they stream (core.events: a call's tokens carry call_text, then its events) ----
    def _call_draft(self, index: int | None) -> CallDraft:
        """The draft of call `index` (None: the one being written), mounted under the reply's text."""
        for draft in self.call_drafts:
            if index is not None and draft.index == index:
                return draft
        open_call = self._open_call
        if open_call is not None and (index is None or open_call.index is None):
            if index is not None:
                open_call.index = index
            return open_call
        draft = CallDraft(index)
        self.call_drafts.append(draft)
        self._open_call = draft
        self.mount(draft, before=self.summary)
        return draft

    def on_tool_event(self, ev: ToolCallStarted | ToolCallDelta | ToolCall | ToolCallError) -> None:
        draft = self._call_draft(ev.index)
        if isinstance(ev, ToolCallStarted):
            draft.started(ev)
        elif isinstance(ev, ToolCallDelta):
            draft.add_arguments(ev.arguments)
        else:
            draft.done(ev)
            if draft is self._open_call:
                self._open_call = None

    def on_round(self, ev: RoundEvent, first_token: int) -> None:
        """A round of this reply ended; its tokens start at `first_token` (1-based)."""
        if self.draft_switches.on_round(ev, first_token):
            self.set_summary(f"streaming… · {switches_text(self.draft_switches.switches)}")

    def finish(self, done: TurnDone) -> None:
        self.done = done
        self.tokens.end_stream()
        for draft in self.call_drafts:
            draft.end()
        self._open_call = None
        stats = done.stats
        if stats.stop_reason == "error":
            self.error = done.error or "generation failed"
            self.add_class("-error")
            self.set_header(f"gemma  ✗ error: {self.error}")
            self.set_summary("the message was not sent; it is back in the prompt")
            return
        self._take_final_text(done.text)
        self.tokens.end_stream()  # the unattributed tail may have reserved rows again
        self.stopped = stats.stop_reason == "cancelled"
        label = "gemma  ■ stopped" if self.stopped else "gemma"
        if stats.stop_reason == "max_tokens":
            label += "  (max tokens)"
        elif stats.stop_reason == "context_full":
            label += "  (context full: start a new chat)"
        self.set_header(label)
        self.set_class(self.stopped, "-stopped")
        self.draft_switches.finish()
        self.record = self.draft_switches.record(stats)
        self.set_summary(stats_line(self.record) if stats.rounds else "no tokens")
        self._markdown_dirty = True

    def _take_final_text(self, text: str) -> None:
        """TurnDone.text is the authoritative reply. A detokenizer may hold back the bytes of an
        incomplete character until the end of the turn, so the streamed deltas can fall short of
        it: show that tail unattributed (it belongs to no single token), and keep the full text."""
        streamed = self.plain
        if text == streamed:
            return
        if text.startswith(streamed):
            self.tokens.append_plain(text[len(streamed) :])
        self.chunks = [text]

    def show_answer(self, tokens: Text, text: str, thinking: str | None) -> None:
        """The finished reply is `text` (its token view `tokens`), its thinking folded away above it."""
        self.tokens.set_text(tokens)
        self.chunks = [text]
        self.thinking_text = thinking
        self._markdown_dirty = True
        for old in self.query(".thinking"):
            old.remove()
        if thinking:
            self.mount(thinking_section(thinking), before=self.tokens)

    @property
    def markdown_stale(self) -> bool:
        """The rendered view is behind the text (a render was still running when it changed)."""
        return self._markdown_dirty

    def flush_markdown(self) -> None:
        """Re-render the Markdown if the text changed and the previous render has finished."""
        if not self._markdown_dirty:
            return
        if self._markdown_pending is not None and not self._markdown_pending.is_done:
            return
        self._markdown_dirty = False
        self._markdown_pending = self.markdown.update(displayable(self.plain))

    # -- variants (regenerate keeps the earlier ones) ------------------------------------------------
    def keep_variant(self, earlier: list[Variant], greedy: bool) -> bool:
        """This finished reply becomes the newest variant after `earlier`, and is shown with the
        variant keys. True when it is the same text as the one before at temperature 0 (`greedy`)."""
        thinking = self.thinking_text
        variant = Variant(
            text=self.plain,
            tokens=self.tokens.text.copy(),
            summary=self.summary_text,
            header=self.header_text,
            stopped=self.stopped,
            thinking=str(thinking) if thinking else None,
            record=self.record,
        )
        self.variants = [*earlier, variant]
        self.variant_index = len(self.variants) - 1
        same = bool(earlier) and earlier[-1].text == variant.text and greedy
        if same:
            variant.header += "  (identical: temperature 0 is greedy)"
        if earlier:
            self.show_variant(self.variant_index)
        return same

    def show_variant(self, index: int) -> Variant:
        """Show variant `index` in place of the reply (its text, colours, header, summary, thinking)."""
        v = self.variants[index]
        self.variant_index = index
        self.show_answer(v.tokens, v.text, v.thinking)
        for draft in self.call_drafts:  # the calls this view streamed are the newest variant's
            draft.display = index == len(self.variants) - 1
        self.record = v.record
        n = len(self.variants)
        self.set_header(v.header + (f"  ◀ {index + 1}/{n} ▶" if n > 1 else ""))
        self.set_summary(v.summary)
        self.stopped = v.stopped
        self.set_class(v.stopped, "-stopped")
        return v
