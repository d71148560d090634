"""F1 / ?: every key of the chat screen."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from app.resources import style_path
from app.tui import keys
from app.tui.widgets.conversation import legend


def help_table(screen_keys: tuple[keys.ScreenKey, ...]) -> Table:
    table = Table(box=None, show_header=True, header_style="bold", pad_edge=False, expand=True)
    table.add_column("Key", no_wrap=True)
    table.add_column("Conversation", no_wrap=True)
    table.add_column("Action")
    for sk in screen_keys:
        table.add_row(keys.display_key(sk.always), keys.display_key(sk.quick), sk.description)
    for key, what in keys.prompt_keys():
        table.add_row(keys.display_key(key), "", what)
    return table


class HelpBody(VerticalScroll):
    """The keys and notes: scrolls (arrows, PgUp/PgDn, Home/End, the mouse) when the terminal is
    too small for all of it, while the title and the close hint stay in view."""

    BINDINGS = [
        Binding("home", "scroll_home", "Top", show=False),
        Binding("end", "scroll_end", "End", show=False),
        Binding("space", "page_down", "Page down", show=False),
    ]


# rows of the help box around its scrolling body: border 2, padding 2, title 2, footer 2, spare 2
BOX_CHROME_ROWS = 10


class HelpScreen(ModalScreen[None]):
    CSS_PATH = str(style_path("help.tcss"))
    BINDINGS = [
        Binding("escape,f1,q,question_mark", "close", "Close", priority=True),
    ]

    def __init__(self, screen_keys: tuple[keys.ScreenKey, ...] | None = None) -> None:
        super().__init__()
        self.screen_keys = screen_keys or keys.screen_keys()

    def compose(self) -> ComposeResult:
        with Vertical(id="help-box"):
            yield Static(Text("gemma-chat — keys", style="bold"), id="help-title")
            with HelpBody(id="help-body"):
                yield Static(help_table(self.screen_keys), id="help-keys")
                yield Static(
                    Text.assemble(
                        "Plain keys (second column) act only while the conversation has the focus (Tab "
                        "to it; the footer then lists them). In the prompt every key types, and any other "
                        "key typed in the conversation goes to the prompt. The F-keys and ctrl keys always "
                        "work. A mouse click leaves the focus in the prompt; select text with the mouse "
                        "(Shift+drag in most terminals copies it the terminal's way).\n"
                        "Block size: the tokens the target verifies per round (the drafter's drafts + 1); "
                        "changes apply from the next round, also in the middle of a reply.\n\n",
                        legend(),
                    ),
                    id="help-notes",
                )
            yield Static("Esc / F1 / q: close · ↑ ↓ PgUp PgDn Home End: scroll", id="help-footer")

    def on_mount(self) -> None:
        self.query_one(HelpBody).focus()
        self._fit()

    def on_resize(self) -> None:
        self._fit()

    def _fit(self) -> None:
        # The body scrolls inside a box that grows with its content up to the screen: an auto-height
        # box cannot give a child "the rest", so the body's limit follows the screen's height.
        self.query_one(HelpBody).styles.max_height = max(self.size.height - BOX_CHROME_ROWS, 3)

    def action_close(self) -> None:
        self.dismiss(None)
