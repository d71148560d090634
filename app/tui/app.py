"""The Textual application: one chat session (app.tui.session) over one engine, its chat screen,
and the models screen over it."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from textual.app import App
from textual.binding import Binding

from app.tui.bridge import DRAIN_HZ
from app.tui.live_stats import LiveControls
from app.tui.screens.chat import ChatScreen
from app.tui.screens.models import ModelsCommands, ModelsOptions
from app.tui.session import ChatSession
from core.settings import GenerationSettings

if TYPE_CHECKING:
    from app.tui.history import HistoryRecorder
    from core.engine.contract import ChatEngine, PairingSpec
    from core.user.config import Config
    from core.user.mcp_client import McpHub


class GemmaChatApp(App[None]):
    TITLE = "gemma-chat"
    ENABLE_COMMAND_PALETTE = True
    BINDINGS = [Binding("ctrl+q", "quit", "Quit", priority=True)]
    COMMANDS = App.COMMANDS | {ModelsCommands}
    # Notifications go to the top right: at the bottom they covered the prompt while typing (and the
    # chat list's key hints); up there they cover the legend and the conversation's first lines.
    CSS = """
    ToastRack {
        dock: top;
        align: right top;
        margin-bottom: 0;
    }
    """
    # The models screen: how it reaches the Hub and the cache (app.tui.screens.models.ModelsOptions),
    # its key, and whether it opens over the chat at start (nothing configured yet).
    models_options: ModelsOptions | None = None
    models_key = "f2"
    first_run = False
    offer_download: str | None = None  # a catalogue pairing asked for (--pairing) and not downloaded: offered at start

    def __init__(
        self,
        engine: ChatEngine,
        spec: PairingSpec,
        settings: GenerationSettings | None = None,
        *,
        key_overrides: dict[str, str] | None = None,
        theme: str | None = None,
        notice: str | None = None,
        history: HistoryRecorder | None = None,
        config: Config | None = None,
        tools_hub: McpHub | None = None,
    ) -> None:
        super().__init__()
        self.tools_hub = tools_hub  # the MCP servers (core.user.mcp_client); the app starts and ends them
        self.quit_saved = threading.Event()  # set once a quit has handed the reply to the history
        settings = settings or GenerationSettings()
        self.session = ChatSession(engine, spec, LiveControls(settings.block_size, settings.drafter_enabled))
        # chat history (app.tui.history.HistoryRecorder; None: nothing is saved) and the config file
        self.history = history
        self.config = config
        self.chat = ChatScreen(
            self.session,
            settings,
            key_overrides,
            recorder=history,
            on_config=self.apply_config,
            open_models=self.action_models,
            config_path=config.path if config is not None else None,
            tools_hub=tools_hub,
        )
        self._notice = notice
        self._signals_installed: list[signal.Signals] = []
        self.quit_signal: str | None = None  # the signal that ended the app, if one did
        if theme and theme in self.available_themes:
            self.theme = theme

    @property
    def engine(self) -> ChatEngine:
        return self.session.engine

    def apply_config(self, config: Config) -> None:
        """The settings screen saved `config`: keep it and apply its theme."""
        self.config = config
        if config.theme in self.available_themes:
            self.theme = config.theme

    def on_mount(self) -> None:
        self._install_signal_handlers()
        self._watch_terminal()
        if self.history is not None:
            if self.history.on_error is None:
                self.history.on_error = self._history_error
            if self.history.on_recovered is None:
                self.history.on_recovered = self._history_recovered
            # writes kept while the history was unusable are retried on a timer, not only at the next message
            self.set_interval(self.history.RETRY_S, self.history.retry)
        self.push_screen(self.chat)
        self.session.load()
        if self.tools_hub is not None:
            self.tools_hub.start()  # their own thread: the chat offers their tools once they are ready
        self.set_interval(1 / DRAIN_HZ, self.session.poll, name="session")
        if self._notice:
            self.notify(self._notice, timeout=10)

    def _history_error(self, message: str) -> None:
        self._notify_from_thread(message, severity="error", timeout=10)

    def _history_recovered(self, message: str) -> None:
        self._notify_from_thread(message, severity="information")

    def _notify_from_thread(self, message: str, **kwargs: Any) -> None:
        # called on the history writer thread; the loop may be gone when the app is closing
        loop = self._loop
        if loop is None:
            return
        try:
            loop.call_soon_threadsafe(partial(self.notify, message, markup=False, **kwargs))
        except (AttributeError, RuntimeError):
            pass

    def on_ready(self) -> None:
        self.bind(self.models_key, "models", description="Models", show=False)
        if self.first_run or self.offer_download:
            self.action_models(first_run=self.first_run, offer=self.offer_download)

    def action_models(self, first_run: bool = False, offer: str | None = None) -> None:
        from app.tui.screens.models import ModelsScreen

        if not isinstance(self.screen, ModelsScreen):
            screen = ModelsScreen(
                self.session, self.models_options, first_run=first_run, close_keys=self.models_key, offer=offer
            )
            self.push_screen(screen)

    async def action_quit(self) -> None:
        # Quitting mid-reply keeps the partial reply, marked stopped, as Esc does (and saves it);
        # then the engine closes with a short timeout so a busy engine cannot hang the exit.
        await self.chat.stop_and_keep()
        self.chat.shutdown()
        self.chat.finish_for_exit()
        if self.tools_hub is not None:
            self.tools_hub.close()
        self.quit_saved.set()  # the partial reply is with the history writer now
        self.exit()

    # SIGTERM (kill, a closing session manager) and SIGHUP (the terminal went away) end the app like
    # Ctrl+Q: the partial reply saved as stopped, the terminal given back (alternate screen, mouse
    # tracking, cursor) by Textual's normal exit instead of the process dying mid-screen.
    QUIT_SIGNALS = ("SIGTERM", "SIGHUP")

    def _install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for name in self.QUIT_SIGNALS:
            sig = signal.Signals.__members__.get(name)  # SIGHUP is POSIX only
            if sig is None:
                continue
            try:
                loop.add_signal_handler(sig, self._on_quit_signal, name)
            except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or no such support
                continue
            self._signals_installed.append(sig)

    def _on_quit_signal(self, name: str) -> None:
        if self.quit_signal is not None:
            return  # already quitting
        self.quit_signal = name
        if self.on_quit_signal is not None:
            self.on_quit_signal(name)
        self.run_worker(self.action_quit(), group="quit", exit_on_error=False)

    # A terminal that went away does not always send SIGHUP (a session leader between it and the app that
    # ignores or swallows it, tmux killed): the app would keep running with no screen, for ever. The
    # controlling terminal is polled instead; once it is hung up (an ioctl on it fails) the app quits as
    # on SIGHUP.
    TERMINAL_POLL_S = 0.5

    def _watch_terminal(self) -> None:
        if terminal_fd() is None:
            return  # headless (tests, a pipe): nothing to lose
        self.set_interval(self.TERMINAL_POLL_S, self._check_terminal, name="terminal-watch")

    def _check_terminal(self) -> None:
        if terminal_lost():
            self._on_quit_signal("SIGHUP")

    # Set by the process that runs the app (app.commands.tui.run_app): called once when a signal or a lost
    # terminal starts the quit, e.g. to guarantee the process ends even if the exit itself gets stuck.
    on_quit_signal: Callable[[str], None] | None = None

    def on_unmount(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        for sig in self._signals_installed:
            loop.remove_signal_handler(sig)


_TERMINAL_FD: list[int | None] = []  # the controlling terminal's fd as first seen (None: not a terminal)


def terminal_fd() -> int | None:
    """The fd of the terminal the app runs in (its stdin), when it started as one."""
    if not _TERMINAL_FD:
        try:
            fd = sys.__stdin__.fileno() if sys.__stdin__ is not None else -1
        except (OSError, ValueError):
            fd = -1
        _TERMINAL_FD.append(fd if fd >= 0 and os.isatty(fd) else None)
    return _TERMINAL_FD[0]


def terminal_lost() -> bool:
    """The app's terminal is gone (hung up: its ioctls fail), though it was one."""
    fd = terminal_fd()
    if fd is None:
        return False
    try:
        os.tcgetpgrp(fd)
    except OSError:
        return True
    return False
