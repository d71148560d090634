"""The chat screen: conversation, prompt, live panels, keyboard tuning."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from concurrent.futures import Future
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from textual.app import ComposeResult
from textual.command import DiscoveryHit, Hit, Hits, Provider
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import Static

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
    thinking_section,
    user_texts,
)
from app.tui.live_stats import LiveStats
from app.tui.messages import ImagesPasted, PromptSubmitted, QuickKey
from app.tui.screens.chat_images import ChatImages
from app.tui.widgets.attachments import AttachmentBar, user_content
from app.tui.widgets.conversation import ReplyView, UserMessage, Variant, legend
from app.tui.widgets.key_hints import KeyHints, hints_for
from app.tui.widgets.panel import StatsPanel
from app.tui.widgets.prompt import PromptArea
from core.events import KernelProgress, LoadProgress, PrefillDone, RoundEvent, TokenEvent, TurnDone, TurnStats
from core.limits import MAX_BLOCK_SIZE, MIN_BLOCK_SIZE
from core.settings import GenerationSettings
from core.user import keymap

if TYPE_CHECKING:
    from core.engine.contract import ChatEngine, PairingInfo, PairingSpec
    from core.user.config import Config
    from core.user.store import Chat, Store

MAX_BLOCK = MAX_BLOCK_SIZE


# Below this many columns the side panel gives way to a one-line summary under the conversation.
COMPACT_BELOW = 100


def bind_keys(bindings, screen_keys: tuple[keys.ScreenKey, ...]) -> None:
    """Add the chat actions to a BindingsMap (per screen instance: config overrides differ)."""
    for sk in screen_keys:
        if sk.always:
            # Esc stays non-priority so modal screens and the palette keep their own Esc.
            bindings.bind(sk.always, sk.action, sk.label, show=sk.show, priority=sk.action != "stop")
        if sk.quick:  # when the conversation (not the prompt) has focus
            bindings.bind(sk.quick, sk.action, sk.label, show=sk.show and not sk.always)


def prompt_placeholder(overrides=None) -> str:
    from core.user.keymap import resolve_keys

    resolved = resolve_keys(overrides)

    def key(action: str) -> str:
        first = resolved[action].split(",")[0]
        return "Shift+Enter" if first == "shift+enter" else keys.display_key(first)

    return f"{key('send')} send · {key('newline')} new line · {key('attach_image')} image · {key('help')} help"


class ChatCommands(Provider):
    """Command palette entries for the chat screen's actions."""

    def _commands(self) -> tuple[tuple[str, str, str], ...]:
        return keymap.PALETTE  # the action table (core.user.keymap) that the keys and the help screen read too

    def _run(self, action: str) -> None:
        screen = self.screen
        if isinstance(screen, ChatScreen):
            screen.run_named_action(action)

    async def discover(self) -> Hits:
        for name, action, help_text in self._commands():
            yield DiscoveryHit(name, partial(self._run, action), help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for name, action, help_text in self._commands():
            score = matcher.match(name)
            if score > 0:
                yield Hit(score, matcher.highlight(name), partial(self._run, action), help=help_text)


class ChatScreen(Screen):
    CSS_PATH = str(style_path("chat.tcss"))
    COMMANDS = Screen.COMMANDS | {ChatCommands}

    def __init__(
        self,
        engine: ChatEngine,
        spec: PairingSpec,
        settings: GenerationSettings | None = None,
        key_overrides: dict[str, str] | None = None,
        *,
        recorder: HistoryRecorder | None = None,
        on_config: Callable[[Config], None] | None = None,
        open_models: Callable[[], None] | None = None,
    ) -> None:
        super().__init__()
        self.on_config = on_config  # called with the config the settings screen saved
        self.open_models = open_models  # the app's models screen (F2, the palette's "models")
        self.screen_keys = keys.screen_keys(key_overrides)
        bind_keys(self._bindings, self.screen_keys)
        self.engine = engine
        self.spec = spec
        self.settings = settings or GenerationSettings()
        self.base_settings = dataclasses.replace(self.settings)  # the config's defaults, for new chats
        self.bridge = EventBridge()
        self.stats = LiveStats(block_setting=self.settings.block_size, drafter_enabled=self.settings.drafter_enabled)
        self.history: list[dict] = []
        self.view_mode = "tokens"
        self.turn = 0
        self.reply: ReplyView | None = None  # the reply being streamed
        self.last_reply: ReplyView | None = None
        self._carry_variants: list[Variant] = []  # the earlier variants of a reply being regenerated
        self.load_error: str | None = None
        self.loaded = False
        self.load_stage = ""  # the latest LoadProgress (the models screen shows it)
        self._load_future: Future[PairingInfo] | None = None
        self._turn_future: Future[Any] | None = None
        self._turn_user: tuple[str, UserMessage] | None = None  # a fresh send's text + widget
        # (tokens, start, tokens done so far) while a prompt prefills
        self._prefill: tuple[int, float, Callable[[], int] | None] | None = None
        self._status_before_prefill = ""
        self._awaiting_prefill = False  # a turn was sent and its PrefillDone has not come yet
        self.kernel_note = ""  # while the engine prepares this machine's kernels (KernelProgress), what it says
        self._last_markdown = 0.0
        self._ticks = 0
        self.prompt = PromptArea(quick=keys.quick_actions(key_overrides), id="prompt")
        self.prompt.placeholder = prompt_placeholder(key_overrides)
        self.attachments = AttachmentBar(lambda: self.engine.info, self.prompt.focus, id="attachments")
        self.conversation = VerticalScroll(id="conversation")
        self.panel = StatsPanel(id="panel")
        self.compact_panel = Static("", id="compact-panel", markup=False)
        self.panel.compact = self.compact_panel
        self.panel_hidden = False  # the user's choice (F10)
        self.legend = Static(legend(), id="legend")
        self.key_hints = KeyHints(hints_for(self.screen_keys, key_overrides), id="key-hints")
        self.images = ChatImages(self, self.attachments, self.conversation, self.prompt, lambda: self.engine.info)
        self.chat_log = ChatLog(recorder)
        self.prompt.recall_source = lambda: user_texts(self.history)
        self.chat_log.start_chat(self.spec, self.settings)

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
        self.panel.show_pairing(self.spec.name, self.spec.demo)
        self.panel.show_status("loading…")
        self.panel.show(self.stats)
        self._load_future = self.engine.load(self.spec, self.bridge.listener(0))
        # One timer for everything that repaints while a reply streams: each screen update costs
        # about the same however little changed (Textual re-composites every widget whose clip
        # meets the changed rows), so the panels ride on a drain tick rather than adding frames.
        self.set_interval(1 / DRAIN_HZ, self._tick, name="drain")
        self.prompt.focus()

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
        if self.load_error is not None:
            return f"the model failed to load: {self.load_error}"
        if not self.loaded or self.engine.info is None:
            return "the model is still loading"
        return None

    def send(self, text: str) -> bool:
        """Start a turn with `text`; False (and a notification) if it cannot start."""
        reason = self._can_start() or self.images.not_ready()
        if reason:
            self.notify(f"Not sent: {reason}", severity="error")
            return False
        images = self.images.take()  # their thumbnails go above the message
        content = user_content(text, images)
        self.history.append({"role": "user", "content": content})
        self.chat_log.user_sent(content, self.spec)
        user = UserMessage(text)
        user.set_class(bool(images), "-with-images")
        self.conversation.mount(user)
        self._turn_user = (text, user)
        self._start_turn()
        return True

    def _start_turn(self) -> None:
        self.turn += 1
        reply = ReplyView()
        self.reply = reply
        self.prompt.live = True
        self.prompt.cursor_blink = False  # a blinking cursor repaints twice a second while the reply streams
        self.conversation.mount(reply)
        self.conversation.anchor()
        self.stats.start_turn(time.monotonic())
        self.panel.show_status(self._with_kernels("generating… (Esc stops)"))
        self._awaiting_prefill = True
        settings = dataclasses.replace(
            self.settings, block_size=self.stats.block_setting, drafter_enabled=self.stats.drafter_enabled
        )
        try:
            self._turn_future = self.engine.chat(list(self.history), settings, self.bridge.listener(self.turn))
        except Exception as e:  # the contract says it does not raise; a broken engine must not kill the UI
            stats = TurnStats(stop_reason="error")
            self._finish(TurnDone(stats, "", (), error=f"{type(e).__name__}: {e}"))

    # -- events from the engine -------------------------------------------------------------------
    def _drain(self) -> None:
        items = self.bridge.drain()
        tokens: list[TokenEvent] = []
        first_t = last_t = 0.0
        for item in items:
            ev = item.event
            if isinstance(ev, LoadProgress):
                self.load_stage = f"{ev.stage} {ev.fraction:.0%}"
                if not self.loaded and self.load_error is None:
                    self.panel.show_status(f"loading {ev.stage} {ev.fraction:.0%}")
                continue
            if isinstance(ev, KernelProgress):
                self._on_kernels(ev)
                continue
            if item.turn != self.turn or self.reply is None:
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
            elif isinstance(ev, PrefillDone):
                self._prefill_over()
                self.stats.on_prefill(ev)
            elif isinstance(ev, TurnDone):
                self._finish(ev)
        if tokens:
            self._append(tokens, first_t, last_t)
        # after the events: the load's last progress event must not overwrite its outcome
        if self._load_future is not None and self._load_future.done():
            self._on_loaded(self._load_future)
            self._load_future = None
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

    def _on_loaded(self, fut) -> None:
        try:
            info = fut.result()
        except Exception as e:
            self.load_error = f"{type(e).__name__}: {e}" if not str(e) else str(e)
            self.panel.show_status(f"load failed: {self.load_error}")
            self.notify(f"Could not load the model: {self.load_error}", severity="error", timeout=10)
            return
        self.loaded = True
        features = self.engine.features
        if not features.token_origins:  # a server that does not say (vLLM)
            self.legend.update(legend(origin_known=False))
        self.stats.has_drafter = info.drafter_path is not None
        self.stats.block_by_server = not features.live_controls
        self.stats.context_length = info.context_length or None
        self.stats.dirty = True
        self.panel.show_pairing(info.name, bool(info.demo))
        if not self.generating:
            self.show_ready()

    def show_ready(self) -> None:
        info = self.engine.info
        self.panel.show_status(
            self._with_kernels("ready" + ("" if info is None or info.drafter_path else " (no drafter)"))
        )

    def _on_kernels(self, ev: KernelProgress) -> None:
        """The engine builds this machine's compiled kernels in the background (replies work meanwhile,
        slower): say so, with the real share of the preparation done."""
        self.kernel_note = "" if ev.done else f"preparing kernels for this machine, first run only… {ev.fraction:.0%}"
        if self.reply is None and self.loaded:
            self.show_ready()
        elif self.reply is not None and self._prefill is None:
            self.panel.show_status(self._with_kernels("generating… (Esc stops)"))

    def _with_kernels(self, text: str) -> str:
        return f"{text} · {self.kernel_note}" if self.kernel_note else text

    def switch_pairing(self, spec) -> bool:
        """Load another pairing into the running engine (the models screen's Use). The conversation
        stays; the next turn is prefilled on the new model. False, doing nothing, while a reply streams."""
        if self.generating:
            return False
        if not self.engine.features.choose_pairing:  # --connect: the server chose the model
            self.notify("Connected to a server (--connect): the model is chosen there", severity="warning")
            return False
        self.spec = spec
        self.loaded = False
        self.load_error = None
        self.load_stage = ""
        self.panel.show_pairing(spec.name, spec.demo)
        self.panel.show_status("loading…")
        self._load_future = self.engine.load(spec, self.bridge.listener(0))
        return True

    def _show_prefill(self) -> None:
        """While a prompt prefills: how many tokens, for how long so far, and about how long in all at
        the last measured prefill rate (a 100 KB paste takes minutes on a small machine)."""
        if self._prefill is None:
            started = self.engine.prefilling
            if started is None or self.reply is None or self.reply.plain or not self._awaiting_prefill:
                return
            self._status_before_prefill = self.panel.status_text
            self._prefill = (started.prefill_tokens, started.started, started.done)
        n, t0, progress = self._prefill
        elapsed = max(0.0, time.monotonic() - t0)
        done = min(progress(), n) if progress is not None else 0
        if done > 0:  # tokens done so far, and the rate this prefill is actually running at
            text = f"prefill {done:,}/{n:,} tokens · {_clock(elapsed)}"
            rate: float | None = done / elapsed if elapsed > 0 else None
            left = n - done
        else:
            text = f"prefill {n:,} tokens · {_clock(elapsed)}"
            rate, left = self.stats.prefill_tps, n
        if rate:
            text += f" · ETA ~{_clock(max(0.0, left / rate - (elapsed if done == 0 else 0.0)))}"
        text = self._with_kernels(text)
        self.panel.show_status(text)
        if self.reply is not None:
            self.reply.summary.update(f"reading the prompt: {text}…")

    def _prefill_over(self) -> None:
        self._awaiting_prefill = False
        if self._prefill is not None:
            self._prefill = None
            self.panel.show_status(self._status_before_prefill)
            if self.reply is not None:
                self.reply.summary.update("streaming…")

    def _finish(self, done: TurnDone) -> None:
        reply = self.reply
        if reply is None:
            return
        self._prefill_over()  # a turn that ended (failed, stopped) during its prefill
        self.reply = None
        self.prompt.live = False
        self.prompt.cursor_blink = True
        self._turn_future = None
        reply.finish(done)
        self.stats.on_done(done.stats)
        if self.loaded:
            self.show_ready()
        user = self._turn_user
        self._turn_user = None
        self.images.turn_done(failed=done.stats.stop_reason == "error")
        if done.stats.stop_reason == "error":
            # The turn never happened: take the user's message back out of the history and, if
            # the prompt is still empty, give the text back to the prompt.
            if self.history and self.history[-1]["role"] == "user":
                self.history.pop()
                self.chat_log.drop_last()
            if user is not None:
                user[1].remove()
                if not self.prompt.text:
                    self.prompt.text = user[0]
                    self.prompt.move_cursor(self.prompt.document.end)
            self.notify(f"Generation failed: {reply.error}", severity="error", timeout=8)
            return
        answer = self.chat_log.reply_done(reply, done)
        self.history.append({"role": "assistant", "content": answer})
        self.last_reply = reply
        self._keep_variant(reply, done)
        if self.view_mode == "rendered":
            reply.flush_markdown()

    # -- variants of the last reply (regenerate keeps the earlier ones) -----------------------------
    def _keep_variant(self, reply: ReplyView, done: TurnDone) -> None:
        earlier, self._carry_variants = self._carry_variants, []
        thinking = reply.thinking_text
        variant = Variant(
            text=reply.plain,
            tokens=reply.tokens.text.copy(),
            summary=str(reply.summary.render()),
            header=str(reply.header.render()),
            stopped=reply.stopped,
            thinking=str(thinking) if thinking else None,
            stats=done.stats,
        )
        reply.variants = [*earlier, variant]
        reply.variant_index = len(reply.variants) - 1
        if earlier:
            same = earlier[-1].text == variant.text
            greedy = self.settings.temperature == 0
            if same and greedy:
                variant.header += "  (identical: temperature 0 is greedy)"
                self.notify(
                    "Same reply: at temperature 0 (greedy) every variant is identical. Raise the "
                    "temperature (F9, chat parameters) for a different one.",
                    severity="warning",
                    timeout=8,
                    markup=False,
                )
            self._show_variant(reply, reply.variant_index, record=False)

    def _show_variant(self, reply: ReplyView, index: int, record: bool = True) -> None:
        v = reply.variants[index]
        reply.variant_index = index
        reply.tokens.set_text(v.tokens)
        reply.chunks = [v.text]
        reply._markdown_dirty = True
        if self.view_mode == "rendered":
            reply.flush_markdown()
        n = len(reply.variants)
        keys_hint = f"  ◀ {index + 1}/{n} ▶" if n > 1 else ""
        reply.header.update(v.header + keys_hint)
        reply.summary.update(v.summary)
        reply.stopped = v.stopped
        reply.set_class(v.stopped, "-stopped")
        for old in reply.query(".thinking"):
            old.remove()
        if v.thinking:
            reply.mount(thinking_section(v.thinking), before=reply.tokens)
        if record:
            self.history[-1] = {"role": "assistant", "content": v.text}
            self.chat_log.variant_shown(reply, v.text, thinking=v.thinking, stats=v.stats, stopped=v.stopped)

    def _step_variant(self, step: int) -> None:
        reply = self.last_reply
        if self.generating or reply is None or len(reply.variants) < 2:
            self.notify("No other variant: Ctrl+R regenerates the last reply", severity="warning")
            return
        index = reply.variant_index + step
        if not 0 <= index < len(reply.variants):
            return
        self._show_variant(reply, index)

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
        elif self.view_mode == "rendered" and self.last_reply is not None and self.last_reply._markdown_dirty:
            # the final flush at the end of a reply is skipped while a render is still running
            self.last_reply.flush_markdown()

    def _refresh_panels(self) -> None:
        if self.stats.dirty:
            self.stats.dirty = False
            self.panel.show(self.stats)

    # -- actions ----------------------------------------------------------------------------------
    def run_named_action(self, action: str) -> None:
        getattr(self, f"action_{action}")()

    def on_quick_key(self, message: QuickKey) -> None:
        message.stop()
        self.run_named_action(message.action)

    def action_stop(self) -> None:
        if self.reply is not None:
            self.engine.cancel()

    async def stop_and_keep(self, timeout_s: float = 1.0) -> None:
        """Stop a streaming reply and keep what it said, marked stopped (quitting mid-reply): the
        engine's own TurnDone when it comes within `timeout_s`, else the reply as streamed so far."""
        import asyncio

        if self.reply is None:
            return
        self.engine.cancel()
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
            drafter_enabled=self.stats.drafter_enabled,
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

    def _fixed_by_server(self) -> bool:
        """A remote server that takes no live block-size or drafter changes says so (no effect)."""
        features = self.engine.features
        if features.live_controls:
            return False
        self.notify(f"Not changed: {features.controls_note or 'the server fixes them'}", severity="warning")
        return True

    def _set_block(self, k: int | str) -> None:
        if self._fixed_by_server():
            return
        self.stats.block_setting = k
        self.stats.dirty = True
        self.engine.set_block_size(k)

    def _current_k(self) -> int:
        if isinstance(self.stats.block_setting, int):
            return self.stats.block_setting
        return self.stats.last_block_size or 4

    def action_block_size_up(self) -> None:
        self._set_block(min(self._current_k() + 1, MAX_BLOCK))

    def action_block_size_down(self) -> None:
        self._set_block(max(self._current_k() - 1, MIN_BLOCK_SIZE))

    def action_toggle_auto(self) -> None:
        self._set_block(self._current_k() if self.stats.block_setting == "auto" else "auto")

    def action_toggle_drafter(self) -> None:
        if self._fixed_by_server():
            return
        on = not self.stats.drafter_enabled
        self.stats.drafter_enabled = on
        self.stats.dirty = True
        self.engine.set_drafter_enabled(on)  # the panel shows the state; no toast over the prompt

    def action_models(self) -> None:
        if self.open_models is not None:
            self.open_models()

    def action_help(self) -> None:
        from app.tui.screens.help import HelpScreen

        if not isinstance(self.app.screen, HelpScreen):
            self.app.push_screen(HelpScreen(self.screen_keys))

    # -- images (chat_images) ----------------------------------------------------------------------
    def action_attach_image(self) -> None:
        self.images.open_picker()

    def on_images_pasted(self, message: ImagesPasted) -> None:
        message.stop()
        self.images.attach(message.paths)

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
        self.panel.show(self.stats)

    def _with_live_controls(self, settings: GenerationSettings) -> GenerationSettings:
        """`settings` with this screen's block size and drafter switch (live controls, not chat parameters)."""
        return dataclasses.replace(
            settings, block_size=self.settings.block_size, drafter_enabled=self.settings.drafter_enabled
        )

    def action_new_chat(self) -> None:
        if self._busy("start a new chat"):
            return
        self.clear_conversation()
        self.settings = self._with_live_controls(self.base_settings)
        self.chat_log.start_chat(self.spec, self.settings)
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
                self.chat_log.start_chat(self.spec, self.settings)
                self.clear_conversation()

    async def open_chat(self, chat_id: int) -> None:
        recorder = self.recorder
        if recorder is None or self._busy("open another chat"):
            return
        current = self.spec

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
        self.settings = self._with_live_controls(settings_for_chat(self.base_settings, chat.params, chat.system_prompt))
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
        if same_pairing(chat, self.spec):
            return
        if spec is not None and self.switch_pairing(spec):
            self.notify(f"Loading {spec.name}, the pairing this chat was with", markup=False)
            return
        self.notify(
            f"This chat was with {chat.pairing}, which is not available; it continues with {self.spec.name}",
            severity="warning",
            timeout=8,
            markup=False,
        )

    # -- parameters and settings --------------------------------------------------------------------
    def supports_thinking(self) -> bool:
        info = self.engine.info
        return info is not None and info.supports_thinking

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
        self.apply_chat_settings(new)
        self.notify("Chat parameters saved; they apply from the next reply")

    def apply_chat_settings(self, new: GenerationSettings) -> None:
        self.settings = self._with_live_controls(new)
        self.chat_log.params_changed(self.settings)

    def action_toggle_thinking(self) -> None:
        if not self.supports_thinking():
            self.notify("This pairing's chat template has no thinking mode", severity="warning")
            return
        on = not self.settings.thinking
        self.apply_chat_settings(dataclasses.replace(self.settings, thinking=on))
        self.notify(f"Thinking {'on' if on else 'off'} from the next reply", markup=False)

    def action_settings(self) -> None:
        from app.tui.screens.settings import SettingsScreen

        if isinstance(self.app.screen, SettingsScreen):
            return
        self.app.push_screen(SettingsScreen(getattr(self.app, "config_path", None)), self._on_settings)

    def _on_settings(self, config: Config | None) -> None:
        if config is None:
            return
        if self.on_config is not None:  # the app keeps the config and applies its theme
            self.on_config(config)
        self.base_settings = config.generation_settings()
        if config.block_size != self.stats.block_setting:
            self._set_block(config.block_size)

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

        try:
            self.engine.cancel()
        except Exception:
            pass
        closer = threading.Thread(target=self.engine.close, name="engine-close", daemon=True)
        closer.start()
        closer.join(timeout_s)


def _clock(seconds: float) -> str:
    s = int(seconds + 0.5)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"
