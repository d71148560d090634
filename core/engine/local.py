"""The engine: one long-lived thread that owns every model, cache and MLX array.

MLX streams are thread-local, so the models, caches and image tensors are created and used only on
this thread; callers talk to it through a request queue and get `concurrent.futures.Future`s back.
Event callbacks run on the engine thread and must not block. `chat` and `complete` never raise
into the caller: every failure ends as a `TurnDone` with stop_reason "error" and a message. `load`
fails its future with `EngineError`; a failed load leaves no model loaded (the previous one is
freed first, so two large models never sit in memory together).

Across chat turns the target cache is reused: the committed-token log (`core.decode.prompt.TokenLog`)
says which ids the cache holds, a new prompt keeps their longest common prefix and prefills only
the rest; when the sliding-window cache can no longer roll back that far, the turn re-prefills
from scratch (same output, more work).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import gc
import hashlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from core.engine.contract import EngineError, EngineFeatures, PairingInfo, PairingSpec
from core.events import LoadProgress, Notice, PrefillStarted, TurnDone, TurnStats
from core.limits import BLOCK_SIZE_RANGE, MAX_IMAGES_PER_PROMPT, context_error, is_block_size
from core.settings import GenerationSettings

if TYPE_CHECKING:  # imported lazily at run time: `gemma-chat --help` must not import mlx
    import mlx.core as mx

    from core.decode.forced import ForcedPrefix
    from core.decode.prompt import ImageSpan, TokenLog
    from core.decode.spec import Controls, Decoder
    from core.decode.tool_calls import ReplySplitter, ToolMarkers
    from core.engine.kernels import KernelPreparer
    from core.model.audio import AudioEncoder, UnifiedAudioEncoder
    from core.model.audio_input import AudioSpec, PreparedAudio
    from core.model.drafter import Drafter
    from core.model.image import ImageProcessorConfig, PreparedImage
    from core.model.target import Target, TargetCache
    from core.model.unified import UnifiedVisionEncoder
    from core.model.vision import VisionEncoder

log = logging.getLogger(__name__)

# the demo's vision tower is the checkpoint's random one: an image is noise to it
DEMO_IMAGE_NOTICE = (
    "The demo model was not trained on images: its reply will not be about the picture. "
    "A real Gemma 4 pairing describes them."
)


@dataclass
class _Request:
    kind: str  # "load" | "chat" | "complete" | "reset" | "warmup"
    future: concurrent.futures.Future
    args: tuple = ()
    controls: Controls | None = None  # for generation requests only


@dataclass
class _TurnPrompt:
    ids: list[int]  # the whole prompt, each image and audio clip expanded to its soft-token placeholders
    # per image, then per audio clip, each kind in prompt order: the prepared input and its content key
    images: list[tuple[PreparedImage | PreparedAudio, str]]
    spans: list[ImageSpan]  # where each one's soft tokens sit in `ids` (in the order of `images`)
    notices: list[str] = field(default_factory=list)  # for the user, before the turn runs (a clip was cut)
    ends_in_thought: bool = False  # the prompt ends inside an open thought channel (after a tool result)
    forced: ForcedPrefix | None = None  # tool_choice "required" or a name: the reply starts with a call


@dataclass
class _Loaded:
    """Everything that belongs to one loaded pairing (engine thread only)."""

    info: PairingInfo
    target: Target
    drafter: Drafter | None
    vision: VisionEncoder | UnifiedVisionEncoder | None
    tokenizer: Any  # mlx-lm's TokenizerWrapper (untyped)
    decoder: Decoder
    cache: TargetCache
    token_log: TokenLog
    target_dir: Path
    tool_markers: ToolMarkers | None = None  # None: the vocabulary has no tool calls
    tool_stops: frozenset[int] = frozenset()  # stop ids that end a reply in tool calls
    empty_thought: bool = False  # the canonical format's 12B/26B/31B variant (core.decode.chat_format)
    image_config: ImageProcessorConfig | None = None
    longest_token_bytes: int | None = None  # the vocabulary's longest piece in UTF-8 bytes, once needed
    audio: AudioEncoder | UnifiedAudioEncoder | None = None
    audio_spec: AudioSpec | None = None
    # image or audio key -> soft tokens [n, H], for the live conversation
    soft_tokens: dict[Hashable, mx.array] = field(default_factory=dict)
    batch: Any = None  # core.decode.batch.BatchDecoder, made on the first batched request (parallel > 1)
    # auto block size's kept costs: (of compiled rounds, of uncompiled ones); see Engine._keep_costs_apart
    costs_paths: tuple[Path | None, Path | None] = (None, None)


class Engine:
    """Owns ONE long-lived thread; all methods are thread-safe and non-blocking.

    `kernels` says when the CPU backend's compiled kernels are built on a machine that has none for the
    pairing yet (core.engine.kernels): "background" (run uncompiled while a child process builds them: the
    app, serve), "eager-if-cold" (run uncompiled: one-shot commands), "build-first" (the load waits for that
    child: `generate --build-kernels`) or "first-use" (MLX's default)."""

    def __init__(self, kernels: str = "first-use", parallel: int = 1) -> None:
        from core.engine.kernels import MODES

        if kernels not in MODES:
            raise ValueError(f"kernels must be one of {MODES}, got {kernels!r}")
        if parallel < 1:
            raise ValueError(f"parallel must be >= 1, got {parallel}")
        # > 1: generation requests decode together, up to this many at once (core.engine.batching)
        self.parallel = parallel
        self._deferred: list[_Request | None] = []  # taken from the queue by a batch, served after it
        self._kernel_mode = kernels
        self._kernels: KernelPreparer | None = None
        self._warm_cancel = threading.Event()  # set by every request: it cuts short a warm-up step at idle time
        self._queue: queue.Queue[_Request | None] = queue.Queue()
        self._lock = threading.Lock()
        self._pending: list[_Request] = []  # generation requests queued or running
        self._info: PairingInfo | None = None
        self._state: _Loaded | None = None
        self._closed = False
        # the running turn's prompt while it may still be prefilling (the UI polls it; PrefillDone ends it)
        self.prefilling: PrefillStarted | None = None
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="gemma-chat-engine", daemon=True)
        self._thread.start()

    # --- public API ----------------------------------------------------------------------

    @property
    def info(self) -> PairingInfo | None:
        return self._info

    @property
    def features(self) -> EngineFeatures:
        info, st = self._info, self._state
        return EngineFeatures(
            images=info is not None and info.has_vision,
            audio=info is not None and info.has_audio,
            tools=info is not None and st is not None and st.tool_markers is not None,
        )

    def load(
        self, spec: PairingSpec, on_event: Callable[[LoadProgress], None] | None
    ) -> concurrent.futures.Future[PairingInfo]:
        return self._submit("load", (spec, on_event))

    def chat(
        self,
        messages: list[dict],
        settings: GenerationSettings,
        on_event: Callable,
        tools: list[dict] | None = None,
    ) -> concurrent.futures.Future:
        """Render `messages` and generate the reply. `tools`: an OpenAI-style tools list; with tools (or
        tool calls/results in the messages) the prompt is Gemma 4's canonical format, and the reply's
        calls come as ToolCallStarted / ToolCallDelta / ToolCall events and in TurnDone.tool_calls."""
        return self._submit("chat", (list(messages), settings, on_event, tools), settings)

    def complete(
        self, prompt: str | list[int], settings: GenerationSettings, on_event: Callable
    ) -> concurrent.futures.Future:
        """No chat template: a string is fed as BOS + its tokens, a list of ids as-is."""
        return self._submit("complete", (prompt, settings, on_event, None), settings)

    def warm_up(self, on_step: Callable[[int, int], None] | None = None) -> concurrent.futures.Future[None]:
        """Run every warm-up step (core.decode.warmup) now, compiled as the mode says: the job of the process
        that builds a pairing's kernels (core.engine.warmup). `on_step(done, steps)` before the first step
        and after each one."""
        return self._submit("warmup", (on_step,))

    def reset(self) -> concurrent.futures.Future:
        """Forget the cached conversation and the batch's cached prefixes (the next turn prefills everything)."""
        return self._submit("reset", ())

    def cancel(self) -> None:
        """Stop the running turn (within one round) and every queued one."""
        with self._lock:
            for c in self._live_controls():
                c.cancel_event.set()

    def cancel_turn(self, future: concurrent.futures.Future) -> None:
        """Stop the one turn (queued or running) whose `chat`/`complete` returned `future`."""
        with self._lock:
            for r in self._pending:
                if r.future is future and r.controls is not None:
                    r.controls.cancel_event.set()

    def set_block_size(self, k: int | str) -> None:
        """Block size (core.limits: an int K or "auto") for the running and queued turns, from their next round."""
        if not is_block_size(k):
            raise ValueError(f"block size must be {BLOCK_SIZE_RANGE} or 'auto'")
        with self._lock:
            for c in self._live_controls():
                c.block_size = k

    def set_drafter_enabled(self, on: bool) -> None:
        """Drafter on/off for the running and queued turns, from their next round."""
        with self._lock:
            for c in self._live_controls():
                c.drafter_enabled = bool(on)

    def close(self) -> None:
        """Cancel everything, free the models and stop serving (waits until the thread is done)."""
        if self._closed:
            return
        self._closed = True
        self.cancel()
        self._warm_cancel.set()  # a warm-up step at idle time ends at its next round, not after its whole run
        self._queue.put(None)
        self._stopped.wait(timeout=30)

    # --- plumbing ------------------------------------------------------------------------

    def _live_controls(self) -> list[Controls]:
        """The controls of the turns queued or running (call with the lock held)."""
        return [r.controls for r in self._pending if r.controls is not None]

    def _submit(self, kind: str, args: tuple, settings: GenerationSettings | None = None) -> concurrent.futures.Future:
        from core.decode.spec import Controls

        future: concurrent.futures.Future = concurrent.futures.Future()
        if self._closed:
            future.set_exception(EngineError("the engine is closed"))
            return future
        controls = None
        if settings is not None:
            settings = dataclasses.replace(settings)  # the caller may change its copy meanwhile
            args = (args[0], settings, *args[2:])
            controls = Controls(settings.block_size, settings.drafter_enabled)
        req = _Request(kind, future, args, controls)
        if kind != "warmup":
            self._warm_cancel.set()  # a warm-up step at idle time ends at its next round: this goes first
        if controls is not None:
            with self._lock:
                self._pending.append(req)
        self._queue.put(req)
        return future

    def _next_request(self) -> _Request | None:
        """The next request. While the kernels are being prepared, or are ready but not yet traced at every
        shape, the wait is spent on that, one short warm-up step at a time (core.engine.kernels)."""
        while True:
            if self._deferred:
                return self._deferred.pop(0)
            kernels = self._kernels
            if kernels is None or not kernels.busy:
                return self._queue.get()
            try:
                return self._queue.get(timeout=0.25 if kernels.state == "preparing" else 0.01)
            except queue.Empty:
                kernels.poll()
                self._warm_cancel.clear()
                if self._state is not None and kernels.state == "ready" and self._queue.empty():
                    kernels.trace_next(lambda: self._warmup_steps(self._state), self._warm_cancel.is_set)

    def _warmup_steps(self, st: _Loaded | None) -> list[tuple[str, Callable[[], None]]]:
        from core.decode.warmup import steps

        if st is None:
            return []
        return steps(st.target, st.drafter, st.tokenizer, st.vision, st.target_dir, self._warm_cancel)

    def _warm_all(self, on_step: Callable[[int, int], None] | None) -> None:
        self._warm_cancel.clear()  # this request is the warm-up itself
        plan = self._warmup_steps(self._state)
        say = on_step or (lambda done, steps: None)
        say(0, len(plan))
        for i, (_name, run) in enumerate(plan):
            run()
            say(i + 1, len(plan))

    def _serve(self) -> None:
        while True:
            req = self._next_request()
            if req is None:
                break
            kernels = self._kernels
            if kernels is not None:
                kernels.poll()  # the kernels got ready meanwhile: this request runs compiled
                self._keep_costs_apart()
                if req.kind in ("chat", "complete"):
                    kernels.pause()  # a reply preempts the kernel-building child: the CPU is the reply's
            try:
                if req.kind == "load":
                    req.future.set_result(self._load(*req.args))
                elif req.kind in ("chat", "complete") and self.parallel > 1:
                    from core.engine.batching import serve_batch

                    self._deferred[:0] = serve_batch(self, req, self.parallel)
                elif req.kind in ("chat", "complete"):
                    req.future.set_result(self._generate(req))
                elif req.kind == "warmup":
                    self._warm_all(*req.args)
                    req.future.set_result(None)
                elif req.kind == "reset":
                    if self._state is not None:
                        self._reset_conversation(self._state)
                        if self._state.batch is not None:  # the batch's finished rows' caches too
                            self._state.batch.prefix.clear()
                    req.future.set_result(None)
            except BaseException as e:  # a future must always complete
                if not req.future.done():
                    req.future.set_exception(e if isinstance(e, Exception) else EngineError(str(e)))
            finally:
                if kernels is not None:
                    kernels.resume()
                if req.controls is not None:
                    with self._lock:
                        if req in self._pending:
                            self._pending.remove(req)
        # closing: fail what is still queued, free the models on their own thread
        while not self._queue.empty():
            req = self._queue.get_nowait()
            if req is not None and not req.future.done():
                req.future.set_exception(EngineError("the engine is closed"))
        self._state = self._info = None
        if self._kernels is not None:
            self._kernels.close()
        self._stopped.set()
        # Park instead of returning: with mlx 0.32 on Linux a thread that ran mx.compile'd code
        # (mlx-lm's geglu) and then exits can abort the process at interpreter exit
        # ("terminate called without an active exception"). A parked daemon thread cannot.
        threading.Event().wait()

    @property
    def kernels_missing(self) -> bool:
        """The loaded pairing runs uncompiled because this machine has no kernels for it and nothing is building
        them ("eager-if-cold" on a new machine): `generate` says how to build them."""
        k = self._kernels
        return k is not None and k.missing

    @property
    def user_errors(self) -> tuple[type[Exception], ...]:
        """Failures of a turn whose message is for the user (core.engine.batching reads it)."""
        from core.decode.spec import TurnError

        return (_UserError, TurnError, ValueError)

    def _emit(self, req: _Request) -> Callable[[object], None]:
        """A request's event listener, guarded (a listener's bug must not end the turn)."""
        on_event = req.args[2]
        return lambda ev: _safe_call(on_event, ev)

    def _finish(self, req: _Request, done: TurnDone) -> None:
        """End a batched request (core.engine.batching): its TurnDone to its listener, its future, its controls."""
        _safe_call(req.args[2], done)
        if not req.future.done():
            req.future.set_result(done)
        with self._lock:
            if req in self._pending:
                self._pending.remove(req)

    # --- load ----------------------------------------------------------------------------

    def _load(self, spec: PairingSpec, on_event: Callable[[LoadProgress], None] | None) -> PairingInfo:
        import mlx.core as mx

        from core.decode import prompt as prompt_mod
        from core.decode.detok import Detokenizer
        from core.decode.spec import Decoder
        from core.engine.loading import load_pairing
        from core.model.drafter import QUERY_POSITIONS, SLIDING_KEYS
        from core.model.loader import CheckpointError

        def progress(stage: str, fraction: float, message: str = "") -> None:
            _safe_call(on_event, LoadProgress(stage, fraction, message))

        # a bad convention is refused before the loaded pairing is let go
        if spec.drafter_position not in QUERY_POSITIONS:
            raise EngineError(f"drafter query_position must be one of {QUERY_POSITIONS}, got {spec.drafter_position!r}")
        if spec.drafter_window not in SLIDING_KEYS:
            raise EngineError(f"drafter sliding_keys must be one of {SLIDING_KEYS}, got {spec.drafter_window!r}")
        self._state = self._info = None  # free the previous pairing before loading the next
        if self._kernels is not None:
            self._kernels.close()
            self._kernels = None
        _thaw_heap()
        mx.clear_cache()
        try:
            loaded = load_pairing(spec, progress)
            audio, audio_spec = self._load_audio(loaded.target_dir, spec, progress)
        except CheckpointError as e:
            raise EngineError(str(e)) from e
        except (OSError, ValueError, KeyError) as e:
            raise EngineError(f"cannot load {spec.name}: {e}") from e
        if loaded.vision_error:
            log.warning("vision tower not loaded: %s", loaded.vision_error)
        target, drafter, vision, tokenizer = loaded.target, loaded.drafter, loaded.vision, loaded.tokenizer
        target_dir, drafter_dir, stops = loaded.target_dir, loaded.drafter_dir, loaded.stop_ids

        info = PairingInfo(
            name=spec.name,
            target_path=str(target_dir),
            drafter_path=str(drafter_dir) if drafter_dir else None,
            has_vision=vision is not None,
            demo=spec.demo,
            context_length=target.context_length,
            vocab_size=target.vocab_size,
            sliding_window=target.window,
            dtype=_describe_dtype(target),
            supports_thinking=prompt_mod.supports_thinking(tokenizer, target_dir),
            has_audio=audio is not None,
        )
        self._state = _Loaded(
            info=info,
            target=target,
            drafter=drafter,
            vision=vision,
            tokenizer=tokenizer,
            decoder=Decoder(
                target,
                drafter,
                Detokenizer(tokenizer),
                stops,
                # set once the kernels' state says whether rounds run compiled (`_keep_costs_apart`)
                costs_path=None,
            ),
            cache=target.make_cache(),
            token_log=prompt_mod.TokenLog(),
            target_dir=target_dir,
            **_tool_support(tokenizer, stops),
            audio=audio,
            audio_spec=audio_spec,
            costs_paths=(
                block_costs_path(target_dir, drafter_dir, spec),
                block_costs_path(target_dir, drafter_dir, spec, eager=True),
            ),
        )
        self._info = info
        self._prepare_kernels(spec, target_dir, drafter_dir, on_event)
        self._keep_costs_apart()
        _freeze_heap()
        progress("ready", 1.0, spec.name)
        return info

    @staticmethod
    def _load_audio(target_dir: Path, spec: PairingSpec, progress: Callable) -> tuple[Any, Any]:
        """(audio encoder, its input spec), or (None, None) for a checkpoint without audio. A checkpoint
        whose audio part cannot be loaded still chats (text and images), as without a vision tower."""
        import mlx.core as mx

        from core.model.audio_input import AudioSpec
        from core.model.encoders import load_audio

        try:
            audio_spec = AudioSpec.from_model_dir(target_dir)
            if audio_spec is None:
                return None, None
            progress("audio", 0.0)
            audio = load_audio(target_dir, getattr(mx, spec.dtype) if spec.dtype else None)
        except Exception as e:
            log.warning("audio encoder not loaded: %s", e)
            progress("audio", 1.0, f"no audio: {e}")
            return None, None
        progress("audio", 1.0)
        return (audio, audio_spec) if audio is not None else (None, None)

    def _prepare_kernels(
        self, spec: PairingSpec, target_dir: Path, drafter_dir: Path | None, on_event: Callable[[Any], None] | None
    ) -> None:
        from core.engine.kernels import preparer
        from core.model import memory

        st = self._state
        assert st is not None
        self._kernels = preparer(self._kernel_mode, spec, target_dir, drafter_dir, on_event)
        self._kernels.start(memory.model_bytes(getattr(st.target, "model", None), st.drafter), lambda: self._closed)

    def _keep_costs_apart(self) -> None:
        """Point auto block size at the block costs of the way rounds run now, compiled or not."""
        if self._state is not None:
            eager = self._kernels is not None and self._kernels.eager
            self._state.decoder.use_costs(self._state.costs_paths[eager])
            self._state.decoder.traced_ahead = self._kernels is not None and self._kernels.traced_ahead

    def _reset_conversation(self, st: _Loaded, keep_images: bool = False) -> None:
        """Empty cache and log. `keep_images` keeps the encoded images: a re-prefill of the same
        conversation needs them again (they are dropped after the turn if no longer used)."""
        st.cache = st.target.make_cache()
        st.token_log.clear()
        if not keep_images:
            st.soft_tokens.clear()

    # --- generation ------------------------------------------------------------------------

    def _generate(self, req: _Request) -> TurnDone:
        t_start = time.perf_counter()
        what, settings, on_event, tools = req.args
        emit = lambda e: _safe_call(on_event, e)  # noqa: E731
        st = self._state
        try:
            if st is None:
                raise _UserError("no model is loaded")
            settings.validate()
            assert req.controls is not None  # every generation request has controls (_submit)
            if req.controls.cancelled:
                done = TurnDone(TurnStats(stop_reason="cancelled"), "", ())
            else:
                done = self._turn(st, req, what, tools, settings, emit, t_start)
        except Exception as e:
            from core.decode.spec import TurnError

            user = isinstance(e, (_UserError, TurnError, ValueError))
            if not user:
                log.exception("turn failed")
            if st is not None and not user:
                self._reset_conversation(st)  # cache state unknown after a failure mid-forward
            msg = str(e) if user else f"{type(e).__name__}: {e}"
            done = TurnDone(TurnStats(stop_reason="error"), "", (), error=msg or type(e).__name__)
        emit(done)
        return done

    def _turn(
        self,
        st: _Loaded,
        req: _Request,
        what: list[dict] | str | list[int],
        tools: list[dict] | None,
        settings: GenerationSettings,
        emit: Callable[[Any], None],
        t_start: float,
    ) -> TurnDone:
        from core.decode.spec import Prompt, TurnError

        tp = self._render(st, req.kind, what, tools, settings)
        for notice in tp.notices:
            emit(Notice(notice))
        keep = self._reuse_cache(st, tp)
        suffix = tp.ids[keep:]
        embeddings, mask, bidirectional = self._image_rows(st, tp, keep)
        prompt = Prompt(
            suffix, keep, embeddings=embeddings, embedding_mask=mask, bidirectional=bidirectional, forced=tp.forced
        )
        splitter = self._splitter(st, tools, tp, settings, emit)
        controls = req.controls
        done = (lambda: controls.prefilled) if controls is not None else None
        self.prefilling = PrefillStarted(len(tp.ids), len(suffix), time.monotonic(), done=done)
        try:
            result = st.decoder.run(
                st.cache, prompt, settings, splitter or emit, req.controls, prompt_tokens=len(tp.ids), t_start=t_start
            )
        except TurnError:
            raise  # refused before touching the cache
        except BaseException:
            self._reset_conversation(st)  # a failure mid-forward leaves the cache in an unknown state
            raise
        finally:
            self.prefilling = None
        st.token_log.extend(
            result.committed, [s for s in tp.spans if s.end <= len(st.token_log) + len(result.committed)]
        )
        live = {s.key for s in st.token_log.images}
        for k in list(st.soft_tokens):
            if k not in live:
                del st.soft_tokens[k]
        return self._turn_done(st, result, splitter, emit)

    def _splitter(
        self, st: _Loaded, tools: list[dict] | None, tp: _TurnPrompt, settings: GenerationSettings, emit: Callable
    ) -> ReplySplitter | None:
        """With tools declared, the reply's calls are parsed out of its stream (core.decode.tool_calls)."""
        if not tools or st.tool_markers is None:
            return None
        from core.decode.tool_calls import ReplySplitter, ToolCallParser

        parser = ToolCallParser(st.tool_markers, starts_in_thought=tp.ends_in_thought)
        return ReplySplitter(parser, emit, st.decoder.stop_ids, settings.max_tokens, settings.ignore_eos)

    def _turn_done(self, st: _Loaded, result: Any, splitter: ReplySplitter | None, emit: Callable) -> TurnDone:
        stats = result.stats
        stats.tokens = len(result.token_ids)
        if stats.stop_reason == "eos" and result.token_ids and result.token_ids[-1] in st.tool_stops:
            stats.stop_reason = "tool_calls"  # the model ended its turn on <|tool_response>: it wants results
        if splitter is None:
            return TurnDone(stats, result.text, tuple(result.token_ids))
        for e in splitter.finish(result.text):
            emit(e)
        parser = splitter.parser
        return TurnDone(
            stats,
            parser.content,
            tuple(result.token_ids),
            tool_calls=tuple(parser.calls),
            tool_errors=tuple(parser.errors),
        )

    def _render(
        self,
        st: _Loaded,
        kind: str,
        what: list[dict] | str | list[int],
        tools: list[dict] | None,
        settings: GenerationSettings,
    ) -> _TurnPrompt:
        """The turn's prompt ids (images and audio clips expanded to their soft-token spans), checked
        against the context before any image or clip is encoded or the cache is touched."""
        from core.decode import prompt as prompt_mod
        from core.decode.spec import TurnError

        images: list[tuple[PreparedImage | PreparedAudio, str]] = []
        spans: list[tuple[int, int]] = []
        notices: list[str] = []
        ends_in_thought = False
        if kind == "complete":
            if isinstance(what, str):
                _check_text_size(st, [what])
                bos = getattr(st.tokenizer, "bos_token_id", None)
                ids = ([bos] if bos is not None else []) + prompt_mod.encode_rendered(st.tokenizer, what)
            else:
                ids = [int(i) for i in cast(list[int], what)]
        else:
            assert isinstance(what, list)
            messages: list[dict] = [m for m in what if isinstance(m, dict)]
            if settings.system_prompt and not (messages and messages[0].get("role") == "system"):
                messages = [{"role": "system", "content": settings.system_prompt}] + messages
            ids, spans, images, notices, ends_in_thought = self._expand_media(st, messages, tools, settings)
        if not ids:
            raise TurnError("empty prompt: nothing to generate from")
        if too_long := context_error(len(ids), st.target.context_length):
            raise TurnError(too_long)
        image_spans = [prompt_mod.ImageSpan(a, b, key) for (a, b), (_, key) in zip(spans, images)]
        forced = _forced_start(st, tools, settings) if kind == "chat" else None
        return _TurnPrompt(ids, images, image_spans, notices, ends_in_thought, forced)

    def _expand_media(
        self, st: _Loaded, messages: list[dict], tools: list[dict] | None, settings: GenerationSettings
    ) -> tuple:
        """(prompt ids with every image and audio placeholder expanded, the soft-token spans, per span its
        (prepared input, key), notices, whether it ends in an open thought): images first, then audio
        clips, each kind in prompt order. With tools, the canonical format renders (encode_chat).
        What a prompt costs is checked before it is paid: the text's bytes against the context (tokenizing
        50 MB takes minutes), the images' soft tokens read from their headers, and only then are their
        pixel buffers made (each one its whole budget's size)."""
        from core.decode import prompt as prompt_mod

        if tools and st.tool_markers is None:
            raise _UserError("this model's vocabulary has no tool-call tokens: it cannot call tools")
        _check_text_size(st, _message_texts(messages))
        chat = prompt_mod.encode_chat(
            st.tokenizer, messages, tools=tools, thinking=settings.thinking, empty_thought=st.empty_thought
        )
        clips = self._prepare_audio(st, chat.audio)  # refused first: it needs no decoding to know
        counts = self._image_token_counts(st, chat.images, settings.image_budget)
        # each placeholder becomes boi/boa + n soft tokens + eoi/eoa
        media = sum(n + 1 for n in counts) + sum(c.num_soft_tokens + 1 for c, _ in clips)
        if too_long := context_error(len(chat.ids) + media, st.target.context_length):
            raise _UserError(too_long)
        images = self._prepare_images(st, chat.images, settings.image_budget)
        ids = chat.ids
        kinds: list = []
        if images:
            kinds.append((prompt_mod.image_token_ids(st.target_dir), [im.num_soft_tokens for im, _ in images]))
        if clips:
            kinds.append((prompt_mod.audio_token_ids(st.target_dir), [c.num_soft_tokens for c, _ in clips]))
        spans: list[tuple[int, int]] = []
        if kinds:
            ids, found = prompt_mod.expand_media(ids, kinds)
            spans = [s for kind_spans in found for s in kind_spans]
        notices = [c.notice for c, _ in clips if c.notice]
        if images and st.info.demo:  # its vision tower was never trained (scripts/train_demo.py)
            notices.insert(0, DEMO_IMAGE_NOTICE)
        return ids, spans, [*images, *clips], notices, chat.ends_in_thought

    def _reuse_cache(self, st: _Loaded, tp: _TurnPrompt) -> int:
        """Keep the longest prefix of the cached conversation that the new prompt shares (the cache and
        the token log are trimmed to it); 0 when nothing can be kept."""
        keep = st.token_log.plan(tp.ids, tp.spans).keep
        if keep > st.cache.offset or not st.cache.can_trim_to(keep):
            keep = 0
        if keep == 0 and st.cache.offset:
            self._reset_conversation(st, keep_images=True)
        else:
            st.cache.trim_to(keep)
        st.token_log.truncate(keep)
        return keep

    def _image_rows(
        self, st: _Loaded, tp: _TurnPrompt, keep: int
    ) -> tuple[mx.array | None, mx.array | None, list[tuple[int, int]]]:
        """For the prompt past `keep`: the soft-token rows of its images and audio clips [n, H], which rows
        they fill [n], and each image's span (its tokens attend to each other both ways where the model says
        so; audio tokens attend causally, as in transformers). Each is encoded once while the conversation
        holds it."""
        import mlx.core as mx

        new_images = [(s, im) for s, (im, _) in zip(tp.spans, tp.images) if s.start >= keep]
        if not new_images:
            return None, None, []
        n = len(tp.ids) - keep
        rows = mx.zeros((n, st.target.hidden_size), st.target.dtype)
        flags = [False] * n
        bidirectional = []
        for span, im in new_images:
            is_audio = isinstance(span.key, str) and span.key.startswith(AUDIO_KEY)
            soft = st.soft_tokens.get(span.key)
            if soft is None:
                soft = self._encode(st, im, is_audio)
                if soft.shape[0] != span.end - span.start:  # transformers refuses a mismatch too
                    raise RuntimeError(f"{soft.shape[0]} soft tokens for {span.end - span.start} placeholders")
                st.soft_tokens[span.key] = soft
            rows[span.start - keep : span.end - keep] = soft.astype(rows.dtype)
            for i in range(span.start - keep, span.end - keep):
                flags[i] = True
            if not is_audio:
                bidirectional.append((span.start, span.end))
        return rows, mx.array(flags), bidirectional

    @staticmethod
    def _encode(st: _Loaded, item: Any, is_audio: bool) -> mx.array:
        """Soft tokens of one prepared image or audio clip."""
        if is_audio:
            assert st.audio is not None  # _prepare_audio refuses audio without an encoder
            return st.audio.encode_clip(item)
        assert st.vision is not None  # _prepare_images refuses images without a tower
        return st.vision.encode_image(item)

    def _prepare_audio(self, st: _Loaded, items: list[dict]) -> list[tuple[PreparedAudio, str]]:
        """(PreparedAudio, key) per audio item in prompt order; refused at once without an audio encoder."""
        if not items:
            return []
        if st.audio is None or st.audio_spec is None:
            raise _UserError(no_audio_message(st.info.name))
        from core.model.audio_input import audio_source, prepare_audio

        out = []
        for item in items:
            clip = prepare_audio(audio_source(item), st.audio_spec)
            out.append((clip, AUDIO_KEY + clip.key))
        return out

    def _image_config(self, st: _Loaded, budget: int | None) -> ImageProcessorConfig:
        from core.model.image import ImageProcessorConfig

        if st.image_config is None:
            st.image_config = ImageProcessorConfig.from_model_dir(st.target_dir)
        return st.image_config.with_max_soft_tokens(budget)  # the user's budget, else the checkpoint's

    def _image_token_counts(self, st: _Loaded, items: list[dict], budget: int | None) -> list[int]:
        """Soft tokens per image item, from the image headers alone (no pixel is decoded)."""
        from core.model.image import image_size, soft_token_count

        if not items:
            return []
        if st.vision is None:
            raise _UserError("this model does not take images (no vision tower loaded)")
        if len(items) > MAX_IMAGES_PER_PROMPT:
            raise _UserError(f"the prompt has {len(items)} images; at most {MAX_IMAGES_PER_PROMPT} are taken")
        config = self._image_config(st, budget)
        p, k = config.patch_size, config.pooling_kernel_size
        sizes = [image_size(_image_source(item)) for item in items]
        return [soft_token_count(h, w, config.max_soft_tokens, p, k) for h, w in sizes]

    def _prepare_images(
        self, st: _Loaded, items: list[dict], budget: int | None = None
    ) -> list[tuple[PreparedImage, str]]:
        """(PreparedImage, content key) for each image item, in prompt order."""
        if not items:
            return []
        if st.vision is None:
            raise _UserError("this model does not take images (no vision tower loaded)")
        from core.model.image import preprocess_image

        config = self._image_config(st, budget)
        out = []
        for item in items:
            im = preprocess_image(_image_source(item), config)
            key = hashlib.sha256(im.pixel_values[: im.num_patches].tobytes()).hexdigest()
            out.append((im, key))
        return out


def _image_source(item: dict) -> Any:
    source = item.get("path") or item.get("image") or item.get("url")
    if source is None:
        raise _UserError("an image item needs a 'path'")
    return source


def _message_texts(messages: list[dict]) -> list[str]:
    texts = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, str):
            texts.append(content)
        for item in content if isinstance(content, list) else ():
            if isinstance(item, dict) and isinstance(item.get("text"), str):
                texts.append(item["text"])
    return texts


def _check_text_size(st: _Loaded, texts: list[str]) -> None:
    """Refuse text that cannot fit the context whatever it tokenizes to: no token spells more bytes than
    the vocabulary's longest piece, so bytes / that is a lower bound on its tokens."""
    size = sum(len(t.encode("utf-8", "surrogatepass")) for t in texts)
    if st.longest_token_bytes is None:
        pieces = st.tokenizer.get_vocab()
        st.longest_token_bytes = max((len(p.encode("utf-8", "surrogatepass")) for p in pieces), default=1) or 1
    at_least = size // st.longest_token_bytes
    if at_least >= st.target.context_length:
        raise _UserError(
            f"the prompt's text is {size:,} bytes, at least {at_least:,} tokens; "
            f"the model's context is {st.target.context_length:,}: shorten the conversation"
        )


def _tool_support(tokenizer: Any, stops: set[int]) -> dict[str, Any]:
    """_Loaded's tool fields: the call markers' ids, which stops mean "tool calls", the format's variant."""
    from core.decode import prompt as prompt_mod

    return {
        "tool_markers": prompt_mod.tool_markers(tokenizer),
        "tool_stops": frozenset(prompt_mod.tool_stop_ids(tokenizer) & stops),
        "empty_thought": prompt_mod.empty_thought_prompt(tokenizer),
    }


def _forced_start(st: _Loaded, tools: list[dict] | None, settings: GenerationSettings) -> ForcedPrefix | None:
    """settings.tool_choice as the reply's forced start (core.decode.forced); None: the model decides."""
    from core.decode import forced, prompt

    try:
        names = forced.tool_choice_names(tools, settings.tool_choice)
    except ValueError as e:
        raise _UserError(str(e)) from None
    if not names or st.tool_markers is None:
        return None
    return forced.forced_prefix(st.tool_markers.call_start, names, lambda t: prompt.encode_rendered(st.tokenizer, t))


class _UserError(Exception):
    pass


AUDIO_KEY = "audio:"  # prefix of an audio clip's key in the token log and the soft-token cache


def no_audio_message(name: str) -> str:
    """Why a pairing refuses audio (before anything is decoded or run)."""
    return f"{name} does not take audio: Gemma 4 E2B, E4B and 12B do (26B-A4B and 31B do not)"


def _safe_call(callback: Callable[[Any], None] | None, event: object) -> None:
    if callback is None:
        return
    try:
        callback(event)
    except Exception:  # a listener's bug must not kill the turn or the engine
        log.exception("event callback failed")


def block_costs_path(target_dir: Path, drafter_dir: Path | None, spec: PairingSpec, eager: bool = False) -> Path | None:
    """Where auto block size keeps this pairing's block costs on this machine between sessions (the
    cache dir: losing it costs one cold first reply); `eager`: of rounds run uncompiled (see
    Decoder.use_costs), apart from compiled ones."""
    if drafter_dir is None:
        return None
    import platform

    import mlx.core as mx

    from core import blas
    from core.user import paths

    parts = [str(target_dir.resolve()), str(drafter_dir.resolve()), str(spec.dtype), str(mx.default_device())]
    choice = blas.active()
    if choice is not None and choice.fast:  # a verify's cost differs in kind between the two BLAS
        parts.append("openblas")
    if eager:
        parts.append("uncompiled")
    key = hashlib.sha256("\n".join([*parts, platform.machine()]).encode()).hexdigest()[:16]
    return paths.cache_dir() / "autoblock" / f"{key}.json"


def _describe_dtype(target: Target) -> str:
    from core.engine.loading import dtype_name

    q = target.config.get("quantization") or {}
    name = dtype_name(target.dtype)
    if isinstance(q, dict) and q.get("bits"):
        return f"{q['bits']}-bit ({name})"
    return name


# -- the cyclic garbage collector ----------------------------------------------------------------------
# Once a pairing is loaded the process holds ~150k long-lived objects (mlx-lm, transformers' tokenizer,
# Textual's DOM in the app). Python's full collections rescan all of them, holding the GIL for up to
# ~130 ms on a small CPU, which stalls decoding mid-reply. Freezing them after the load leaves later
# collections only the young objects. Thawed and collected before the next load, so a replaced
# pairing's cycles are still reclaimed.
def _freeze_heap() -> None:
    gc.collect()
    gc.freeze()


def _thaw_heap() -> None:
    gc.unfreeze()
    gc.collect()


if TYPE_CHECKING:
    from core.engine.contract import ChatEngine

    _: type[ChatEngine] = Engine  # mypy: the real engine keeps the contract
