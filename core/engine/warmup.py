"""The child process that builds a pairing's compiled CPU kernels (see core.engine.kernels).

    python -m core.engine.warmup '<PairingSpec as JSON>' SIGNATURE

It loads the pairing with compilation on and runs core.decode.warmup's steps, so each step builds its
kernels into the private kernel cache. JSON lines go to stdout: before the first step and after each one
`{"fraction": f, "step": i, "steps": n}`, each time a kernel lands in the cache `{"kernels": built so far}`
(a step can build dozens, minutes of C++ on a busy machine: the count keeps the screen's progress moving),
then `{"done": true}` after the marker is written. A lock in the cache keeps two processes from building
the same files at once. The process ends itself when its stdin reaches EOF: the engine that started it
is gone.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from core.engine.kernels import PARENT_ENV
from core.user.kernel_cache import is_prepared, use_private_kernel_cache, write_marker

_said = threading.Lock()  # two threads say things: the steps and the kernel counter


def _die_with_parent() -> None:
    """Linux: be killed with the engine's thread even while stopped (the engine stops this process during its
    replies: core.engine.kernels.KernelPreparer.pause), so no stopped orphan keeps the build lock."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    pr_set_pdeathsig = 1
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    if os.environ.get(PARENT_ENV) not in (None, str(os.getppid())):
        os._exit(0)  # the parent died before the request took effect


def count_kernels(folder: Path) -> int:
    return sum(1 for _ in folder.rglob("*.so"))


def watch_kernels(folder: Path, say: Callable[..., None], every_s: float = 0.5) -> Callable[[], None]:
    """Say `{"kernels": n}` each time the count of kernels built since now changes (a C++ compile ended);
    returns the function that stops watching."""
    base = count_kernels(folder)
    stop = threading.Event()

    def run() -> None:
        last = 0
        while not stop.wait(every_s):
            n = max(0, count_kernels(folder) - base)
            if n != last:
                last = n
                say(kernels=n)

    threading.Thread(target=run, name="kernel-counter", daemon=True).start()
    return stop.set


def _exit_on_eof() -> None:
    try:
        sys.stdin.read()
    except (OSError, ValueError):
        pass
    os._exit(0)


def _say(**msg: object) -> None:
    with _said:
        print(json.dumps(msg), flush=True)


def main(argv: list[str]) -> int:
    _die_with_parent()
    cache = use_private_kernel_cache()
    threading.Thread(target=_exit_on_eof, daemon=True).start()
    spec_fields, sig, also = json.loads(argv[0]), argv[1], argv[2:]  # also: signatures the same kernels serve
    if cache.folder is None:
        _say(error=cache.problem or "no kernel cache")
        return 1
    with open(cache.folder / "prepare.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another gemma-chat preparing: wait, then find its marker
        if not is_prepared(cache, sig):
            stop = watch_kernels(cache.folder, _say)
            try:
                _prepare(spec_fields)
            finally:
                stop()
            write_marker(cache, sig)
        for other in also:
            if not is_prepared(cache, other):
                write_marker(cache, other)
    _say(fraction=1.0)
    _say(done=True)
    return 0


def _prepare(spec_fields: dict) -> None:
    from core.engine.contract import PairingSpec
    from core.engine.local import Engine

    engine = Engine(kernels="first-use")
    engine.load(PairingSpec(**spec_fields), None).result()
    engine.warm_up(lambda done, steps: _say(fraction=done / steps * 0.99, step=done, steps=steps)).result()


if __name__ == "__main__":
    try:
        code = main(sys.argv[1:])
    except Exception as e:  # one line for the parent, which then stays uncompiled
        _say(error=f"{type(e).__name__}: {e}")
        code = 1
    sys.stdout.flush()
    os._exit(code)  # not a normal exit: MLX 0.32 can abort at exit after compiled code ran on a thread
