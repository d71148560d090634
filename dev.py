#!/usr/bin/env python3
"""The README's two set-up commands: `python3 dev.py run` and `python3 dev.py test`.

Needs only Python >= 3.11 with venv and pip. Creates ./.venv on first use, installs gemma-chat
into it (editable, with the test and dev extras for `test`: `test` runs the linters, formatter
check, type checks and import contracts before pytest), and reinstalls when pyproject.toml changes.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PY = BIN / ("python.exe" if os.name == "nt" else "python")


def _ensure_venv(extra: str) -> None:
    if sys.version_info < (3, 11):
        sys.exit(f"gemma-chat needs Python 3.11 or newer; this is {sys.version.split()[0]}")
    if not PY.exists():
        print(f"creating {VENV} ...", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + extra.encode()).hexdigest()
    stamp = VENV / ".gemma-chat-installed"
    installed = stamp.read_text().split() if stamp.exists() else []
    if digest in installed:
        return
    print("installing gemma-chat and its dependencies ...", flush=True)
    subprocess.check_call([str(PY), "-m", "pip", "install", "-q", "--upgrade", "pip"])
    target = f".[{extra}]" if extra else "."
    subprocess.check_call([str(PY), "-m", "pip", "install", "-q", "-e", target], cwd=ROOT)
    stamp.write_text("\n".join(installed + [digest]))


def run(args: list[str]) -> int:
    _ensure_venv("")
    return subprocess.call([str(BIN / "gemma-chat"), *args])


# Static checks that run before the tests; each must pass (configured in pyproject.toml).
CHECKS = [
    ["ruff", "check", "."],
    ["ruff", "format", "--check", "."],
    ["mypy"],  # core/ and app/ ([tool.mypy] files)
    ["lint-imports"],  # the layering contracts ([tool.importlinter])
]


def _workers(args: list[str]) -> list[str]:
    """pytest-xdist's worker options for the suite: one worker per core up to 4 (2 on the 2-core CI machine
    halve the suite's time: the engine tests are single-threaded MLX, the e2e ones mostly wait on their
    child processes); whole modules per worker, so a module's fixtures are built once and its tests run in
    their order. GEMMA_CHAT_TEST_WORKERS=1 runs it in this process; an explicit -n (or -p no:xdist) in `args` wins."""
    if any(a.startswith(("-n", "--numprocesses", "no:xdist")) for a in args):
        return []
    wanted = os.environ.get("GEMMA_CHAT_TEST_WORKERS", "")
    n = int(wanted) if wanted.isdigit() else min(os.cpu_count() or 1, 4)
    return ["-n", str(n), "--dist", "loadfile"] if n > 1 else []


def test(args: list[str]) -> int:
    _ensure_venv("test,dev")
    for check in CHECKS:
        print("$", " ".join(check), flush=True)
        rc = subprocess.call([str(BIN / check[0]), *check[1:]], cwd=ROOT)
        if rc != 0:
            print(f"error: {' '.join(check)} failed; fix it before the tests run", file=sys.stderr)
            return rc
    rc = subprocess.call([str(PY), "-m", "pytest", *_workers(args), *args], cwd=ROOT)
    if rc == 5:  # pytest: no tests collected. Never let that pass as green.
        print("error: pytest collected no tests", file=sys.stderr)
        return 1
    return rc


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in {"run", "test"}:
        print("usage: python3 dev.py run [gemma-chat args...] | python3 dev.py test [pytest args...]")
        return 2
    cmd, rest = sys.argv[1], sys.argv[2:]
    return run(rest) if cmd == "run" else test(rest)


if __name__ == "__main__":
    raise SystemExit(main())
