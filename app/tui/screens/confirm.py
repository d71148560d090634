"""A yes/no question over the current screen: `ConfirmScreen` dismisses with True or False.

    self.app.push_screen(ConfirmScreen("Delete this chat?", detail="…", yes="Delete"), callback)

Enter / y answer yes, Esc / n answer no. The yes button is marked as the warning variant when
`danger` is set (deletions), and the dialog starts with focus on "No" so an accidental Enter on a
dangerous question does nothing irreversible.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static

CSS = """
ConfirmScreen {
    align: center middle;
}
ConfirmScreen #confirm-box {
    width: 60;
    height: auto;
    padding: 1 2;
    border: thick $warning;
    background: $surface;
}
ConfirmScreen #confirm-detail {
    color: $text-muted;
    margin: 1 0 0 0;
}
ConfirmScreen #confirm-buttons {
    height: auto;
    margin: 1 0 0 0;
    align: right middle;
}
ConfirmScreen Button {
    margin: 0 0 0 2;
}
"""


class ConfirmScreen(ModalScreen[bool]):
    DEFAULT_CSS = CSS
    BINDINGS = [
        Binding("escape,n", "answer(False)", "No", priority=True),
        Binding("y", "answer(True)", "Yes", priority=True),
    ]

    def __init__(
        self, question: str, *, detail: str = "", yes: str = "Yes", no: str = "No", danger: bool = True
    ) -> None:
        super().__init__()
        self.question = question
        self.detail = detail
        self.yes_label = yes
        self.no_label = no
        self.danger = danger

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm-box"):
            yield Static(self.question, id="confirm-question", markup=False)
            if self.detail:
                yield Static(self.detail, id="confirm-detail", markup=False)
            with Horizontal(id="confirm-buttons"):
                yield Button(self.no_label, id="confirm-no")
                yield Button(self.yes_label, id="confirm-yes", variant="error" if self.danger else "primary")

    def on_mount(self) -> None:
        self.query_one("#confirm-no" if self.danger else "#confirm-yes", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(event.button.id == "confirm-yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)
