"""F9: this chat's parameters — system prompt, sampling, max tokens, seed, thinking.

Dismisses with the new GenerationSettings (the chat screen saves them with the chat and uses them
from the next turn) or None. Values are checked with the config file's own rules, so a message
reads the same in both places: "Temperature: must be a finite number >= 0, got "hot"".
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widget import Widget
from textual.widgets import Button, Input, Label, Static, Switch, TextArea

from app.resources import style_path
from app.tui.widgets.ordered_input import OrderedInput, OrderedTextArea
from core.settings import BadValue, GenerationSettings
from core.user.config import SAMPLING

# field -> (label, kind): kind "int" / "float" / "seed" (an int, or empty for a random seed)
SAMPLING_FIELDS: dict[str, tuple[str, str]] = {
    "temperature": ("Temperature", "float"),
    "top_p": ("Top-p", "float"),
    "top_k": ("Top-k", "int"),
    "max_tokens": ("Max tokens", "int"),
    "seed": ("Seed", "seed"),
}


class FieldError(ValueError):
    def __init__(self, label: str, why: str) -> None:
        self.label = label
        super().__init__(f"{label}: {why}")


def shown(value: Any) -> str:
    return "" if value is None else str(value)


def parse_field(name: str, text: str, label: str | None = None) -> Any:
    """The typed value of a sampling field typed as text, checked like the config file checks it."""
    label = label or SAMPLING_FIELDS[name][0]
    kind = SAMPLING_FIELDS[name][1]
    text = text.strip()
    if kind == "seed" and not text:
        return None
    try:
        value: Any = float(text) if kind == "float" else int(text)
    except ValueError:
        what = "a number" if kind == "float" else "an integer"
        raise FieldError(label, f"must be {what}, got {text!r}" if text else f"must be {what}") from None
    try:
        return SAMPLING[name](value)
    except Exception as e:  # core.user.config's check: `why` says what is allowed
        why = e.why if isinstance(e, BadValue) else e
        raise FieldError(label, f"{why}, got {text}") from None


def form_row(label: str, widget: Widget, note: str = "") -> Horizontal:
    children = [Label(label, classes="form-label"), widget]
    if note:
        children.append(Static(note, classes="form-note", markup=False))
    return Horizontal(*children, classes="form-row -switch" if isinstance(widget, Switch) else "form-row")


# rows of the box around its form: border 2, padding 2, title 2, error 1, buttons 1, spare 2
FORM_CHROME_ROWS = 10

FormResult = TypeVar("FormResult")


class FormScreen(ModalScreen[FormResult]):
    """A modal form (this chat's parameters, the settings): Ctrl+S, Enter in a field or its Save button
    saves (`action_save`, the subclass's), Esc or Cancel dismisses with None; the form (`#{prefix}-form`)
    scrolls so the buttons stay on screen however small the terminal."""

    BINDINGS = [
        Binding("escape", "cancel", "Cancel", priority=True),
        Binding("ctrl+s", "save", "Save", priority=True),
    ]
    FORM_PREFIX = ""  # the ids: #{prefix}-form, #{prefix}-save
    CHROME_ROWS = FORM_CHROME_ROWS  # the rows of the box around its form

    def action_save(self) -> None:
        raise NotImplementedError

    def action_cancel(self) -> None:
        self.dismiss(None)

    def on_resize(self) -> None:
        self._fit()

    def _fit(self) -> None:
        form = self.query_one(f"#{self.FORM_PREFIX}-form")
        form.styles.max_height = max(self.size.height - self.CHROME_ROWS, 3)

    @on(Input.Submitted)
    def _submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.action_save()

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.action_save() if event.button.id == f"{self.FORM_PREFIX}-save" else self.action_cancel()


class ChatParamsScreen(FormScreen[GenerationSettings | None]):
    CSS_PATH = str(style_path("chat_params.tcss"))
    FORM_PREFIX = "params"

    def __init__(self, settings: GenerationSettings, *, thinking_available: bool) -> None:
        super().__init__()
        self.settings = settings
        self.thinking_available = thinking_available

    def compose(self) -> ComposeResult:
        s = self.settings
        values = dataclasses.asdict(s)
        with Vertical(id="params-box"):
            yield Static("This chat's parameters (from the next reply)", id="params-title")
            with VerticalScroll(id="params-form"):
                yield Label("System prompt", classes="form-label")
                yield OrderedTextArea(
                    s.system_prompt or "", id="params-system_prompt", soft_wrap=True, tab_behavior="focus", compact=True
                )
                for name, (label, _) in SAMPLING_FIELDS.items():
                    note = {"temperature": "0 = greedy", "top_k": "0 = off", "seed": "empty = random"}.get(name, "")
                    yield form_row(label, OrderedInput(shown(values[name]), id=f"params-{name}", compact=True), note)
                note = "" if self.thinking_available else "this pairing's chat template has no thinking mode"
                yield form_row(
                    "Thinking",
                    Switch(
                        s.thinking and self.thinking_available,
                        id="params-thinking",
                        disabled=not self.thinking_available,
                    ),
                    note,
                )
            yield Static("", id="params-error", markup=False)
            with Horizontal(id="params-buttons"):
                yield Button("Cancel", id="params-cancel", compact=True)
                yield Button("Save", id="params-save", variant="primary", compact=True)

    def on_mount(self) -> None:
        self._fit()
        self.query_one("#params-system_prompt", TextArea).focus()

    def values(self) -> GenerationSettings:
        """The form as settings; raises FieldError naming the first bad field."""
        changes: dict[str, Any] = {}
        for name in SAMPLING_FIELDS:
            changes[name] = parse_field(name, self.query_one(f"#params-{name}", Input).value)
        system = self.query_one("#params-system_prompt", TextArea).text.strip()
        changes["system_prompt"] = system or None
        changes["thinking"] = self.query_one("#params-thinking", Switch).value if self.thinking_available else False
        return dataclasses.replace(self.settings, **changes)

    def action_save(self) -> None:
        error = self.query_one("#params-error", Static)
        try:
            new = self.values()
        except FieldError as e:
            error.update(str(e))
            self.notify(str(e), severity="error", markup=False)
            return
        error.update("")
        self.dismiss(new)
