"""The engine thread's batch mode (`Engine(parallel=N)`, N > 1: `gemma-chat serve --parallel N`).

When a generation request arrives and the engine serves several streams, the engine thread runs this
loop instead of one turn: between rounds it takes more generation requests from its queue (up to N
rows) and renders each into the batch (`BatchDecoder.join`); each `BatchDecoder.step` then prefills
some of the joining prompts (in chunks while other rows decode) and runs one round for every row
that decodes. A row that stops, or whose client cancelled it, leaves at once: its `TurnDone` goes
out and its future completes; its cache goes to the batch's prefix cache (a later request that
continues its conversation prefills only its new tokens). Requests that are not generation (load,
reset, warm-up) wait until the batch is empty, in arrival order.

Batched rows never touch the single conversation's cache and token log (the app's turn-to-turn reuse).
"""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from core.events import Notice, TurnDone, TurnStats

if TYPE_CHECKING:
    from core.decode.batch import BatchDecoder

log = logging.getLogger(__name__)

GENERATION = ("chat", "complete")

_Request = Any  # core.engine.local._Request (kind, future, args, controls)
_Loaded = Any  # core.engine.local._Loaded


class Engine(Protocol):
    """What the batch loop needs of `core.engine.local.Engine` (which imports this module, not the reverse)."""

    _queue: queue.Queue
    _state: Any

    @property
    def user_errors(self) -> tuple[type[Exception], ...]: ...  # failures whose message is for the user

    def _render(self, st: Any, kind: str, what: Any, tools: Any, settings: Any) -> Any: ...

    def _splitter(self, st: Any, tools: Any, tp: Any, settings: Any, emit: Any) -> Any: ...

    def _turn_done(self, st: Any, result: Any, splitter: Any, emit: Any) -> TurnDone: ...

    def _image_rows(self, st: Any, tp: Any, keep: int) -> Any: ...

    def _finish(self, req: Any, done: TurnDone) -> None: ...

    def _emit(self, req: Any) -> Callable[[object], None]: ...


def serve_batch(engine: Engine, first: _Request, parallel: int) -> list[_Request | None]:
    """Run generation requests batched, starting with `first`, until none is running or queued;
    the non-generation requests taken from the queue meanwhile are returned, in order (None: close)."""
    st = engine._state
    deferred: list[_Request | None] = []
    if st is None:
        engine._finish(first, _error("no model is loaded"))
        return deferred
    batch = _decoder(st)
    admit = [first]
    while True:
        for req in admit:
            _join(engine, st, batch, req)
            _finish_rows(engine, batch)
        admit = []
        _step(engine, batch)
        admit, closing = _take(engine, parallel - len(batch.rows), deferred)
        if closing or (not batch.rows and not admit):
            break
    if closing:
        for row in list(batch.rows):
            row.controls.cancel_event.set()
        _finish_rows(engine, batch)
    return deferred


def _step(engine: Engine, batch: BatchDecoder) -> None:
    """One round; a failure mid-round ends every row with the error (their caches are dropped)."""
    try:
        batch.step()
    except Exception as e:
        log.exception("batched round failed")
        for row in list(batch.rows):
            batch.rows.remove(row)
            engine._finish(row.tag[0], _error(f"{type(e).__name__}: {e}"))
        return
    _finish_rows(engine, batch)


def _decoder(st: _Loaded) -> BatchDecoder:
    from core.decode.batch import BatchDecoder
    from core.decode.detok import Detokenizer

    batch = getattr(st, "batch", None)
    if batch is None:  # kept with the pairing: its controller's costs carry over to the next batch
        batch = BatchDecoder(st.target, st.drafter, lambda: Detokenizer(st.tokenizer), st.decoder.stop_ids)
        st.batch = batch
    return batch


def _take(engine: Engine, free: int, deferred: list[_Request | None]) -> tuple[list[_Request], bool]:
    """Generation requests waiting in the queue, up to `free` (others go to `deferred`); and whether
    the engine is closing."""
    out: list[_Request] = []
    while len(out) < free:
        try:
            req = engine._queue.get_nowait()
        except queue.Empty:
            break
        if req is None:
            deferred.append(None)
            return out, True
        if req.kind in GENERATION and not deferred:
            out.append(req)
        else:  # keep arrival order: everything after a non-generation request waits with it
            deferred.append(req)
    return out, False


def _join(engine: Engine, st: _Loaded, batch: BatchDecoder, req: _Request) -> None:
    """Render one request and add it to the batch (its prefill runs in the steps that follow); a refused
    or failed one finishes at once."""
    from core.decode.spec import Prompt

    t_start = time.perf_counter()
    what, settings, _, tools = req.args
    controls = req.controls
    assert controls is not None  # every generation request has controls
    emit = engine._emit(req)

    if controls.cancelled:
        engine._finish(req, TurnDone(TurnStats(stop_reason="cancelled"), "", ()))
        return
    try:
        settings.validate()
        tp = engine._render(st, req.kind, what, tools, settings)
        for notice in tp.notices:
            emit(Notice(notice))
        embeddings, mask, bidirectional = engine._image_rows(st, tp, 0)
        prompt = Prompt(tp.ids, 0, embeddings, mask, bidirectional, forced=tp.forced)
        splitter = engine._splitter(st, tools, tp, settings, emit)  # tool calls parsed out of the reply
        tag = (req, splitter, emit)
        batch.join(prompt, settings, splitter or emit, controls, prompt_tokens=len(tp.ids), t_start=t_start, tag=tag)
    except Exception as e:
        user = isinstance(e, engine.user_errors)
        if not user:
            log.exception("batched turn failed to start")
        engine._finish(req, _error(str(e) if user else f"{type(e).__name__}: {e}"))


def _finish_rows(engine: Engine, batch: BatchDecoder) -> None:
    for row, result in batch.take_finished():
        req, splitter, emit = row.tag
        _forget_media(engine)
        if row.error is not None:  # its own prefill failed
            engine._finish(req, _error(row.error))
            continue
        engine._finish(req, engine._turn_done(engine._state, result, splitter, emit))


def _forget_media(engine: Engine) -> None:
    """Encoded images of finished rows are not kept (only the live conversation's are)."""
    st = engine._state
    if st is None:
        return
    live = {s.key for s in st.token_log.images}
    for k in list(st.soft_tokens):
        if k not in live:
            del st.soft_tokens[k]


def _error(message: str) -> TurnDone:
    return TurnDone(TurnStats(stop_reason="error"), "", (), error=message or "error")
