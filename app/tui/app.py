"""The Textual application: one chat screen over one engine."""

from __future__ import annotations

from textual.app import App
from textual.binding import Binding

from core.settings import GenerationSettings

from app.tui.screens.chat import ChatScreen


class GemmaChatApp(App[None]):
    TITLE = "gemma-chat"
    ENABLE_COMMAND_PALETTE = True
    BINDINGS = [Binding("ctrl+q", "quit", "Quit", priority=True)]

    def __init__(self, engine, spec, settings: GenerationSettings | None = None, *,
                 key_overrides: dict[str, str] | None = None, theme: str | None = None,
                 notice: str | None = None) -> None:
        super().__init__()
        self.engine = engine
        self.spec = spec
        self.chat = ChatScreen(engine, spec, settings, key_overrides)
        self._notice = notice
        if theme and theme in self.available_themes:
            self.theme = theme

    def on_mount(self) -> None:
        self.push_screen(self.chat)
        if self._notice:
            self.notify(self._notice, timeout=10)

    async def action_quit(self) -> None:
        # Quitting mid-reply: cancel, then close with a short timeout so a busy engine cannot hang exit.
        self.chat.shutdown()
        self.exit()
