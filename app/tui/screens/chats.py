"""Ctrl+L: the chat list. Search, open, start, rename and delete chats.

Dismisses with ("open", chat_id), ("new", None), ("deleted", chat_id) when the open chat was deleted
and nothing else was chosen, or None. Every Store call goes through the history writer thread.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from rich.text import Text
from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, OptionList, Static
from textual.widgets.option_list import Option

from app.resources import style_path
from app.tui.screens.confirm import ConfirmScreen
from app.tui.widgets.ordered_input import OrderedInput

if TYPE_CHECKING:
    from app.tui.history import HistoryRecorder
    from core.user.store import ChatSummary


def when(ts: float) -> str:
    """A chat's time in the local time zone."""
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts))


def chat_label(summary: ChatSummary, snippet: str | None = None, current: bool = False) -> Text:
    t = Text()
    t.append(summary.title, "bold")
    if current:
        t.append("  (open)", "italic")
    n = summary.message_count
    meta = f"\n  {when(summary.updated_at)} · {n} message{'s' if n != 1 else ''}"
    if summary.pairing:
        meta += f" · {summary.pairing}"
    t.append(meta, "dim")
    if snippet:
        t.append("\n  " + " ".join(snippet.split()), "italic")
    return t


class RenameScreen(ModalScreen[str | None]):
    DEFAULT_CSS = """
    RenameScreen { align: center middle; }
    RenameScreen #rename-box { width: 64; height: auto; padding: 1 2; border: thick $primary; background: $surface; }
    RenameScreen #rename-error { color: $error; height: auto; }
    """
    BINDINGS = [Binding("escape", "cancel", "Cancel", priority=True)]

    def __init__(self, title: str) -> None:
        super().__init__()
        self.old_title = title

    def compose(self) -> ComposeResult:
        with Vertical(id="rename-box"):
            yield Static("Rename the chat (Enter saves, Esc cancels)")
            yield OrderedInput(self.old_title, id="rename-input")
            yield Static("", id="rename-error")

    @on(Input.Submitted)
    def _submitted(self, event: Input.Submitted) -> None:
        event.stop()
        title = event.value.strip()
        if not title:
            self.query_one("#rename-error", Static).update("Title: cannot be empty")
            return
        self.dismiss(title)

    def action_cancel(self) -> None:
        self.dismiss(None)


class ChatListScreen(ModalScreen[tuple[str, int | None] | None]):
    CSS_PATH = str(style_path("chats.tcss"))
    BINDINGS = [
        Binding("escape", "close", "Close", priority=True),
        Binding("ctrl+n", "new", "New chat", priority=True),
        Binding("ctrl+r,f2", "rename", "Rename", priority=True),
        Binding("delete,ctrl+d", "delete", "Delete", priority=True),
    ]

    def __init__(self, recorder: HistoryRecorder, current_id: int | None = None) -> None:
        super().__init__()
        self.recorder = recorder
        self.current_id = current_id
        self.summaries: dict[int, ChatSummary] = {}
        self.query_text = ""
        self.deleted_current = False
        self.error: str | None = None  # why the list could not be read
        self.loaded = False  # the list shows the latest query's result (tests wait on this)

    def compose(self) -> ComposeResult:
        with Vertical(id="chats-box"):
            yield Static(Text("Chats", style="bold"), id="chats-title")
            yield OrderedInput(placeholder="Search titles and messages…", id="chats-search")
            yield OptionList(id="chats-list")
            yield Static("Enter open · ↑↓ choose · ^N new · ^R rename · Del delete · Esc close", id="chats-help")

    def on_mount(self) -> None:
        self.query_one("#chats-search", Input).focus()
        self.reload()

    @property
    def option_list(self) -> OptionList:
        return self.query_one("#chats-list", OptionList)

    # -- loading ----------------------------------------------------------------------------------
    def reload(self) -> None:
        self.loaded = False
        self.run_worker(self._load(self.query_text), exclusive=True, group="load")

    async def _load(self, query: str) -> None:
        try:
            if query.strip():
                hits = await self.recorder.call(lambda store: store.search_chats(query))
                rows = [(h.chat, h.snippet if h.message_seq is not None else None) for h in hits]
            else:
                rows = [(s, None) for s in await self.recorder.call(lambda store: store.list_chats())]
        except Exception as e:  # a damaged, locked or unreadable history: say so, keep the app and the chat
            if query == self.query_text:
                self.error = str(e)
                self.option_list.clear_options()
                self.query_one("#chats-title", Static).update(
                    Text.assemble(("Chats", "bold"), ("  the chat history cannot be read", "bold red"))
                )
                self.notify(f"Chat history unavailable: {e}", severity="error", timeout=10, markup=False)
                self.loaded = True
            return
        self.error = None
        if query != self.query_text:
            return  # typed on meanwhile: a newer load follows
        self.summaries = {s.id: s for s, _ in rows}
        ol = self.option_list
        highlighted = ol.highlighted_option.id if ol.highlighted_option is not None else None
        ol.clear_options()
        ol.add_options([Option(chat_label(s, snip, s.id == self.current_id), id=str(s.id)) for s, snip in rows])
        if rows:
            ids = [str(s.id) for s, _ in rows]
            ol.highlighted = ids.index(highlighted) if highlighted in ids else 0
        empty = "No chat matches." if query.strip() else "No saved chats yet."
        self.query_one("#chats-title", Static).update(
            Text.assemble(
                ("Chats", "bold"), f"  {len(rows)} found" if query.strip() else "", "" if rows else f"  {empty}"
            )
        )
        self.loaded = True

    @on(Input.Changed, "#chats-search")
    def _search(self, event: Input.Changed) -> None:
        self.query_text = event.value
        self.reload()

    @on(Input.Submitted, "#chats-search")
    def _search_enter(self, event: Input.Submitted) -> None:
        event.stop()
        self.action_open()

    def on_key(self, event: events.Key) -> None:
        # arrows in the search box move through the list
        if event.key in ("up", "down") and isinstance(self.focused, Input):
            event.stop()
            ol = self.option_list
            if ol.option_count:
                ol.action_cursor_down() if event.key == "down" else ol.action_cursor_up()

    # -- actions ----------------------------------------------------------------------------------
    def selected_id(self) -> int | None:
        option = self.option_list.highlighted_option
        return int(option.id) if option is not None and option.id is not None else None

    @on(OptionList.OptionSelected, "#chats-list")
    def _selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        assert event.option.id is not None  # every row is added with its chat id
        self.dismiss(("open", int(event.option.id)))

    def action_open(self) -> None:
        chat_id = self.selected_id()
        if chat_id is not None:
            self.dismiss(("open", chat_id))

    def action_new(self) -> None:
        self.dismiss(("new", None))

    def action_close(self) -> None:
        self.dismiss(("deleted", self.current_id) if self.deleted_current else None)

    def action_rename(self) -> None:
        chat_id = self.selected_id()
        if chat_id is None:
            return

        def renamed(title: str | None) -> None:
            if title:
                self.run_worker(self._rename(chat_id, title), group="edit")

        self.app.push_screen(RenameScreen(self.summaries[chat_id].title), renamed)

    async def _rename(self, chat_id: int, title: str) -> None:
        try:
            await self.recorder.call(lambda store: store.rename_chat(chat_id, title))
        except Exception as e:
            self.notify(f"Could not rename: {e}", severity="error", markup=False)
            return
        self.reload()

    def action_delete(self) -> None:
        chat_id = self.selected_id()
        if chat_id is None:
            return
        summary = self.summaries[chat_id]

        def answered(yes: bool | None) -> None:
            if yes:
                self.run_worker(self._delete(chat_id), group="edit")

        n = summary.message_count
        self.app.push_screen(
            ConfirmScreen(
                f"Delete “{summary.title}”?",
                yes="Delete",
                detail=f"{n} message{'s' if n != 1 else ''}; this cannot be undone.",
            ),
            answered,
        )

    async def _delete(self, chat_id: int) -> None:
        try:
            await self.recorder.call(lambda store: store.delete_chat(chat_id))
        except Exception as e:
            self.notify(f"Could not delete: {e}", severity="error", markup=False)
            return
        if chat_id == self.current_id:
            self.deleted_current = True
        self.notify("Chat deleted")
        self.reload()
