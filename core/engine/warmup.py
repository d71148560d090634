"""The child process that builds a pairing's compiled CPU kernels (see core.engine.kernels).

    python -m core.engine.warmup '<PairingSpec as JSON>' SIGNATURE

It loads the pairing with compilation on and runs core.decode.warmup's steps, so each step builds its
kernels into the private kernel cache. One JSON line per finished step goes to stdout (`{"fraction": f}`),
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

from core.user.kernel_cache import is_prepared, use_private_kernel_cache, write_marker


def _exit_on_eof() -> None:
    try:
        sys.stdin.read()
    except (OSError, ValueError):
        pass
    os._exit(0)


def _say(**msg: object) -> None:
    print(json.dumps(msg), flush=True)


def main(argv: list[str]) -> int:
    cache = use_private_kernel_cache()
    threading.Thread(target=_exit_on_eof, daemon=True).start()
    spec_fields, sig = json.loads(argv[0]), argv[1]
    if cache.folder is None:
        _say(error=cache.problem or "no kernel cache")
        return 1
    with open(cache.folder / "prepare.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another gemma-chat preparing: wait, then find its marker
        if not is_prepared(cache, sig):
            _prepare(spec_fields)
            write_marker(cache, sig)
    _say(fraction=1.0)
    _say(done=True)
    return 0


def _prepare(spec_fields: dict) -> None:
    from core.engine.contract import PairingSpec
    from core.engine.local import Engine

    engine = Engine(kernels="first-use")
    engine.load(PairingSpec(**spec_fields), None).result()
    engine.warm_up(lambda fraction: _say(fraction=fraction * 0.99)).result()


if __name__ == "__main__":
    try:
        code = main(sys.argv[1:])
    except Exception as e:  # one line for the parent, which then stays uncompiled
        _say(error=f"{type(e).__name__}: {e}")
        code = 1
    sys.stdout.flush()
    os._exit(code)  # not a normal exit: MLX 0.32 can abort at exit after compiled code ran on a thread
