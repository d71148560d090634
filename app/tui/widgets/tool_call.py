"""One tool call in the conversation: its name, server and arguments in full, its state (waiting for
the user, running, done, denied, failed) and, once it ran, its result collapsed under a toggle.

What a server sends (a result, an error) is shown as plain characters: never read as markup, and its
control characters (a terminal's escape sequences among them) shown as their symbols, not sent to the
terminal."""

from __future__ import annotations

import json
from typing import Any

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Collapsible, Static

from app.tui.widgets.conversation import displayable

CSS = """
ToolCallView {
    height: auto;
    margin: 0 0 1 0;
    padding: 0 1;
    border-left: thick $accent;
}
ToolCallView #tool-head { color: $accent; text-style: bold; }
ToolCallView #tool-args { color: $text-muted; }
ToolCallView #tool-state { color: $text-muted; }
ToolCallView.-failed #tool-state { color: $error; }
ToolCallView Collapsible { border: none; padding: 0; margin: 0; }
"""


def arguments_text(arguments: dict[str, Any]) -> str:
    """The arguments as the user reads them before allowing a call: all of them, indented JSON."""
    return json.dumps(arguments, indent=2, ensure_ascii=False)


class ToolCallView(Vertical):
    DEFAULT_CSS = CSS

    def __init__(
        self,
        name: str,
        server: str | None,
        arguments: dict[str, Any],
        *,
        state: str = "waiting for your answer…",
        failed: bool = False,
        result: str | None = None,
    ) -> None:
        """A live call starts waiting for the user; a reopened chat's comes with its state and result."""
        super().__init__()
        self.tool_name = name
        self.server = server
        self.arguments = arguments
        self.state_text = state
        self.result_text: str | None = result
        self.set_class(failed, "-failed")

    def compose(self) -> ComposeResult:
        where = f" ({self.server})" if self.server else ""
        yield Static(f"tool call: {self.tool_name}{where}", id="tool-head", markup=False)
        yield Static(displayable(arguments_text(self.arguments)), id="tool-args", markup=False)
        yield Static(displayable(self.state_text), id="tool-state", markup=False)
        if self.result_text is not None:
            yield _result_box(self.result_text)

    def set_state(self, text: str, failed: bool = False) -> None:
        self.state_text = text
        self.set_class(failed, "-failed")
        for state in self.query("#tool-state").results(Static):  # none while it is composed or torn down
            state.update(displayable(text))

    def show_result(self, text: str) -> None:
        """The result, collapsed: one line says how long it is; Enter or a click opens it."""
        self.result_text = text
        if self.is_attached:
            self.mount(_result_box(text))


def _result_box(text: str) -> Collapsible:
    lines = text.count("\n") + 1
    title = f"result: {len(text)} characters" + (f", {lines} lines" if lines > 1 else "")
    return Collapsible(Static(displayable(text), markup=False, id="tool-result"), title=title, collapsed=True)
