"""The tools screens: `ToolApprovalScreen` asks before a call runs (allow once, always for this tool,
deny; Esc stops), `ToolsScreen` lists the MCP servers, their state and their tools, and turns each on
or off. Both read core.user.mcp_client's plain values; neither talks to a server itself."""

from __future__ import annotations

import time

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, DataTable, Static

from app.resources import style_path
from app.tui.widgets.conversation import displayable
from app.tui.widgets.tool_call import arguments_text
from core.user.mcp_client import McpHub

ALLOW, ALWAYS, DENY, STOP = "allow", "always", "deny", "stop"


class ToolApprovalScreen(ModalScreen[str]):
    """Dismisses with ALLOW, ALWAYS, DENY (the model is told) or STOP (Esc: no more calls, no reply).

    The dialog opens while the model writes, often while the user types the next message: for its first
    `ARM_SECONDS` the answer keys are swallowed, not taken, so that the "a" of "What's" cannot allow a tool
    for good (nor Enter allow it once). Esc (the safe answer) works at once."""

    ARM_SECONDS = 0.6

    CSS_PATH = str(style_path("tools.tcss"))
    BINDINGS = [
        Binding("y,enter", "answer('allow')", "Allow once", priority=True),
        Binding("a", "answer('always')", "Always for this tool", priority=True),
        Binding("n", "answer('deny')", "Deny", priority=True),
        Binding("escape", "answer('stop')", "Stop", priority=True),
    ]

    def __init__(self, name: str, server: str, arguments: dict) -> None:
        super().__init__()
        self.tool_name, self.server, self.arguments = name, server, arguments
        self.shown_at = time.monotonic()

    def on_mount(self) -> None:
        self.shown_at = time.monotonic()

    @property
    def armed(self) -> bool:
        """Whether a key now is an answer (see the class docstring)."""
        return time.monotonic() - self.shown_at >= self.ARM_SECONDS

    def compose(self) -> ComposeResult:
        with Vertical(id="approval-box"):
            question = displayable(f"Run {self.tool_name} from MCP server '{self.server}'?")
            yield Static(question, id="approval-question", markup=False)
            with VerticalScroll(id="approval-args"):
                yield Static(displayable(arguments_text(self.arguments)), markup=False)
            with Horizontal(id="approval-buttons"):
                yield Button("Allow once (y)", id="allow", variant="primary")
                yield Button("Always (a)", id="always")
                yield Button("Deny (n)", id="deny")
            yield Static("Esc stops: no call runs and the model does not go on", id="approval-note", markup=False)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(str(event.button.id))

    def action_answer(self, answer: str) -> None:
        if answer != STOP and not self.armed:
            return  # typed for the prompt as the dialog opened: not an answer
        self.dismiss(answer)


class ToolsScreen(ModalScreen[None]):
    """The MCP servers: name, state (with the reason when failed), tools; Enter or space turns one on/off."""

    CSS_PATH = str(style_path("tools.tcss"))
    BINDINGS = [
        Binding("escape,f12,q", "close", "Close", priority=True),
        Binding("enter,space", "toggle_server", "On/off", priority=True),
    ]

    def __init__(self, hub: McpHub | None) -> None:
        super().__init__()
        self.hub = hub
        self.table: DataTable = DataTable(id="tools-table", cursor_type="row")

    def compose(self) -> ComposeResult:
        with Vertical(id="tools-box"):
            yield Static("Tool servers (MCP) · Enter: on/off · Esc: close", id="tools-title", markup=False)
            yield self.table
            yield Static("", id="tools-detail", markup=False)

    def on_mount(self) -> None:
        self.table.add_columns("server", "state", "tools")
        self.refresh_rows()
        self.set_interval(0.5, self.refresh_rows)
        self.table.focus()

    def refresh_rows(self) -> None:
        detail = self.query_one("#tools-detail", Static)
        if self.hub is None or not self.hub.states():
            detail.update("No MCP servers: add them to config.toml as [mcp.servers.NAME] (see the README).")
            return
        row = self.table.cursor_row
        self.table.clear()
        for s in self.hub.states():
            state = s.status + (" · trusted" if s.trusted else "")
            # a server names its own tools: plain characters, never markup (a "[@click=...]" would be an action)
            cells = (s.name, state, ", ".join(t.name for t in s.tools) or "-")
            self.table.add_row(*(Text(displayable(c)) for c in cells), key=s.name)
        if self.table.row_count:
            self.table.move_cursor(row=min(row, self.table.row_count - 1))
            current = self.hub.states()[self.table.cursor_row]
            detail.update(displayable(f"{current.where}\n{current.error}" if current.error else current.where))

    def action_toggle_server(self) -> None:
        if self.hub is None or not self.table.row_count:
            return
        state = self.hub.states()[self.table.cursor_row]
        self.hub.set_enabled(state.name, state.status in ("off", "failed"))
        self.refresh_rows()

    def action_close(self) -> None:
        self.dismiss(None)
