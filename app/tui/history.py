"""Chat history in the TUI: saving turns, reopening chats, per-chat parameters, copy and export.

`HistoryRecorder` owns the Store and ONE writer thread. Every Store call (writes, and the reads the
screens make) runs there in order, so a reply is never written before its user message and a list
read after a send sees it; the UI never waits on SQLite (awaiting a result is `await recorder.call`).
A chat row is created with its first user message, so opening the app and leaving does not leave
empty "New chat" rows behind.

`ChatLog` is what the chat screen calls when a chat starts, a turn is sent, finishes or is dropped,
and when its parameters change; the screen's own actions (new chat, the chat list, settings, copy,
export) use it and the helpers here, passing in what they need.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.text import Text

from app.tui.widgets.audio_clip import AudioStrip
from app.tui.widgets.conversation import (
    CallDraft,
    ReplyView,
    UserMessage,
    Variant,
    displayable,
    origin_runs,
    text_with_origins,
)
from app.tui.widgets.tool_call import ToolCallView
from core.decode.prompt import ThinkingMarkers, split_thinking
from core.settings import GenerationSettings
from core.user.store import CALL_DRAFTS, TOOL_CALLS, TOOL_ERRORS, TOOL_RESULTS, Chat, decode_origins, encode_origins

if TYPE_CHECKING:
    from core.engine.contract import PairingSpec
    from core.user.store import Store

# Gemma 4's channel markers; the engine keeps them in reply text (core.decode.detok) so they can be split here.
THINKING_MARKERS = ThinkingMarkers("<|channel>", "<channel|>")
# The GenerationSettings fields a chat keeps as its own parameters (the rest are live controls).
CHAT_PARAMS = ("temperature", "top_p", "top_k", "max_tokens", "seed", "thinking")


def chat_params(settings: GenerationSettings) -> dict[str, Any]:
    return {name: value for name, value in dataclasses.asdict(settings).items() if name in CHAT_PARAMS}


def settings_for_chat(
    base: GenerationSettings, params: dict[str, Any], system_prompt: str | None
) -> GenerationSettings:
    """`base` (the config's defaults) with a stored chat's parameters on top; unknown keys ignored."""
    from core.settings import SAMPLING_CHECKS, BadValue

    known = {}
    for k, v in params.items():
        if k not in CHAT_PARAMS:
            continue
        check = SAMPLING_CHECKS.get(k)
        if check is not None and v is not None:
            try:
                v = check(v)
            except BadValue:  # stored by an older build that let it through: the default instead
                continue
        known[k] = v
    return dataclasses.replace(base, **known, system_prompt=system_prompt)


def message_parts(content: Any) -> tuple[str, list[str]]:
    """(text, attached file paths) of an engine message's content (a string, or text, image and audio
    items): the paths of its images and audio clips, in the content's order."""
    if isinstance(content, str):
        return content, []
    texts: list[str] = []
    images: list[str] = []
    for part in content or ():
        if not isinstance(part, dict):
            continue
        if part.get("type") in ("image", "audio") and part.get("path"):
            images.append(str(part["path"]))
        elif part.get("type") == "text":
            texts.append(str(part.get("text", "")))
    return "\n".join(texts), images


@dataclass(frozen=True)
class PairingIdentity:
    """The pairing a chat's messages are sent to, as the store records it."""

    pairing: str | None
    target_id: str | None
    drafter_id: str | None


@dataclass
class ChatRef:
    """The chat being recorded. `id` is filled in on the writer thread when its first message is
    saved; UI code reads it only through the writer (or after `flush`)."""

    id: int | None = None
    count: int = 0  # messages saved (or queued) in it: the next message's seq
    identity: PairingIdentity = PairingIdentity(None, None, None)
    params: dict[str, Any] = field(default_factory=dict)
    system_prompt: str | None = None
    created: bool = False  # this recorder created its row (with its first message)


# What the writer runs: a function of the Store (its result is the future's).
StoreCall = Callable[..., Any]


@dataclass
class PendingWrite:
    """One recorded change waiting for the store: the function the writer runs, and what it saves
    (for the recovery file when the history never comes back)."""

    fn: Callable[[Store], None]
    record: dict[str, Any] | None = None


class HistoryRecorder:
    RETRY_S = 15.0  # how often the app retries writes kept while the history is unusable

    def __init__(
        self,
        store: Store | None = None,
        *,
        path: str | Path | None = None,
        on_error: Callable[[str], None] | None = None,
        export_dir: str | Path | None = None,
    ) -> None:
        self._store = store
        self._owns_store = store is None  # opened (and, after a failure, reopened) here
        self._path = path
        # called on the writer thread with one sentence: the history failed (messages kept), or is back
        self.on_error = on_error
        self.on_recovered: Callable[[str], None] | None = None
        self.export_dir = Path(export_dir) if export_dir is not None else None
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="history")
        self._lock = threading.Lock()
        self.current = ChatRef()
        self.failed = False  # the last write could not be saved; `backlog` holds it and what followed
        self.backlog: list[PendingWrite] = []  # writer thread only
        self.recovery_file: Path | None = None  # where close() put what could never be saved

    # -- the writer thread ------------------------------------------------------------------------
    @property
    def store(self) -> Store:
        """The Store, opened on first use (call only on the writer thread). A failed open is retried
        at the next use: the user may have fixed the file meanwhile."""
        if self._store is None:
            from core.user.store import Store

            self._store = Store(self._path)
        return self._store

    def submit(self, fn: StoreCall, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        """Run `fn(store, *args)` on the writer thread; a failure is the future's (the caller says it)."""
        return self._pool.submit(self._run, fn, args, kwargs)

    def _run(self, fn: StoreCall, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        try:
            return fn(self.store, *args, **kwargs)
        except Exception as e:
            self._forget_broken_store(e)
            raise

    def _forget_broken_store(self, error: Exception) -> None:
        from core.user.store import StoreError

        if isinstance(error, StoreError) and self._store is not None and self._owns_store:
            try:
                self._store.close()
            except Exception:
                pass
            self._store = None  # reopened at the next use

    async def call(self, fn: StoreCall, *args: Any, **kwargs: Any) -> Any:
        """Await `fn(store, *args)` without blocking the UI."""
        return await asyncio.wrap_future(self.submit(fn, *args, **kwargs))

    def write(
        self, fn: Callable[[Store], None], record: dict[str, Any] | None = None
    ) -> concurrent.futures.Future[None]:
        """Queue a recorded change. When the store fails it is kept, with everything after it, in
        order, and written when the store works again (the next write, `retry`, or `close`)."""
        return self._pool.submit(self._queue_write, PendingWrite(fn, record))

    def _queue_write(self, pending: PendingWrite) -> None:
        self.backlog.append(pending)
        self._drain()

    def retry(self) -> concurrent.futures.Future[bool] | None:
        """Try the kept writes again (the app calls it on a timer while `failed`)."""
        return self._pool.submit(self._drain) if self.failed else None

    def _drain(self) -> bool:
        from core.user.store import StoreError

        saved = 0
        while self.backlog:
            pending = self.backlog[0]
            try:
                pending.fn(self.store)
            except (StoreError, OSError) as e:  # the history is unusable: keep it, try again later
                self._forget_broken_store(e)
                if not self.failed:
                    self.failed = True
                    self._tell(
                        self.on_error,
                        f"History not saved: {e}. Your messages are kept and saved when it works again.",
                    )
                return False
            except Exception as e:  # this one write is wrong (its chat was deleted meanwhile): skip it
                self._tell(self.on_error, f"History not saved: {type(e).__name__}: {e}")
            else:
                saved += 1
            self.backlog.pop(0)
        if self.failed:
            self.failed = False
            n = saved
            self._tell(self.on_recovered, f"History saved again ({n} kept change{'s' if n != 1 else ''} written)")
        return True

    @staticmethod
    def _tell(callback: Callable[[str], None] | None, message: str) -> None:
        if callback is not None:
            try:
                callback(message)
            except Exception:
                pass

    def flush(self, timeout: float = 10.0) -> None:
        """Wait until everything queued so far is written (tests, shutdown)."""
        self._pool.submit(lambda: None).result(timeout)

    def close(self) -> Path | None:
        """Write what is queued (one last try for kept writes); what still cannot be saved goes to a
        JSON recovery file, whose path is returned (and kept in `recovery_file`)."""
        try:
            self._pool.submit(self._last_drain).result(30.0)
        except Exception:
            pass
        self._pool.shutdown(wait=True)
        if self.backlog:
            self.recovery_file = self._write_recovery()
        if self._store is not None:
            try:
                self._store.close()
            except Exception:
                pass
        return self.recovery_file

    def _last_drain(self) -> None:
        # the history already failed: one short try at exit, not the full wait for a lock
        if self.failed:
            try:
                self.store._con.execute("PRAGMA busy_timeout = 1000")
            except Exception as e:  # it still cannot be opened: what is kept goes to the recovery file
                self._forget_broken_store(e)
                return
        self._drain()

    def _write_recovery(self) -> Path | None:
        import json
        import os
        import tempfile
        import time

        records = [p.record for p in self.backlog if p.record is not None]
        if not records:
            return None
        name = f"unsaved-chat-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.json"
        places = []
        if self._path is not None and str(self._path) != ":memory:":
            places.append(Path(self._path).parent)
        else:
            from core.user import paths

            places.append(paths.data_dir())
        places.append(Path(tempfile.gettempdir()))
        body = json.dumps({"messages": records}, ensure_ascii=False, indent=2, default=str)
        for place in places:
            target = place / name
            try:
                fd = os.open(target, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    f.write(body)
                return target
            except OSError:
                continue
        return None

    # -- recording the current chat (UI thread) ----------------------------------------------------
    def start_chat(self, identity: PairingIdentity, params: dict[str, Any], system_prompt: str | None) -> ChatRef:
        """Forget the current chat; the next user message creates a new one with these values."""
        self.current = ChatRef(None, 0, identity, dict(params), system_prompt)
        return self.current

    def adopt(self, chat: Chat) -> ChatRef:
        """Continue a stored chat."""
        identity = PairingIdentity(chat.pairing, chat.target_id, chat.drafter_id)
        self.current = ChatRef(chat.id, len(chat.messages), identity, dict(chat.params), chat.system_prompt)
        return self.current

    def record_user(self, text: str, images: list[str], identity: PairingIdentity | None = None) -> None:
        """A user message; `images`: its attached files (images and audio clips). `identity`: the
        pairing it is sent to; a chat continued on another pairing records the new one."""
        ref = self.current
        ref.count += 1
        moved = identity is not None and identity != ref.identity
        if identity is not None:
            ref.identity = identity

        def write(store: Store) -> None:
            who = ref.identity
            if ref.id is not None and moved:
                store.update_chat(ref.id, pairing=who.pairing, target_id=who.target_id, drafter_id=who.drafter_id)
            if ref.id is None:
                ref.id = store.create_chat(
                    pairing=who.pairing,
                    target_id=who.target_id,
                    drafter_id=who.drafter_id,
                    params=ref.params,
                    system_prompt=ref.system_prompt,
                )
                ref.created = True
            store.append_user_message(ref.id, text, attachments=[p for p in images if Path(p).is_file()])

        self.write(write, {"role": "user", "content": text, "images": list(images)})

    def record_reply(
        self, text: str, *, thinking: str | None, stats: Any, stopped: bool, origins: str | None = None
    ) -> None:
        """A reply; `stats`: a TurnStats or its dict (a reply's record, app.tui.widgets.conversation)."""
        ref = self.current
        ref.count += 1

        def write(store: Store) -> None:
            if ref.id is not None:
                store.append_assistant_message(
                    ref.id, text, thinking=thinking or None, stats=stats, stopped=stopped, origins=origins
                )

        self.write(write, {"role": "assistant", "content": text, "thinking": thinking or None, "stopped": stopped})

    def drop_last(self) -> None:
        """The last message (a reply being regenerated, or a user message whose turn failed) is gone.
        A chat this recorder created that is left with no message is deleted: a first message whose
        turn failed (a server that cannot be reached) leaves no empty chat in the list."""
        ref = self.current
        if ref.count == 0:
            return
        ref.count -= 1
        seq = ref.count

        def write(store: Store) -> None:
            if ref.id is None:
                return
            if seq == 0 and ref.created:
                store.delete_chat(ref.id)
                ref.id, ref.created = None, False  # the next message creates it again
                return
            store.truncate_chat(ref.id, seq)

        self.write(write, {"drop_from": seq})

    def update_params(self, params: dict[str, Any], system_prompt: str | None) -> None:
        ref = self.current
        ref.params = dict(params)
        ref.system_prompt = system_prompt

        def write(store: Store) -> None:
            if ref.id is not None:  # not saved yet: create_chat will take them
                store.update_chat(ref.id, params=ref.params, system_prompt=ref.system_prompt)

        self.write(write)

    def current_id(self) -> int | None:
        """The current chat's id once its first message is written (waits for the writer)."""
        ref = self.current
        return self._pool.submit(lambda: ref.id).result(10.0)

    def recent_user_texts(self) -> concurrent.futures.Future[list[str]]:
        """The user's messages of every chat, newest first (the prompt's Up/Down recall)."""
        return self.submit(lambda store: store.recent_user_messages())


def same_pairing(chat: Chat, spec: PairingSpec) -> bool:
    if not chat.pairing and not chat.target_id:
        return True  # nothing recorded: any pairing will do
    if chat.target_id:
        return (chat.target_id, chat.drafter_id) == (spec.target, spec.drafter)
    return chat.pairing == spec.name


def pairing_spec_for(chat: Chat) -> PairingSpec | None:
    """A PairingSpec (core.engine.pairings) for the pairing a stored chat ran on: its recorded directories
    if they are still there, else the catalogue pairing of that name if it is downloaded; None if
    neither. Touches the disk: call it off the UI thread."""
    from core.engine.pairings import catalogue_spec, checkpoint_spec
    from core.hub.pairing import PairingError

    target, drafter = chat.target_id, chat.drafter_id
    if target and Path(target).is_dir() and (drafter is None or Path(drafter).is_dir()):
        try:
            return checkpoint_spec(target, drafter, name=chat.pairing or Path(target).name)
        except PairingError:
            pass
    if chat.pairing:
        try:
            return catalogue_spec(chat.pairing)
        except PairingError:  # unknown, or not downloaded any more
            return None
    return None


# --- replies with thinking, and replies restored from the history -------------------------------------
def answer_spans(text: str, markers: ThinkingMarkers) -> list[tuple[int, int]]:
    """Where split_thinking's answer lies in `text`: the (start, end) pieces outside the channels,
    leading whitespace of the whole answer left out (as split_thinking does)."""
    spans: list[tuple[int, int]] = []
    pos = 0
    while True:
        i = text.find(markers.start, pos)
        if i < 0:
            spans.append((pos, len(text)))
            break
        spans.append((pos, i))
        j = text.find(markers.end, i + len(markers.start))
        if j < 0:
            break
        pos = j + len(markers.end)
    out: list[tuple[int, int]] = []
    for a, b in spans:
        if not out:  # still skipping the answer's leading whitespace
            while a < b and text[a].isspace():
                a += 1
            if a == b:
                continue
        out.append((a, b))
    return out


def show_thinking(reply: ReplyView, thinking: str, answer: str) -> None:
    """Fold a finished reply's thinking into a collapsed section above the answer, and leave only the
    answer (with its token colours) in the token view and the reply text."""
    full = reply.tokens.text
    kept = Text()
    if len(full) == len(reply.plain):  # the token view holds the whole reply, character for character
        for a, b in answer_spans(reply.plain, THINKING_MARKERS):
            kept.append_text(full[a:b])
    if kept.plain != displayable(answer):  # the view and the text disagree: the answer, uncoloured
        kept = Text(displayable(answer))
    reply.show_answer(kept, answer, thinking or None)


def reply_origins(reply: ReplyView, answer: str) -> str | None:
    """The answer's per-token origins as stored (core.user.store.encode_origins), None when the token view
    does not hold exactly the answer's characters."""
    text = reply.tokens.text
    if len(text) != len(answer):
        return None
    return encode_origins(origin_runs(text)) or None


class RestoredReply(ReplyView):
    """A reply read back from the history: its text with the per-token origin colours stored with it
    (replies saved before those were stored show uncoloured, and say so), its thinking collapsed,
    and its stored statistics as the summary."""

    def __init__(
        self,
        text: str,
        *,
        thinking: str | None = None,
        stats: dict[str, Any] | None = None,
        stopped: bool = False,
        origins: str | None = None,
    ) -> None:
        super().__init__()
        self.restored_text = text
        self.restored_thinking = thinking
        self.restored_origins = decode_origins(origins, len(text))
        self.record = stats
        self.stopped = stopped
        self.chunks = [text]

    def on_mount(self) -> None:
        from core.user.export import stats_line

        # set_text, not an append: a finished reply keeps no blank rows reserved for streaming
        tokens = text_with_origins(displayable(self.restored_text), self.restored_origins)
        self.show_answer(tokens, self.restored_text, self.restored_thinking)
        self.set_header("gemma  ■ stopped" if self.stopped else "gemma")
        self.set_class(self.stopped, "-stopped")
        line = stats_line(self.record) if self.record else ""
        if self.restored_origins is None and self.restored_text:
            line = f"{line} · token colours not recorded" if line else "token colours not recorded"
        self.set_summary(line or "(from history)")
        self.call_drafts = restored_call_drafts(self.record or {})
        if self.call_drafts:  # where the live reply showed them: under its text, above its summary
            self.mount(*self.call_drafts, before=self.summary)

    @property
    def streaming(self) -> bool:
        return False


# --- the chat screen's side -----------------------------------------------------------------------------
def chat_identity(spec: PairingSpec) -> PairingIdentity:
    """The pairing a chat's messages are sent to, as the store records it."""
    return PairingIdentity(spec.name, spec.target, spec.drafter)


class ChatLog:
    """What the chat screen saves of its conversation: a chat started, a user message sent, a reply
    finished (its thinking split off), a message dropped (a failed turn, a regenerated reply), another
    variant shown, new chat parameters. `recorder` is None when history is off (tests that do not ask
    for it): the chat still works, nothing is saved. Every input is an argument; it holds no screen."""

    def __init__(self, recorder: HistoryRecorder | None) -> None:
        self.recorder = recorder

    def start_chat(self, spec: PairingSpec, settings: GenerationSettings) -> None:
        if self.recorder is not None:
            self.recorder.start_chat(chat_identity(spec), chat_params(settings), settings.system_prompt)

    def user_sent(self, content: Any, spec: PairingSpec) -> None:
        if self.recorder is not None:
            text, images = message_parts(content)
            self.recorder.record_user(text, images, chat_identity(spec))

    def drop_last(self) -> None:
        """The last message is gone: a user message whose turn failed, or a reply being regenerated."""
        if self.recorder is not None:
            self.recorder.drop_last()

    def reply_done(self, reply: ReplyView) -> str:
        """The finished reply's answer (what goes back into the conversation); saves it with its
        thinking and its record (the figures, and the drafter switches of a live A/B)."""
        thinking, answer = split_thinking(reply.plain, THINKING_MARKERS)
        if thinking or answer != reply.plain:
            show_thinking(reply, thinking, answer)
        if self.recorder is not None:
            self.recorder.record_reply(
                answer,
                thinking=thinking or None,
                stats=reply.record,
                stopped=reply.stopped,
                origins=reply_origins(reply, answer),
            )
        return answer

    def tool_round(self, reply: ReplyView, outcomes: list[Any]) -> None:
        """The reply called tools and they have their results (app.tui.screens.chat_tools.ToolOutcome):
        it is saved again with them, in its record (core.user.store.TOOL_CALLS / TOOL_RESULTS), so
        the reopened chat sends the model the same calls and results, and exports show them."""
        if self.recorder is None:
            return
        thinking, answer = split_thinking(reply.plain, THINKING_MARKERS)
        record = dict(reply.record or {})
        record[TOOL_CALLS] = [o.call.openai() for o in outcomes]
        record[TOOL_RESULTS] = [
            {"tool_call_id": o.call.id, "name": o.call.name, "content": o.content, "shown": o.shown, "server": o.server}
            for o in outcomes
        ]
        self.recorder.drop_last()
        self.recorder.record_reply(
            answer, thinking=thinking or None, stats=record, stopped=reply.stopped, origins=reply_origins(reply, answer)
        )

    def variant_shown(self, reply: ReplyView, variant: Variant) -> None:
        """Another variant of the last reply is now the reply: it replaces the saved one."""
        if self.recorder is not None:
            self.recorder.drop_last()
            self.recorder.record_reply(
                variant.text,
                thinking=variant.thinking,
                stats=variant.record,
                stopped=variant.stopped,
                origins=reply_origins(reply, variant.text),
            )

    def params_changed(self, settings: GenerationSettings) -> None:
        if self.recorder is not None:
            self.recorder.update_params(chat_params(settings), settings.system_prompt)


def user_texts(history: list[dict[str, Any]]) -> list[str]:
    """The user's messages in a conversation, oldest first (the prompt's Up/Down recall)."""
    return [message_parts(m["content"])[0] for m in history if m["role"] == "user"]


def restored_widgets(chat: Chat) -> list[UserMessage | RestoredReply | AudioStrip | ToolCallView]:
    """A stored chat's messages as the conversation shows them (a user message's images by name, its
    audio clips as in the live chat: name, length and waveform, read from the file; a reply's tool
    calls under it as in the live chat: name, arguments, what happened, the result collapsed)."""
    widgets: list[UserMessage | RestoredReply | AudioStrip | ToolCallView] = []
    for m in chat.messages:
        if m.role == "user":
            text = m.content
            images = [a for a in m.attachments if a.kind == "image"]
            clips = [a.path for a in m.attachments if a.kind == "audio"]
            if images:
                names = ", ".join(Path(a.path).name for a in images)
                text = f"{text}\n[image: {names}]" if text else f"[image: {names}]"
            if clips:
                widgets.append(AudioStrip(paths=clips))
            user = UserMessage(text)
            user.set_class(bool(clips), "-with-images")
            widgets.append(user)
        elif m.role == "assistant":
            widgets.append(
                RestoredReply(m.content, thinking=m.thinking, stats=m.stats, stopped=m.stopped, origins=m.origins)
            )
            widgets += restored_tool_calls(m.stats or {})
    return widgets


def restored_call_drafts(record: dict[str, Any]) -> list[CallDraft]:
    """A saved reply's calls as the live chat showed them while the model wrote them (its record's
    CALL_DRAFTS: in their tokens' colours, decoded or malformed); a reply saved before those were kept
    shows only its malformed calls (TOOL_ERRORS)."""
    saved = [d for d in record.get(CALL_DRAFTS) or () if isinstance(d, dict)]
    if not saved:
        return restored_call_errors(record)
    return [draft for draft in map(CallDraft.restored, saved) if draft is not None]


def restored_call_errors(record: dict[str, Any]) -> list[CallDraft]:
    """A saved reply's calls that could not be decoded (its record's TOOL_ERRORS): what was wrong and the
    model's text of each, as the live chat showed them."""
    errors = [e for e in record.get(TOOL_ERRORS) or () if isinstance(e, dict)]
    return [CallDraft.failed_call(str(e.get("message", "")), str(e.get("raw", ""))) for e in errors]


def restored_tool_calls(record: dict[str, Any]) -> list[ToolCallView]:
    """A saved reply's calls (its record's TOOL_CALLS and TOOL_RESULTS, app.tui.screens.chat_tools) as
    their widgets. The result shows (collapsed) for a call that ran; a denied or stopped one has none."""
    calls = [c for c in record.get(TOOL_CALLS) or () if isinstance(c, dict)]
    results = {r.get("tool_call_id"): r for r in record.get(TOOL_RESULTS) or () if isinstance(r, dict)}
    views = []
    for call in calls:
        fn: dict[str, Any] = call["function"] if isinstance(call.get("function"), dict) else {}
        try:
            arguments = json.loads(fn.get("arguments") or "{}")
        except (ValueError, RecursionError, TypeError):
            arguments = {"(arguments as saved)": fn.get("arguments")}
        result = results.get(call.get("id"), {})
        shown = str(result.get("shown") or "no result was saved")
        content = str(result.get("content", ""))
        ran = shown == "done"
        failed = not ran and content.startswith('{"error"') and not shown.startswith(_NOT_FAILURES)
        args = arguments if isinstance(arguments, dict) else {"value": arguments}
        view = ToolCallView(
            str(fn.get("name") or "?"),
            result.get("server") if isinstance(result.get("server"), str) else None,
            args,
            state=shown,
            failed=failed,
            result=content if ran else None,
        )
        views.append(view)
    return views


_NOT_FAILURES = ("the user denied", "stopped by the user", "no result")
