"""F3: the settings that live in the config file (defaults for new chats, pairing, theme...).

Reads the file on open and writes back only the keys that changed with `core.user.config.save_config`,
which keeps the user's comments and layout. Both run on a worker thread. A bad value is reported
with the field's name and nothing is written; dismisses with the new Config, or None.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from textual import work
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import Button, Input, Select, Static, Switch

from app.resources import style_path
from app.tui.screens.chat_params import SAMPLING_FIELDS, FieldError, FormScreen, form_row, parse_field, shown
from app.tui.widgets.ordered_input import OrderedInput
from core.limits import BLOCK_SIZE_RANGE, DEFAULT_IMAGE_BUDGET, IMAGE_BUDGETS, is_block_size
from core.user.config import Config, ConfigError, load_config, save_config


def parse_block_size(text: str) -> int | str:
    text = text.strip().lower()
    if text == "auto":
        return "auto"
    try:
        k = int(text)
    except ValueError:
        k = 0
    if not is_block_size(k):
        raise FieldError("Block size", f'must be an integer {BLOCK_SIZE_RANGE} or "auto", got {text!r}')
    return k


class SettingsScreen(FormScreen[Config | None]):
    CSS_PATH = str(style_path("settings.tcss"))
    FORM_PREFIX = "settings"
    # rows of the settings box around its form: border 2, padding 2, title and file 3, error 1, buttons 1, spare 1
    CHROME_ROWS = 10

    def __init__(self, path: str | Path | None = None) -> None:
        super().__init__()
        self.path = Path(path) if path is not None else None
        self.config: Config | None = None  # as read from the file
        self.saving = False

    def compose(self) -> ComposeResult:
        with Vertical(id="settings-box"):
            yield Static("Settings", id="settings-title")
            yield Static("", id="settings-file", markup=False)
            with VerticalScroll(id="settings-form"):
                yield form_row(
                    "Default pairing",
                    OrderedInput(id="set-default_pairing", placeholder="e.g. demo, e4b-4bit", compact=True),
                    'what a plain start opens (* in the models list); "demo" for the demo',
                )
                yield form_row(
                    "Block size", OrderedInput(id="set-block_size", compact=True), f'{BLOCK_SIZE_RANGE} or "auto"'
                )
                for name, (label, _) in SAMPLING_FIELDS.items():
                    note = {"temperature": "0 = greedy", "top_k": "0 = off", "seed": "empty = random"}.get(name, "")
                    yield form_row(label, OrderedInput(id=f"set-{name}", compact=True), note)
                yield form_row(
                    "System prompt",
                    OrderedInput(id="set-system_prompt", placeholder="none", compact=True),
                    "for new chats",
                )
                yield form_row("Thinking", Switch(id="set-thinking"), "for new chats, on models that support it")
                themes = sorted(self.app.available_themes)
                theme = self.app.theme if self.app.theme in themes else themes[0]
                yield form_row(
                    "Theme",
                    Select([(t, t) for t in themes], id="set-theme", allow_blank=False, compact=True, value=theme),
                )
                yield form_row("Offline", Switch(id="set-offline"), "never touch the network")
                budgets = [(str(b), b) for b in IMAGE_BUDGETS]
                yield form_row(
                    "Image budget",
                    Select(budgets, id="set-image_budget", compact=True, allow_blank=False, value=DEFAULT_IMAGE_BUDGET),
                    "soft tokens per image",
                )
            yield Static("", id="settings-error", markup=False)
            with Horizontal(id="settings-buttons"):
                yield Button("Cancel", id="settings-cancel", compact=True)
                yield Button("Save", id="settings-save", variant="primary", compact=True)

    def on_mount(self) -> None:
        self.query_one("#settings-save", Button).disabled = True
        self._fit()
        self._load()

    # -- reading ----------------------------------------------------------------------------------
    @work(thread=True, exclusive=True, group="settings-io")
    def _load(self) -> None:
        try:
            config = load_config(self.path)
        except ConfigError as e:
            self.app.call_from_thread(self._load_failed, e)
            return
        self.app.call_from_thread(self._fill, config)

    def _load_failed(self, e: ConfigError) -> None:
        self.query_one("#settings-file", Static).update(str(e.path))
        self.query_one("#settings-error", Static).update(
            "The config file has problems; fix it in an editor first:\n" + "\n".join(e.problems)
        )

    def _fill(self, config: Config) -> None:
        self.config = config
        self.query_one("#settings-file", Static).update(str(config.path))
        values = {
            "default_pairing": shown(config.default_pairing),
            "block_size": shown(config.block_size),
            "system_prompt": shown(config.system_prompt),
            **{name: shown(value) for name, value in asdict(config.sampling).items() if name in SAMPLING_FIELDS},
        }
        for name, value in values.items():
            self.query_one(f"#set-{name}", Input).value = value
        self.query_one("#set-thinking", Switch).value = config.thinking
        self.query_one("#set-offline", Switch).value = config.offline
        theme = self.query_one("#set-theme", Select)
        if config.theme in self.app.available_themes:
            theme.value = config.theme
        self.query_one("#set-image_budget", Select).value = config.image_budget
        self.query_one("#settings-save", Button).disabled = False
        self.query_one("#set-default_pairing", Input).focus()

    # -- writing ----------------------------------------------------------------------------------
    def changes(self) -> dict[str, Any]:
        """The keys whose value differs from the file's, ready for save_config (None: remove the key).
        Raises FieldError naming the first bad field."""
        assert self.config is not None
        old = self.config

        def text(name: str) -> str:
            return self.query_one(f"#set-{name}", Input).value.strip()

        new_top: dict[str, Any] = {
            "default_pairing": text("default_pairing") or None,
            "block_size": parse_block_size(text("block_size")),
            "system_prompt": text("system_prompt") or None,
            "thinking": self.query_one("#set-thinking", Switch).value,
            "theme": self.query_one("#set-theme", Select).value,
            "offline": self.query_one("#set-offline", Switch).value,
            "image_budget": self.query_one("#set-image_budget", Select).value,
        }
        new_sampling = {name: parse_field(name, text(name)) for name in SAMPLING_FIELDS}
        old_top, old_sampling = asdict(old), asdict(old.sampling)
        out: dict[str, Any] = {k: v for k, v in new_top.items() if v != old_top[k]}
        sampling = {k: v for k, v in new_sampling.items() if v != old_sampling[k]}
        if sampling:
            out["sampling"] = sampling
        return out

    def action_save(self) -> None:
        if self.config is None or self.saving:
            return
        error = self.query_one("#settings-error", Static)
        try:
            changes = self.changes()
        except FieldError as e:
            error.update(str(e))
            self.notify(str(e), severity="error", markup=False)
            return
        if not changes:
            self.dismiss(None)
            return
        error.update("saving…")
        self.saving = True
        self._save(changes)

    @work(thread=True, exclusive=True, group="settings-io")
    def _save(self, changes: dict[str, Any]) -> None:
        try:
            config = save_config(changes, self.config.path if self.config is not None else None)
        except (ConfigError, OSError) as e:
            self.app.call_from_thread(self._save_failed, e)
            return
        self.app.call_from_thread(self._saved, config)

    def _save_failed(self, e: Exception) -> None:
        self.saving = False
        why = "\n".join(e.problems) if isinstance(e, ConfigError) else str(e)
        self.query_one("#settings-error", Static).update(f"Not saved: {why}")
        self.notify(f"Settings not saved: {why}", severity="error", markup=False)

    def _saved(self, config: Config) -> None:
        self.saving = False
        self.notify(f"Settings saved to {config.path}", markup=False)
        self.dismiss(config)
