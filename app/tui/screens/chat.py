"""The chat screen: conversation, prompt, live panels, keyboard tuning.

The pairing's load state and the live controls are the app's session (app.tui.session): this
screen reads them there, changes the controls through it, and follows it by its messages. The
turn being generated is this screen's: its events come from the engine thread through an
EventBridge, drained on one timer with the panels' repaint.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from concurrent.futures import Future
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from textual import events
from textual.app import ComposeResult
from textual.binding import Binding, BindingsMap
from textual.command import DiscoveryHit, Hit, Hits, Provider
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Static

from app.prefill_eta import PrefillClock
from app.resources import style_path
from app.tui import keys
from app.tui.bridge import DRAIN_HZ, MARKDOWN_HZ, PANEL_HZ, EventBridge
from app.tui.history import (
    ChatLog,
    HistoryRecorder,
    pairing_spec_for,
    restored_widgets,
    same_pairing,
    settings_for_chat,
    user_texts,
)
from app.tui.live_stats import LiveStats
from app.tui.messages import (
    AttachmentsPasted,
    ControlsChanged,
    KernelsPreparing,
    PairingFailed,
    PairingLoaded,
    PairingLoading,
    PairingProgress,
    PromptSubmitted,
)
from app.tui.screens.chat_images import ChatImages
from app.tui.screens.chat_tools import ChatTools, ToolOutcome
from app.tui.session import ChatSession
from app.tui.widgets.attachments import AttachmentBar, user_content
from app.tui.widgets.conversation import Conversation, ReplyView, UserMessage, Variant, legend
from app.tui.widgets.key_hints import KeyHints, conversation_hints, hints_for
from app.tui.widgets.panel import PanelText, StatsPanel
from app.tui.widgets.prompt import InputHistory, PromptArea
from core.events import (
    Notice,
    PrefillDone,
    PrefillStarted,
    RoundEvent,
    TokenEvent,
    ToolCall,
    ToolCallDelta,
    ToolCallError,
    ToolCallStarted,
    TurnDone,
    TurnStats,
)
from core.settings import GenerationSettings
from core.user import keymap
from core.user.store import CALL_DRAFTS, TOOL_ERRORS

if TYPE_CHECKING:
    from textual.widget import Widget

    from core.engine.contract import PairingSpec
    from core.user.config import Config
    from core.user.mcp_client import McpHub
    from core.user.store import Chat, Store


# Below this many columns the side panel gives way to a one-line summary under the conversation.
COMPACT_BELOW = 100

# What F4 (or the chat parameters) says when thinking goes on for the demo pairing.
DEMO_THINKING_NOTE = (
    "The demo was not trained to think: with thinking on, its replies turn into word salad. "
    "F4 turns it off again; the real pairings (F2) think."
)


def bind_keys(bindings: BindingsMap, screen_keys: tuple[keys.ScreenKey, ...]) -> None:
    """Add the chat actions to a BindingsMap (per screen instance: config overrides differ)."""
    for sk in screen_keys:
        if sk.always:
            # Esc stays non-priority so modal screens and the palette keep their own Esc.
            bindings.bind(sk.always, sk.action, sk.label, show=sk.show, priority=sk.action != "stop")
        if sk.quick:  # when the conversation (not the prompt) has focus
            bindings.bind(sk.quick, sk.action, sk.label, show=sk.show and not sk.always)


def prompt_placeholder(overrides: dict[str, str] | None = None) -> str:
    from core.user.keymap import resolve_keys

    resolved = resolve_keys(overrides)

    def key(action: str) -> str:
        first = resolved[action].split(",")[0]
        return "Shift+Enter" if first == "shift+enter" else keys.display_key(first)

    return f"{key('send')} send · {key('newline')} new line · {key('attach_image')} image · {key('help')} help"


class ChatCommands(Provider):
    """Command palette entries for the chat screen's actions."""

    def _commands(self) -> tuple[tuple[str, str, str], ...]:
        # the action table (core.user.keymap) that the keys and the help screen read too, and the tools (F12)
        return (*keymap.PALETTE, ("Tools: MCP servers (F12)", "tools", "the tool servers, their tools, on/off"))

    async def _run(self, action: str) -> None:
        screen = self.screen
        if isinstance(screen, ChatScreen):
            await screen.run_action(action)

    async def discover(self) -> Hits:
        for name, action, help_text in self._commands():
            yield DiscoveryHit(name, partial(self._run, action), help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for name, action, help_text in self._commands():
            score = matcher.match(name)
            if score > 0:
                yield Hit(score, matcher.highlight(name), partial(self._run, action), help=help_text)


class ChatScreen(Screen[None]):
    CSS_PATH = str(style_path("chat.tcss"))
    COMMANDS = Screen.COMMANDS | {ChatCommands}
    BINDINGS = [Binding("f12", "tools", "Tools", show=False)]  # the MCP servers (app.tui.screens.tools)

    def __init__(
        self,
        session: ChatSession,
        settings: GenerationSettings | None = None,
        key_overrides: dict[str, str] | None = None,
        *,
        recorder: HistoryRecorder | None = None,
        on_config: Callable[[Config], None] | None = None,
        open_models: Callable[[], None] | None = None,
        config_path: Path | None = None,
        tools_hub: McpHub | None = None,
    ) -> None:
        super().__init__()
        self.session = session
        self.on_config = on_config  # called with the config the settings screen saved
        self.open_models = open_models  # the app's models screen (F2, the palette's "models")
        self.config_path = config_path  # the settings screen's file (None: the default place)
        self.screen_keys = keys.screen_keys(key_overrides)
        bind_keys(self._bindings, self.screen_keys)
        # This chat's parameters (sampling, system prompt, thinking). Their block size and drafter
        # switch are never read: a turn takes the session's live controls (ChatSession.turn_settings).
        self.settings = settings or GenerationSettings()
        self.base_settings = dataclasses.replace(self.settings)  # the config's defaults, for new chats
        self.bridge = EventBridge()
        self.stats = LiveStats()
        self.history: list[dict] = []
        self.view_mode = "tokens"
        self.turn = 0
        self.reply: ReplyView | None = None  # the reply being streamed
        self.last_reply: ReplyView | None = None
        self._carry_variants: list[Variant] = []  # the earlier variants of a reply being regenerated
        self._turn_future: Future[TurnDone] | None = None
        self._turn_user: tuple[str, UserMessage] | None = None  # a fresh send's text + widget
        self._prefill: PrefillStarted | None = None  # the prompt being prefilled, while it is shown
        self._prefill_clock: PrefillClock | None = None  # its recent rate, for the ETA
        self._status_before_prefill = ""
        self._awaiting_prefill = False  # a turn was sent and its PrefillDone has not come yet
        self._last_markdown = 0.0
        self._ticks = 0
        self.prompt = PromptArea(id="prompt")
        self.prompt.placeholder = prompt_placeholder(key_overrides)
        self.input_history = InputHistory()
        self.attachments = AttachmentBar(
            lambda: self.session.info, self.prompt.focus, self.audio_refusal, id="attachments"
        )
        self.conversation = Conversation(keys.quick_keys(self.screen_keys), self.prompt.type_text, id="conversation")
        self.compact_panel = PanelText("", id="compact-panel")
        self.panel = StatsPanel(self.compact_panel, id="panel")
        self.panel_hidden = False  # the user's choice (F10)
        self.legend = Static(legend(), id="legend")
        self.key_hints = KeyHints(
            hints_for(self.screen_keys, key_overrides), conversation_hints(self.screen_keys), id="key-hints"
        )
        self.images = ChatImages(self, self.attachments, self.conversation, self.prompt, lambda: self.session.info)
        self.chat_log = ChatLog(recorder)
        self.tools = ChatTools(self, tools_hub, self._mount_at_end)
        self.prompt.recall_source = lambda: self.input_history.entries(user_texts(self.history))
        self.prompt.refuses = lambda path: bool(self.attachments.refusals([path]))
        self.chat_log.start_chat(self.session.spec, self.settings)

    # -- layout ---------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        with Horizontal(id="body"):
            with Vertical(id="main"):
                yield self.legend
                yield self.conversation
                yield self.compact_panel
                yield self.attachments
                yield self.prompt
            yield self.panel
        yield self.key_hints

    def on_mount(self) -> None:
        self._place_panel()
        self.conversation.anchor()
        self.session.subscribe(self)
        self._show_session()
        self.panel.show(self.stats, self.session.tuning())
        # One timer for everything that repaints while a reply streams: each screen update costs
        # about the same however little changed (Textual re-composites every widget whose clip
        # meets the changed rows), so the panels ride on a drain tick rather than adding frames.
        self.set_interval(1 / DRAIN_HZ, self._tick, name="drain")
        self.prompt.focus()
        self._load_input_history()

    def on_unmount(self) -> None:
        self.session.unsubscribe(self)

    def on_resize(self) -> None:
        self._place_panel()

    def _place_panel(self) -> None:
        """The side panel when there is room, a one-line summary when narrow, neither when hidden."""
        compact = self.size.width < COMPACT_BELOW if self.size.width else False
        self.panel.display = not self.panel_hidden and not compact
        self.compact_panel.display = not self.panel_hidden and compact
        self.stats.dirty = True

    def action_toggle_panel(self) -> None:
        self.panel_hidden = not self.panel_hidden
        self._place_panel()
        self._refresh_panels()

    def on_descendant_focus(self, event: events.DescendantFocus) -> None:
        # the focused conversation takes plain keys: the footer says which, and where typing goes
        self.key_hints.show_focused(event.widget is self.conversation)

    def on_descendant_blur(self, event: events.DescendantBlur) -> None:
        if event.widget is self.conversation:
            self.key_hints.show_focused(False)

    # -- the session (the pairing's load state, the live controls) ----------------------------------
    def _show_session(self) -> None:
        """The panel as the session is now (the screen may mount after its load started or ended)."""
        session = self.session
        info = session.info
        if info is not None:
            self._show_loaded()
        else:
            self.panel.show_pairing(session.spec.name, session.spec.demo)
            if session.load_error is not None:
                self.panel.show_status(f"load failed: {session.load_error}")
            else:
                self.panel.show_status("loading…")

    def on_pairing_loading(self, message: PairingLoading) -> None:
        self.panel.show_pairing(message.spec.name, message.spec.demo)
        self.panel.show_status("loading…")
        self.stats.dirty = True

    def on_pairing_progress(self, message: PairingProgress) -> None:
        if message.spec is self.session.spec and not self.session.loaded:
            self.panel.show_status(f"loading {message.stage}")

    def on_pairing_loaded(self, message: PairingLoaded) -> None:
        if message.spec is self.session.spec:
            self._show_loaded()

    def on_pairing_failed(self, message: PairingFailed) -> None:
        if message.spec is not self.session.spec:
            return
        self.panel.show_status(f"load failed: {message.error}")
        self.notify(f"Could not load the model: {message.error}", severity="error", timeout=10)

    def _show_loaded(self) -> None:
        info = self.session.info
        if info is None:
            return
        self.legend.update(legend(origin_known=self.session.engine.features.token_origins))
        self.stats.context_length = info.context_length or None
        self.stats.dirty = True
        self.panel.show_pairing(info.name, info.demo, info.served_by)
        if not self.generating:
            self.show_ready()

    def on_kernels_preparing(self, message: KernelsPreparing) -> None:
        """The engine builds this machine's compiled kernels in the background (replies work meanwhile,
        slower): the status says so."""
        if self.reply is None and self.session.loaded:
            self.show_ready()
        elif self.reply is not None and self._prefill is None:
            self.panel.show_status(self._with_kernels("generating… (Esc stops)"))

    def _with_kernels(self, text: str) -> str:
        note = self.session.kernel_note
        return f"{text} · {note}" if note else text

    def on_controls_changed(self, message: ControlsChanged) -> None:
        self.stats.dirty = True  # the panel shows the controls: no toast over the prompt

    def show_ready(self) -> None:
        info = self.session.info
        self.panel.show_status(
            self._with_kernels("ready" + ("" if info is None or info.drafter_path else " (no drafter)"))
        )

    # -- sending ----------------------------------------------------------------------------------
    @property
    def generating(self) -> bool:
        return self.reply is not None

    def on_prompt_submitted(self, message: PromptSubmitted) -> None:
        message.stop()
        if self.images.command(message.text, self.send):
            return
        if self.send(message.text):
            self.prompt.accept()

    def _can_start(self) -> str | None:
        """Why a turn cannot start now, or None."""
        if self.generating:
            return "a reply is still streaming (Esc stops it)"
        if self.tools.active:
            return "a tool call is waiting or running (Esc stops it)"
        if self.session.load_error is not None:
            return f"the model failed to load: {self.session.load_error}"
        if self.session.info is None:
            return "the model is still loading"
        return None

    def send(self, text: str) -> bool:
        """Start a turn with `text`; False (and a notification) if it cannot start."""
        reason = self._can_start() or self.images.not_ready()
        if reason:
            self.notify(f"Not sent: {reason}", severity="error")
            return False
        images = self.images.take()  # their thumbnails and clips go above the message
        content = user_content(text, images)
        self.history.append({"role": "user", "content": content})
        self.chat_log.user_sent(content, self.session.spec)
        self.input_history.sent(text)
        user = UserMessage(text)
        user.set_class(bool(images), "-with-images")
        self.conversation.mount(user)
        self._turn_user = (text, user)
        self.tools.user_sent()
        self._start_turn()
        return True

    def _mount_at_end(self, widget: Widget) -> None:
        self.conversation.mount(widget)
        self.conversation.anchor()

    def _start_turn(self) -> None:
        """The next turn, once MCP servers still starting are ready (ChatTools.wait_for_servers)."""
        if not self.tools.wait_for_servers(self.session.engine.features.tools, self._begin_turn):
            self._begin_turn()

    def _begin_turn(self) -> None:
        self.turn += 1
        session = self.session
        reply = ReplyView(drafter_on=session.has_drafter and session.controls.drafter_enabled)
        self.reply = reply
        session.streaming = True
        self.prompt.cursor_blink = False  # a blinking cursor repaints twice a second while the reply streams
        self.conversation.mount(reply)
        self.conversation.anchor()
        self.stats.start_turn(time.monotonic())
        self.panel.show_status(self._with_kernels("generating… (Esc stops)"))
        self._awaiting_prefill = True
        settings = session.turn_settings(self.settings)
        tools = self.tools.offered(session.engine.features.tools)
        listener = self.bridge.listener(self.turn)
        try:
            if tools:
                self._turn_future = session.engine.chat(list(self.history), settings, listener, tools=tools)
            else:
                self._turn_future = session.engine.chat(list(self.history), settings, listener)
        except Exception as e:  # the contract says it does not raise; a broken engine must not kill the UI
            stats = TurnStats(stop_reason="error")
            self._finish(TurnDone(stats, "", (), error=f"{type(e).__name__}: {e}"))

    # -- events from the engine -------------------------------------------------------------------
    def _drain(self) -> None:
        tokens: list[TokenEvent] = []
        first_t = last_t = 0.0
        for item in self.bridge.drain():
            ev, reply = item.event, self.reply
            if item.turn != self.turn or reply is None:
                continue  # a late event of a finished turn
            if isinstance(ev, TokenEvent):
                if not tokens:
                    first_t = item.t
                tokens.append(ev)
                last_t = item.t
                continue
            # one append per drain: a round summary needs no flush (plain decoding ends a round
            # per token, and an append per token re-wraps the growing text every time)
            if tokens and not isinstance(ev, RoundEvent):
                self._append(tokens, first_t, last_t)
                tokens = []
            if isinstance(ev, RoundEvent):
                self.stats.on_round(ev)
                # its tokens are the last ev.emitted ones so far (1-based, the prefill's first is token 1)
                reply.on_round(ev, reply.token_count + len(tokens) - ev.emitted + 1)
            elif isinstance(ev, Notice):  # about this turn's input (a clip cut, a server without tools)
                self.notify(ev.text, severity="warning", timeout=10, markup=False)
            elif isinstance(ev, PrefillDone):
                self._prefill_over()
                self.stats.on_prefill(ev)
            elif isinstance(ev, (ToolCallStarted, ToolCallDelta, ToolCall, ToolCallError)):
                reply.on_tool_event(ev)
            elif isinstance(ev, TurnDone):
                self._finish(ev)
        if tokens:
            self._append(tokens, first_t, last_t)
        # A TurnDone that never came as an event still ends the turn, through the future.
        fut = self._turn_future
        if self.reply is not None and fut is not None and fut.done() and self.bridge.pending() == 0:
            try:
                done = fut.result()
            except Exception as e:
                done = TurnDone(TurnStats(stop_reason="error"), self.reply.plain, (), error=f"{type(e).__name__}: {e}")
            self._finish(done)

    def _append(self, tokens: list[TokenEvent], first_t: float, last_t: float) -> None:
        assert self.reply is not None
        self.reply.append_tokens(tokens)
        self.stats.on_tokens(len(tokens), first_t, last_t)

    def _show_prefill(self) -> None:
        """While a prompt prefills: how many tokens, for how long so far, and about how long in all at
        the last measured prefill rate (a 100 KB paste takes minutes on a small machine)."""
        if self._prefill is None:
            if not self.session.engine.features.prefill_progress:
                return
            started = self.session.engine.prefilling
            if started is None or self.reply is None or self.reply.plain or not self._awaiting_prefill:
                return
            self._status_before_prefill = self.panel.status_text
            self._prefill = started
            self._prefill_clock = PrefillClock(started.started)
        assert self._prefill_clock is not None  # set with _prefill
        text = self._with_kernels(prefill_text(self._prefill, self.stats.prefill_tps, self._prefill_clock))
        self.panel.show_status(text)
        if self.reply is not None:
            self.reply.set_summary(f"reading the prompt: {text}…")

    def _prefill_over(self) -> None:
        self._awaiting_prefill = False
        if self._prefill is not None:
            self._prefill = None
            self.panel.show_status(self._status_before_prefill)
            if self.reply is not None:
                self.reply.set_summary("streaming…")

    def _finish(self, done: TurnDone) -> None:
        reply = self.reply
        if reply is None:
            return
        self._prefill_over()  # a turn that ended (failed, stopped) during its prefill
        self.reply = None
        self.session.streaming = False
        self.prompt.cursor_blink = True
        self._turn_future = None
        reply.finish(done)
        self.stats.on_done(done.stats)
        if self.session.loaded:
            self.show_ready()
        user = self._turn_user
        self._turn_user = None
        self.images.turn_done(failed=done.stats.stop_reason == "error")
        if done.stats.stop_reason == "error":
            self._turn_failed(reply, user)
            return
        if done.tool_errors:  # shown in the reply (its CallDraft), and kept with it in the history
            reply.record = {
                **(reply.record or {}),
                TOOL_ERRORS: [{"message": e.message, "raw": e.raw} for e in done.tool_errors],
            }
        if reply.call_drafts:  # as written, in their tokens' colours: a reopened chat draws them again
            reply.record = {**(reply.record or {}), CALL_DRAFTS: [d.saved() for d in reply.call_drafts]}
        answer = self.chat_log.reply_done(reply)
        calls = done.tool_calls if done.stats.stop_reason == "tool_calls" else ()
        if calls and self.tools.run(calls, partial(self._tools_done, reply)):
            if answer.strip():  # text before the calls is a message of its own (the template puts content last)
                self.history.append({"role": "assistant", "content": answer})
            self.last_reply = reply
            self.panel.show_status("tool calls… (Esc stops)")
            return
        self.history.append({"role": "assistant", "content": answer})
        self.last_reply = reply
        earlier, self._carry_variants = self._carry_variants, []
        if reply.keep_variant(earlier, greedy=self.settings.temperature == 0):
            self.notify(
                "Same reply: at temperature 0 (greedy) every variant is identical. Raise the "
                "temperature (F9, chat parameters) for a different one.",
                severity="warning",
                timeout=8,
                markup=False,
            )
        if self.view_mode == "rendered":
            reply.flush_markdown()

    def _tools_done(self, reply: ReplyView, outcomes: list[ToolOutcome], stopped: bool) -> None:
        """The reply's calls have their results: into the history (and saved), then the model goes on."""
        self.history.append({"role": "assistant", "content": None, "tool_calls": [o.call.openai() for o in outcomes]})
        for o in outcomes:
            self.history.append({"role": "tool", "tool_call_id": o.call.id, "name": o.call.name, "content": o.content})
        self.chat_log.tool_round(reply, outcomes)
        if stopped or self.session.info is None:
            self.notify("Tool calls stopped: the model does not go on", severity="warning")
            if self.session.loaded:
                self.show_ready()
            return
        self._start_turn()

    def _turn_failed(self, reply: ReplyView, user: tuple[str, UserMessage] | None) -> None:
        """The turn never happened: take the user's message back out of the history and, if the
        prompt is still empty, give the text back to the prompt."""
        if self.history and self.history[-1]["role"] == "user":
            self.history.pop()
            self.chat_log.drop_last()
        if user is not None:
            user[1].remove()
            if not self.prompt.text:
                self.prompt.text = user[0]
                self.prompt.move_cursor(self.prompt.document.end)
        self.notify(f"Generation failed: {reply.error}", severity="error", timeout=8)

    # -- variants of the last reply (regenerate keeps the earlier ones) -----------------------------
    def _step_variant(self, step: int) -> None:
        reply = self.last_reply
        if self.generating or reply is None or len(reply.variants) < 2:
            self.notify("No other variant: Ctrl+R regenerates the last reply", severity="warning")
            return
        index = reply.variant_index + step
        if not 0 <= index < len(reply.variants):
            return
        variant = reply.show_variant(index)
        if self.view_mode == "rendered":
            reply.flush_markdown()
        self.history[-1] = {"role": "assistant", "content": variant.text}
        self.chat_log.variant_shown(reply, variant)

    def action_prev_variant(self) -> None:
        self._step_variant(-1)

    def action_next_variant(self) -> None:
        self._step_variant(+1)

    # -- periodic panel / markdown refresh --------------------------------------------------------
    def _tick(self) -> None:
        self._drain()
        self._ticks += 1
        if self._ticks % round(DRAIN_HZ / PANEL_HZ) == 0:
            self._refresh_panels()
            self._show_prefill()
        now = time.monotonic()
        if self.view_mode == "rendered" and self.reply is not None and now - self._last_markdown >= 1 / MARKDOWN_HZ:
            self._last_markdown = now
            self.reply.flush_markdown()
        elif self.view_mode == "rendered" and self.last_reply is not None and self.last_reply.markdown_stale:
            # the final flush at the end of a reply is skipped while a render is still running
            self.last_reply.flush_markdown()

    def _refresh_panels(self) -> None:
        if self.stats.dirty:
            self.stats.dirty = False
            self.panel.show(self.stats, self.session.tuning())

    # -- actions ----------------------------------------------------------------------------------
    def action_stop(self) -> None:
        if self.tools.active:
            self.tools.stop()
        elif self.reply is not None:
            self.session.engine.cancel()

    def action_tools(self) -> None:
        from app.tui.screens.tools import ToolsScreen

        self.app.push_screen(ToolsScreen(self.tools.hub))

    async def stop_and_keep(self, timeout_s: float = 1.0) -> None:
        """Stop a streaming reply and keep what it said, marked stopped (quitting mid-reply): the
        engine's own TurnDone when it comes within `timeout_s`, else the reply as streamed so far."""
        import asyncio

        self.tools.stop()
        if self.reply is None:
            return
        self.session.engine.cancel()
        deadline = time.monotonic() + timeout_s
        while self.reply is not None and time.monotonic() < deadline:
            self._drain()
            if self.reply is not None:
                await asyncio.sleep(0.02)
        reply = self.reply
        if reply is None:
            return
        stats = TurnStats(
            stop_reason="cancelled",
            tokens=reply.token_count,
            decode_tokens=max(reply.token_count - 1, 0),
            rounds=self.stats.rounds,
            drafted=self.stats.drafted,
            accepted=self.stats.accepted,
            drafter_enabled=self.session.controls.drafter_enabled,
        )
        self._finish(TurnDone(stats, reply.plain, ()))

    def action_regenerate(self) -> None:
        if self.generating:
            self.notify("Stop the current reply first (Esc)", severity="warning")
            return
        reason = self._can_start()
        if reason:
            self.notify(f"Cannot regenerate: {reason}", severity="error")
            return
        if self.last_reply is None or not self.history or self.history[-1]["role"] != "assistant":
            self.notify("Nothing to regenerate yet", severity="warning")
            return
        self.history.pop()
        self.chat_log.drop_last()
        self._carry_variants = list(self.last_reply.variants)  # kept: Alt+←/→ switch back
        self.last_reply.remove()
        self.last_reply = None
        self._turn_user = None
        self._start_turn()

    def action_toggle_view(self) -> None:
        self.view_mode = "rendered" if self.view_mode == "tokens" else "tokens"
        rendered = self.view_mode == "rendered"
        self.conversation.set_class(rendered, "-rendered")
        self.legend.display = not rendered
        if rendered:
            for reply in self.conversation.query(ReplyView):
                reply.flush_markdown()

    def _tuned(self, refused: str | None) -> None:
        """A tuning key's outcome: the panel shows a change; a server that fixes the controls says so."""
        if refused is not None:
            self.notify(f"Not changed: {refused}", severity="warning")

    def action_block_size_up(self) -> None:
        self._tuned(self.session.step_block_size(+1, self.stats.last_block_size))

    def action_block_size_down(self) -> None:
        self._tuned(self.session.step_block_size(-1, self.stats.last_block_size))

    def action_toggle_auto(self) -> None:
        self._tuned(self.session.toggle_auto(self.stats.last_block_size))

    def action_toggle_drafter(self) -> None:
        on = not self.session.controls.drafter_enabled
        refused = self.session.set_drafter_enabled(on)
        if refused is None and self.reply is not None and self.session.has_drafter:
            self.reply.draft_switches.pressed(on)  # the reply's record says from which token
        self._tuned(refused)

    def action_models(self) -> None:
        if self.open_models is not None:
            self.open_models()

    def action_help(self) -> None:
        from app.tui.screens.help import HelpScreen

        if not isinstance(self.app.screen, HelpScreen):
            self.app.push_screen(HelpScreen(self.screen_keys))

    # -- images and audio clips (chat_images) ------------------------------------------------------
    def action_attach_image(self) -> None:
        self.images.open_picker()

    def on_attachments_pasted(self, message: AttachmentsPasted) -> None:
        message.stop()
        self.images.attach(message.paths)

    def audio_refusal(self) -> str | None:
        """Why this chat cannot take an audio clip now, or None: the loaded pairing's own word
        (`features.audio`), or, while one loads, the demo's (it never takes audio). Said before
        anything is read or sent."""
        from app.tui.widgets.attachments import no_audio_text

        session = self.session
        if session.info is not None:
            return None if session.engine.features.audio else no_audio_text(session.info.name)
        return no_audio_text(session.spec.name) if session.spec.demo else None

    # -- chats (saved by app.tui.history) -----------------------------------------------------------
    @property
    def recorder(self) -> HistoryRecorder | None:
        return self.chat_log.recorder

    def _busy(self, what: str) -> bool:
        if self.generating:
            self.notify(f"Stop the current reply first (Esc), then {what}", severity="warning", markup=False)
            return True
        return False

    def clear_conversation(self) -> None:
        self.conversation.remove_children()
        self.history.clear()
        self.last_reply = None
        # the panel's figures were the previous chat's last turn
        self.stats.clear()
        self.panel.show(self.stats, self.session.tuning())
        self._load_input_history()  # the chat left behind is one of the others now

    def _load_input_history(self) -> None:
        """Every chat's messages for Up/Down, read on the history's writer thread (none: history off)."""
        recorder = self.recorder
        if recorder is not None:
            self.run_worker(self._read_input_history(recorder), group="input-history", exclusive=True)

    async def _read_input_history(self, recorder: HistoryRecorder) -> None:
        import asyncio

        try:
            texts = await asyncio.wrap_future(recorder.recent_user_texts())
        except Exception:  # an unreadable history: recall keeps what this session sent
            return
        self.input_history.load(texts)

    def action_new_chat(self) -> None:
        if self._busy("start a new chat"):
            return
        self.clear_conversation()
        self.settings = dataclasses.replace(self.base_settings)
        self.chat_log.start_chat(self.session.spec, self.settings)
        self.notify("New chat")
        self.prompt.focus()

    def action_chats(self) -> None:
        from app.tui.screens.chats import ChatListScreen

        recorder = self.recorder
        if recorder is None:
            self.notify("Chat history is off", severity="warning", markup=False)
            return
        if isinstance(self.app.screen, ChatListScreen):
            return
        self.app.push_screen(ChatListScreen(recorder, current_id=recorder.current.id), self._on_chat_list)

    def _on_chat_list(self, result: tuple[str, int | None] | None) -> None:
        if result:
            self.run_worker(self._chat_list_result(result), group="chats")

    async def _chat_list_result(self, result: tuple[str, int | None]) -> None:
        kind, chat_id = result
        if kind == "new":
            self.action_new_chat()
        elif kind == "open" and chat_id is not None:
            await self.open_chat(chat_id)
        elif kind == "deleted":  # the open chat was deleted: it stays on screen, as a new unsaved chat
            if self.recorder is not None:
                self.chat_log.start_chat(self.session.spec, self.settings)
                self.clear_conversation()

    async def open_chat(self, chat_id: int) -> None:
        recorder = self.recorder
        if recorder is None or self._busy("open another chat"):
            return
        current = self.session.spec

        def load(store: Store) -> tuple[Chat, PairingSpec | None]:
            chat = store.load_chat(chat_id)
            other = None if same_pairing(chat, current) else pairing_spec_for(chat)
            return chat, other

        try:
            chat, other = await recorder.call(load)
        except Exception as e:
            self.notify(f"Could not open the chat: {e}", severity="error", markup=False)
            return
        await self.restore_chat(recorder, chat, other)

    async def restore_chat(self, recorder: HistoryRecorder, chat: Chat, spec: PairingSpec | None = None) -> None:
        """Show a stored chat and continue it: its messages, parameters, and pairing (`spec`: a
        PairingSpec for the chat's pairing when it differs from the loaded one)."""
        self.clear_conversation()
        recorder.adopt(chat)
        self.settings = settings_for_chat(self.base_settings, chat.params, chat.system_prompt)
        widgets = restored_widgets(chat)
        self.history.extend(m for m in chat.engine_messages() if m["role"] != "system")
        if widgets:
            await self.conversation.mount_all(widgets)
        replies = [w for w in widgets if isinstance(w, ReplyView)]
        self.last_reply = replies[-1] if replies and chat.messages[-1].role == "assistant" else None
        if self.view_mode == "rendered":
            for r in replies:
                r.flush_markdown()
        self.conversation.scroll_end(animate=False)
        self.conversation.anchor()
        self._restore_pairing(chat, spec)
        self.notify(f"Opened “{chat.title}”", markup=False)
        self.prompt.focus()

    def _restore_pairing(self, chat: Chat, spec: PairingSpec | None) -> None:
        """Load the chat's pairing if it is not the one loaded; say so when it cannot be found any more."""
        if same_pairing(chat, self.session.spec):
            return
        if spec is not None and self.session.switch(spec) is None:
            self.notify(f"Loading {spec.name}, the pairing this chat was with", markup=False)
            return
        self.notify(
            f"This chat was with {chat.pairing}, which is not available; it continues with {self.session.spec.name}",
            severity="warning",
            timeout=8,
            markup=False,
        )

    # -- parameters and settings --------------------------------------------------------------------
    def supports_thinking(self) -> bool:
        info = self.session.info
        return info is not None and info.supports_thinking

    def _thinking_on_demo(self) -> bool:
        info = self.session.info
        return self.settings.thinking and info is not None and info.demo

    def action_chat_params(self) -> None:
        from app.tui.screens.chat_params import ChatParamsScreen

        if isinstance(self.app.screen, ChatParamsScreen):
            return
        self.app.push_screen(
            ChatParamsScreen(self.settings, thinking_available=self.supports_thinking()), self._on_params
        )

    def _on_params(self, new: GenerationSettings | None) -> None:
        if new is None:
            return
        thinking_before = self.settings.thinking
        self.apply_chat_settings(new)
        self.notify("Chat parameters saved; they apply from the next reply")
        if not thinking_before and self._thinking_on_demo():
            self.notify(DEMO_THINKING_NOTE, severity="warning", timeout=10, markup=False)

    def apply_chat_settings(self, new: GenerationSettings) -> None:
        self.settings = new
        self.chat_log.params_changed(self.settings)

    def action_toggle_thinking(self) -> None:
        if not self.supports_thinking():
            self.notify("This pairing's chat template has no thinking mode", severity="warning")
            return
        on = not self.settings.thinking
        self.apply_chat_settings(dataclasses.replace(self.settings, thinking=on))
        if self._thinking_on_demo():
            self.notify(f"Thinking on from the next reply. {DEMO_THINKING_NOTE}", severity="warning", timeout=10)
        else:
            self.notify(f"Thinking {'on' if on else 'off'} from the next reply", markup=False)

    def action_settings(self) -> None:
        from app.tui.screens.settings import SettingsScreen

        if isinstance(self.app.screen, SettingsScreen):
            return
        self.app.push_screen(SettingsScreen(self.config_path), self._on_settings)

    def _on_settings(self, config: Config | None) -> None:
        if config is None:
            return
        if self.on_config is not None:  # the app keeps the config and applies its theme
            self.on_config(config)
        self.base_settings = config.generation_settings()
        if config.block_size != self.session.controls.block_size:
            self._tuned(self.session.set_block_size(config.block_size))

    # -- copy and export ------------------------------------------------------------------------------
    def _copy(self, text: str, what: str) -> None:
        from core.user.clipboard import system_copy

        # OSC 52 through the terminal (works over SSH), and the system clipboard tool where there is
        # one (for terminals that ignore OSC 52) on a thread: it runs a subprocess.
        self.app.copy_to_clipboard(text)
        self.run_worker(partial(system_copy, text, timeout=2.0), thread=True, group="clipboard", exit_on_error=False)
        lines = text.count("\n") + 1
        self.notify(f"Copied {what} ({lines} line{'s' if lines != 1 else ''})", markup=False)

    def action_copy_reply(self) -> None:
        if self.last_reply is None or not self.last_reply.plain:
            self.notify("No reply to copy yet", severity="warning")
            return
        self._copy(self.last_reply.plain, "the last reply")

    def action_copy_code(self) -> None:
        from core.user.export import last_code_block

        if self.last_reply is None:
            self.notify("No reply to copy from yet", severity="warning")
            return
        code = last_code_block(self.last_reply.plain)
        if code is None:
            self.notify("The last reply has no code block", severity="warning")
            return
        self._copy(code, "the code block")

    def action_export(self) -> None:
        self.run_worker(self._export(), group="export")

    async def _export(self) -> None:
        from core.user.export import export_chat

        recorder = self.recorder
        if recorder is None:
            self.notify("Chat history is off: nothing to export", severity="warning")
            return
        directory = recorder.export_dir

        def export(store: Store) -> Path | None:
            ref_id = recorder.current.id
            if ref_id is None:
                return None
            return export_chat(store.load_chat(ref_id), directory)

        try:
            path = await recorder.call(export)
        except Exception as e:
            self.notify(f"Export failed: {e}", severity="error", markup=False)
            return
        if path is None:
            self.notify("Nothing to export yet", severity="warning")
            return
        self.notify(f"Exported to {path}", timeout=8, markup=False)

    # -- shutdown ---------------------------------------------------------------------------------
    def finish_for_exit(self, timeout_s: float = 1.0) -> None:
        """The app is closing mid-reply: end the turn now so the partial reply is kept and saved as
        stopped (the engine was cancelled; its last events are drained, or the text so far is used)."""
        if self.reply is None:
            return
        fut = self._turn_future
        if fut is not None:
            try:
                fut.result(timeout=timeout_s)
            except Exception:
                pass
        self._drain()
        if self.reply is not None:  # the engine never answered: keep what is on screen
            self._finish(TurnDone(TurnStats(stop_reason="cancelled"), self.reply.plain, ()))

    def shutdown(self, timeout_s: float = 1.5) -> None:
        """Stop the engine without letting a stuck engine hold the UI: close on a helper thread."""
        import threading

        engine = self.session.engine
        try:
            engine.cancel()
        except Exception:
            pass
        closer = threading.Thread(target=engine.close, name="engine-close", daemon=True)
        closer.start()
        closer.join(timeout_s)


def _clock(seconds: float) -> str:
    s = int(seconds + 0.5)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def prefill_text(started: PrefillStarted, last_rate: float | None, clock: PrefillClock) -> str:
    """'prefill 1,200/40,000 tokens · 0:12 · ETA ~6:28': how far a prefill is, and how long it has
    left at the rate it runs at over its last few seconds (`clock`: app.prefill_eta), or, before it
    reports progress, at the last prefill's rate."""
    n = started.prefill_tokens
    elapsed = max(0.0, time.monotonic() - started.started)
    done = min(started.done(), n) if started.done is not None else 0
    seconds: float | None = None
    if done > 0:  # tokens done so far, and the rate this prefill is actually running at
        text = f"prefill {done:,}/{n:,} tokens · {_clock(elapsed)}"
        seconds = clock.seconds_left(done, n)
    else:
        text = f"prefill {n:,} tokens · {_clock(elapsed)}"
        if last_rate:
            seconds = n / last_rate - elapsed
    if seconds is not None:
        text += f" · ETA ~{_clock(max(0.0, seconds))}"
    return text
