"""The offline demo pairing: a tiny random-weight e-style target and its drafter, built once.

    ensure_demo_pairing() -> (target_dir, drafter_dir)

Lives in `<cache root>/demo/<version>/`, the cache root being `$GEMMA_CHAT_CACHE_DIR` or
platformdirs' user cache dir for "gemma-chat". The version hashes the factory version, the build
arguments and the packaged tokenizer/template, so a changed factory builds a fresh pairing (and
the stale one is removed). A build goes into a `.building-*` directory that is renamed into place
only when complete, so a killed build never leaves a half checkpoint behind; leftovers of dead
builders are swept on the next call.

It is the HF layout (google originals: `model.language_model.*`, `chat_template.jinja`) in
float32: the layout a download from the hub gives, and the dtype in which drafted and plain greedy
output are exactly equal. Every directory carries `gemma_chat_demo.json` with the label
"demo: tiny random weights", so the UI can say that the babble is expected.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

DEMO_LABEL = "demo: tiny random weights"
DEMO_NAME = "demo (random weights)"  # the pairing name the UI and CLI show
DEMO_MARKER = "gemma_chat_demo.json"
DEMO_BUILD: dict[str, Any] = {"variant": "e-style", "layout": "hf", "dtype": "float32", "seed": 0}
_BUILDING = ".building-"
_STALE_BUILD_S = 3600.0


def cache_root() -> Path:
    """gemma-chat's cache directory (`$GEMMA_CHAT_CACHE_DIR` wins), as `core.paths` has it."""
    from core import paths

    return paths.cache_dir()


def demo_version() -> str:
    from core import factory

    digest = hashlib.sha256()
    digest.update(json.dumps({"factory": factory.FACTORY_VERSION, **DEMO_BUILD}, sort_keys=True).encode())
    data_dir = factory.TOKENIZER_DIR.parent
    for path in sorted(data_dir.rglob("*")):
        if path.is_file():
            digest.update(path.relative_to(data_dir).as_posix().encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def is_demo_checkpoint(path) -> bool:
    """True for a directory of the demo pairing (or the pairing's root)."""
    return (Path(path) / DEMO_MARKER).is_file()


def _marker(version: str, target: str, drafter: str) -> dict:
    return {
        "label": DEMO_LABEL,
        "random_weights": True,
        "version": version,
        "target": target,
        "drafter": drafter,
        **DEMO_BUILD,
    }


def _complete(root: Path, version: str) -> tuple[Path, Path] | None:
    try:
        marker = json.loads((root / DEMO_MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if marker.get("version") != version:
        return None
    target, drafter = root / marker["target"], root / marker["drafter"]
    needed = ("config.json", "model.safetensors", "tokenizer.json", DEMO_MARKER)
    if not all((d / f).is_file() for d in (target, drafter) for f in needed):
        return None
    # a truncated or altered file (a full disk, a stray edit) must not stay broken: every file the
    # build wrote is checked against the size and sha256 recorded when it was complete
    files = marker.get("files")
    if not isinstance(files, dict) or not files:
        return None
    for rel, (size, digest) in files.items():
        f = root / rel
        try:
            if f.stat().st_size != size or _sha256(f) != digest:
                return None
        except OSError:
            return None
    return target, drafter


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _manifest(root: Path) -> dict[str, list]:
    """relative path -> [size, sha256] of every file under `root` but the markers."""
    return {
        p.relative_to(root).as_posix(): [p.stat().st_size, _sha256(p)]
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != DEMO_MARKER
    }


def _builder_alive(name: str) -> bool:
    try:
        pid = int(name[len(_BUILDING) :].split("-")[0])
        os.kill(pid, 0)
    except (ValueError, IndexError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


def _sweep(demo_root: Path, keep: str) -> None:
    """Remove leftovers of dead or long-stuck builds and demo pairings of other versions."""
    now = time.time()
    for child in demo_root.iterdir():
        if not child.is_dir() or child.name == keep:
            continue
        if child.name.startswith(_BUILDING):
            stuck = now - child.stat().st_mtime > _STALE_BUILD_S
            if stuck or not _builder_alive(child.name):
                shutil.rmtree(child, ignore_errors=True)
        elif (child / DEMO_MARKER).is_file():
            shutil.rmtree(child, ignore_errors=True)


class DemoError(OSError):
    """The demo pairing can be built nowhere; the message says where it tried and what to fix."""


def fallback_root() -> Path:
    """Where the demo goes when the cache directory cannot take it: a per-user temp directory."""
    import tempfile

    return Path(tempfile.gettempdir()) / f"gemma-chat-{os.getuid() if hasattr(os, 'getuid') else 'user'}" / "demo"


def ensure_demo_pairing(cache_dir=None, on_notice=None) -> tuple[Path, Path]:
    """Build the demo pairing unless a complete one of this version exists; return its paths.

    When the cache directory cannot hold it (not writable, a file, the disk full), it is built in
    `fallback_root()` instead and `on_notice(message)` says so; DemoError when that fails too."""
    primary = Path(cache_dir) if cache_dir is not None else cache_root() / "demo"
    try:
        return _ensure_in(primary)
    except (OSError, RuntimeError) as e:  # mx.save_safetensors reports a full disk as RuntimeError
        first = f"{primary}: {getattr(e, 'strerror', None) or e}"
    fallback = fallback_root()
    try:
        _private_dir(fallback.parent)
        found = _ensure_in(fallback)
    except (OSError, RuntimeError) as e:
        raise DemoError(
            f"cannot build the demo pairing ({first}; {fallback}: {getattr(e, 'strerror', None) or e}): "
            "free some disk space "
            f"or point {_CACHE_ENV} at a writable directory"
        ) from None
    if on_notice is not None:
        on_notice(f"the demo pairing is in {fallback.parent} because {first}")
    return found


_CACHE_ENV = "GEMMA_CHAT_CACHE_DIR"


def _private_dir(path: Path) -> None:
    """A shared temp directory: ours only (0700, owned by us), so nobody else can plant a checkpoint."""
    path.mkdir(mode=0o700, exist_ok=True)
    st = path.stat()
    if hasattr(os, "getuid") and (st.st_uid != os.getuid() or st.st_mode & 0o077):
        raise PermissionError(f"{path} belongs to someone else or is open to other users")


def _ensure_in(demo_root: Path) -> tuple[Path, Path]:
    from core import factory

    version = demo_version()
    final = demo_root / version
    found = _complete(final, version)
    if found:
        return found
    demo_root.mkdir(parents=True, exist_ok=True)
    _sweep(demo_root, keep=version)
    if final.exists():  # incomplete or tampered with: rebuild it
        shutil.rmtree(final)

    tmp = demo_root / f"{_BUILDING}{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        target, drafter = factory.build_pairing(tmp, **DEMO_BUILD)
        marker = _marker(version, target.name, drafter.name)
        for d in (target, drafter):
            (d / DEMO_MARKER).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
        # the root's marker last, with every file's size and hash: it means "complete"
        marker["files"] = _manifest(tmp)
        (tmp / DEMO_MARKER).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
        try:
            os.rename(tmp, final)
        except OSError:
            # Another process finished first; use its build if it is complete.
            if not _complete(final, version):
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    found = _complete(final, version)
    if not found:
        raise RuntimeError(f"demo pairing at {final} is incomplete after building")
    return found
