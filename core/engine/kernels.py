"""Compiled kernels without a first-reply stall: prepare them in a child process while the engine runs eagerly.

On MLX's CPU backend every new `mx.compile`d piece is a C++ compile (about 1 to 3 s each on a small CPU, and
a demo turn needs ~40 of them), so compiling on first use made the first reply on a fresh machine wait
over a minute. Compiled decode is worth having (~1.8x on the demo), so instead:

- a pairing whose kernels are already in the private kernel cache (core.user.kernel_cache; a marker per
  pairing lists them) runs compiled from the start;
- otherwise, in the "background" mode the app and `serve` use, the engine runs with compilation switched
  off (`mx.disable_compile`: the same functions, evaluated op by op, no kernel to build) while a child
  process (`python -m core.engine.warmup`) loads the same pairing and runs the warm-up turns
  (core.engine.warmup.PLAN) that build every kernel a chat needs; it reports each step, which the engine
  forwards as `KernelProgress` events. When it is done the engine switches compilation on before its next
  request: the kernels are then loaded from disk (milliseconds), not built;
- "eager-if-cold" (one-shot `generate`): a cold pairing runs uncompiled, which is quicker than compiling
  for one reply (`kernels_missing` then says so, and generate says how to build them); "build-first"
  (`generate --build-kernels`): a cold pairing's load waits for the same child, so this reply and every
  later one run compiled; "first-use": MLX's own behaviour (benchmarks, tests).

Only the CPU backend compiles through a C++ compiler; on Metal nothing here applies. A pairing too big to load
twice keeps first-use compilation (the child would double the memory).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from core.engine.contract import PairingSpec
from core.events import KernelProgress
from core.user import kernel_cache

log = logging.getLogger(__name__)

MODES = ("background", "eager-if-cold", "build-first", "first-use")
PLAN_VERSION = "2"  # bump when core.engine.warmup.PLAN changes what it covers
PARENT_ENV = "GEMMA_CHAT_KERNELS_PARENT"
PAUSABLE = sys.platform == "linux"  # where the child can ask to die with its parent (prctl PR_SET_PDEATHSIG)
CHILD_MEMORY_SHARE = 0.4  # the child may load a second copy of the pairing only below this share of free RAM


def cpu_jit() -> bool:
    """Whether compiled pieces are built by the C++ compiler here (MLX's CPU backend)."""
    import mlx.core as mx

    return mx.default_device() == mx.cpu


def signature(spec: PairingSpec, target_dir: Path, drafter_dir: Path | None) -> str:
    import mlx.core as mx

    def config(d: Path | None) -> str:
        try:
            return (d / "config.json").read_text() if d is not None else ""
        except OSError:
            return ""

    version = str(getattr(mx, "__version__", ""))
    parts = [version, PLAN_VERSION, config(target_dir), config(drafter_dir), str(spec.dtype)]
    return kernel_cache.pairing_signature(parts)


def free_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


@dataclass
class KernelPreparer:
    """The kernel state of one loaded pairing (engine thread). `compiled()` says how the next request runs."""

    mode: str
    spec: PairingSpec
    signature: str
    on_event: Callable[[Any], None]
    # the signatures these kernels also serve: the target alone (`--no-draft`, the drafter off at load) runs a
    # subset of what its pairing's warm-up builds, so it must not run uncompiled as if its machine were new
    also: tuple[str, ...] = ()
    state: str = "idle"  # "ready" | "preparing" | "eager" (cold, no child) | "failed" | "off" (nothing to build)
    _child: subprocess.Popen | None = None
    _reader: threading.Thread | None = None
    _result: str | None = None  # "done" or the failure, set by the reader
    _counts: dict[str, int] = field(default_factory=dict)  # the child's latest step, steps and kernels
    _paused: bool = False  # the child is stopped while a request runs (`pause`)
    _fraction: float = 0.0
    # warm-up steps still to trace in this process (None: not listed yet); see `trace_next`
    _traces: list[tuple[str, Callable[[], None]]] | None = field(default_factory=list)
    _listed: bool = False  # the warm-up steps were listed for tracing at idle time (`trace_next`)

    @property
    def eager(self) -> bool:
        """Whether requests run uncompiled now: no kernels for this pairing yet (or compilation switched off).
        Rounds then cost differently, so auto block size keeps their costs apart."""
        if self.state in ("preparing", "eager", "failed"):
            return True
        return self.state == "off" and bool(os.environ.get(kernel_cache.DISABLE_ENV))

    @property
    def busy(self) -> bool:
        """Work for the engine's idle time: a child to watch, or compiled functions still to trace."""
        return self.state == "preparing" or self._traces is None or bool(self._traces)

    def trace_next(
        self, plan: Callable[[], list[tuple[str, Callable[[], None]]]], preempted: Callable[[], bool] = bool
    ) -> None:
        """Run the next warm-up step in this process (its kernels are on disk: this only traces the
        compiled functions at that step's shapes, so the reply that first needs them does not wait). A step
        that a request cut short (`preempted()` after it) runs again at the next idle moment."""
        if self._traces is None:
            self._traces = plan()
            self._listed = True
        if not self._traces:
            return
        name, run = self._traces.pop(0)
        try:
            run()
        except Exception as e:  # a step that fails only costs the trace it would have saved
            log.warning("warm-up step %r failed (its kernels are built on first use instead): %s", name, e)
            self._traces, self._listed = [], False  # nor traced ahead
            return
        if preempted():
            self._traces.insert(0, (name, run))

    @property
    def traced_ahead(self) -> bool:
        """Every warm-up step ran at idle time in this process: replies find their sizes traced."""
        return self._listed and not self._traces

    @property
    def missing(self) -> bool:
        """Cold and nothing building them: requests run uncompiled ("eager-if-cold" on a new machine)."""
        return self.state == "eager"

    def start(self, model_bytes: int, stop: Callable[[], bool] = bool) -> None:
        """Decide how requests run (see the modes); "build-first" returns once the child is done, or once
        `stop()` (the engine closing) ended it."""
        cache = kernel_cache.active()
        # no private cache set up (a caller that skipped it), refused, or compilation off by the user's choice
        if cache is None or not cache.compile_allowed or os.environ.get(kernel_cache.DISABLE_ENV) or not cpu_jit():
            self.state = "off"
        elif kernel_cache.is_prepared(cache, self.signature):
            self.state = "ready"
            for sig in self.also:  # a pairing prepared before these markers were written
                if not kernel_cache.is_prepared(cache, sig):
                    kernel_cache.write_marker(cache, sig)
            if self.mode == "background":
                self._traces = None  # built on an earlier run: traced at idle time
        elif self.mode == "first-use":
            self.state = "ready"  # MLX compiles on first use, as it always did
        elif self.mode == "eager-if-cold":
            self.state = "eager"
        else:
            free = free_memory_bytes()
            if free is not None and model_bytes > CHILD_MEMORY_SHARE * free:
                log.info("kernels compile on first use: the pairing is too big to load twice")
                self.state = "ready"
            else:
                self._spawn()
                if self.mode == "build-first":
                    self._wait_child(stop)
        self._apply()

    def _wait_child(self, stop: Callable[[], bool]) -> None:
        """Wait for the child to finish (its progress goes out as events meanwhile), then take its result."""
        reader, child = self._reader, self._child
        if reader is None or child is None:
            return  # it did not start ("failed")
        stopped = False
        while reader.is_alive():
            reader.join(0.1)
            if not stopped and stop() and child.poll() is None:
                child.kill()
                stopped = True
        if stopped:
            self.state = "failed"  # the engine is closing: no reply runs, nothing to warn about
        else:
            self.poll()

    def command(self) -> list[str]:
        """The child that builds the kernels (core.engine.warmup)."""
        return [sys.executable, "-m", "core.engine.warmup", json.dumps(asdict(self.spec)), self.signature, *self.also]

    def _spawn(self) -> None:
        cmd = self.command()
        root = Path(__file__).resolve().parents[2]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
        env[PARENT_ENV] = str(os.getpid())  # the child checks it still has this parent once it asked to die with it
        # stdin stays open: the child ends itself when it reads EOF (this process is gone). Its own session:
        # a terminal's hangup must not kill the C++ compiler mid-write (a truncated .so stays in the cache).
        try:
            self._child = subprocess.Popen(
                cmd,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
                env=env,
                start_new_session=True,
            )
        except OSError as e:
            log.warning("kernel preparation not started: %s", e)
            self.state = "failed"
            return
        self.state = "preparing"
        self._emit(0.0)
        self._reader = threading.Thread(target=self._read, name="kernel-preparer", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        child = self._child
        assert child is not None and child.stdout is not None
        result = "the preparing process ended without finishing"
        for line in child.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            counts = {k: int(msg[k]) for k in ("step", "steps", "kernels") if isinstance(msg.get(k), int)}
            self._counts.update(counts)
            if "fraction" in msg:
                self._fraction = float(msg["fraction"])
            if "fraction" in msg or counts:
                self._emit(self._fraction)
            if msg.get("done"):
                result = "done"
            elif msg.get("error"):
                result = str(msg["error"])
        child.wait()
        self._result = result
        # said at once (the screen's note ends); compilation itself switches on at the next request
        self._emit(1.0, done=True, error=None if result == "done" else result)

    def _emit(self, fraction: float, done: bool = False, error: str | None = None) -> None:
        c = self._counts
        event = KernelProgress(fraction, done, error, c.get("step", 0), c.get("steps", 0), c.get("kernels", 0))
        try:
            self.on_event(event)
        except Exception:
            log.exception("kernel progress callback failed")

    def poll(self) -> None:
        """Before a request: if the child finished, switch compilation on (or stay eager after a failure)."""
        if self.state != "preparing" or self._result is None:
            return
        if self._result == "done":
            self.state = "ready"
            self._traces = None  # traced at idle time, before a reply needs them
        else:
            log.warning("kernel preparation failed: %s", self._result)
            self.state = "failed"
        self._apply()

    def pause(self) -> None:
        """A real request starts: stop the child (and so its next C++ compile) until `resume`, so the request
        has the CPU to itself. Only where the child dies with this process even while stopped (Linux's
        parent-death signal, set by core.engine.warmup): a stopped orphan would hold the build lock."""
        child = self._child
        if self.state != "preparing" or child is None or not PAUSABLE or self._paused:
            return
        if child.poll() is None and _signal(child.pid, signal.SIGSTOP):
            self._paused = True

    def resume(self) -> None:
        """The request is done: the child goes on where it stopped."""
        child = self._child
        if self._paused and child is not None:
            _signal(child.pid, signal.SIGCONT)
        self._paused = False

    def _apply(self) -> None:
        import mlx.core as mx

        if self.state == "off":
            return  # refused cache: MLX_DISABLE_COMPILE stays as set; elsewhere MLX decides
        if self.state == "ready":
            mx.enable_compile()
        else:
            mx.disable_compile()

    def close(self) -> None:
        child = self._child
        self.resume()
        if child is not None and child.poll() is None:
            child.kill()
            try:
                child.wait(timeout=2)
            except subprocess.TimeoutExpired:
                pass
        if self.state == "preparing":
            self.state = "failed"


def _signal(pid: int, sig: int) -> bool:
    try:
        os.kill(pid, sig)
    except OSError:  # it ended meanwhile
        return False
    return True


def preparer(
    mode: str, spec: PairingSpec, target_dir: Path, drafter_dir: Path | None, on_event: Callable[[Any], None] | None
) -> KernelPreparer:
    if mode not in MODES:
        raise ValueError(f"kernels must be one of {MODES}, got {mode!r}")
    also = (signature(spec, target_dir, None),) if drafter_dir is not None else ()
    return KernelPreparer(mode, spec, signature(spec, target_dir, drafter_dir), on_event or (lambda e: None), also)
