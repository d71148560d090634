"""Where MLX keeps the CPU kernels it compiles: a private folder of gemma-chat's own, never the shared temp.

On the CPU backend MLX turns every `mx.compile`d piece into C++, builds it with the system compiler and
loads the result with dlopen, caching the `.so` under `std::filesystem::temp_directory_path() / "mlx" /
<version> / "cpu"` (MLX 0.32, mlx/backend/cpu/compiled.cpp). It loads a file found there without checking
who wrote it, and the names are deterministic, so in the shared /tmp another local user could plant a
library that then runs as us. libstdc++'s `temp_directory_path()` reads `TMPDIR` (then TMP, TEMP, TEMPDIR;
else /tmp) each time it is called, and MLX has no other setting for it; so `use_private_kernel_cache`
points `TMPDIR` at `<cache dir>/kernels` (0700, checked) before mlx is imported.

What else TMPDIR changes: Python's `tempfile` (pinned here to the folder it would have used, so gemma-chat's
own temp files stay where they were) and the child processes, which inherit it (the C++ compiler's scratch
files land in the private folder too).

A folder that another user owns or can write (or under a parent another user could swap it in) is
refused: MLX then compiles nothing (`MLX_DISABLE_COMPILE`), loads no kernel from anywhere, and runs
slower, and the caller shows the one sentence this returns.

The same start-up call routes MLX's float32 products to numpy's OpenBLAS (core.blas), whose small forwarder
library is built into this folder: both must happen before mlx is imported, and every entry point calls this.

Also here: the marker of a pairing whose kernels are prepared (core.engine.kernels writes it).
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from core import blas
from core.user import paths

KERNELS_DIRNAME = "kernels"
KERNEL_DIR_ENV = "GEMMA_CHAT_KERNEL_DIR"  # the kernel folder itself (the tests share one per session)
DISABLE_ENV = "MLX_DISABLE_COMPILE"


@dataclass(frozen=True)
class KernelCache:
    folder: Path | None  # where MLX writes and reads its kernels; None: refused, nothing is compiled
    problem: str | None = None  # why the folder was refused (one sentence), or why it is a temporary one
    persistent: bool = True  # False: a private temp folder (the cache folder could not be created)

    @property
    def compile_allowed(self) -> bool:
        return self.folder is not None


_active: KernelCache | None = None


def kernel_cache_dir() -> Path:
    value = os.environ.get(KERNEL_DIR_ENV, "").strip()
    return Path(value).expanduser() if value else paths.cache_dir() / KERNELS_DIRNAME


def mlx_kernel_dir(root: Path, version: str) -> Path:
    """The folder MLX itself writes to under `root` (its TMPDIR)."""
    return root / "mlx" / version / "cpu"


def unsafe_reason(folder: Path) -> str | None:
    """Why `folder` must not hold code we load, or None. The folder and whatever MLX made inside it must be
    ours and writable by no one else; every parent must belong to us or root and, if others can write it,
    be sticky (as /tmp is), so nobody can swap our folder for theirs."""
    uid = os.geteuid()
    try:
        inside = [folder, *(p for p in folder.rglob("*") if p.is_dir() and not p.is_symlink())]
    except OSError as e:
        return f"the kernel cache folder {folder} cannot be read ({e.strerror or e})"
    for p in inside:
        st = p.lstat()
        if stat.S_ISLNK(st.st_mode):
            return f"the kernel cache folder {p} is a symbolic link"
        if st.st_uid != uid:
            return f"the kernel cache folder {p} belongs to another user (uid {st.st_uid})"
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return f"the kernel cache folder {p} is writable by other users (mode {stat.S_IMODE(st.st_mode):04o})"
    for parent in folder.resolve().parents:
        st = parent.stat()
        if st.st_uid not in (uid, 0):
            return f"the kernel cache folder's parent {parent} belongs to another user (uid {st.st_uid})"
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
            return f"the kernel cache folder's parent {parent} is writable by other users"
    return None


def _make_private(folder: Path) -> None:
    for p in reversed([folder, *folder.parents]):
        if not p.exists():
            p.mkdir(mode=0o700)


def use_private_kernel_cache(folder: Path | None = None) -> KernelCache:
    """Point MLX's kernel cache at gemma-chat's private folder (`folder`, default `<cache dir>/kernels`), and
    its float32 products at OpenBLAS (`core.blas.install`). Call before mlx is imported; idempotent within a
    process (the first call decides)."""
    global _active
    if _active is None:
        _active = _choose_folder(folder)
        blas.install(_active.folder)  # a refused folder: the reference BLAS (nothing built or loaded)
    return _active


def _choose_folder(folder: Path | None) -> KernelCache:
    tempfile.tempdir = tempfile.gettempdir()  # Python's temp files stay where they were
    folder = folder or kernel_cache_dir()
    persistent, note = True, None
    try:
        _make_private(folder)
    except OSError as e:  # a read-only or full cache folder: a fresh private one for this run
        folder = Path(tempfile.mkdtemp(prefix="gemma-chat-kernels-"))
        persistent, note = False, f"kernels are compiled into a temporary folder ({e.strerror or e})"
    problem = unsafe_reason(folder)
    if problem is not None:
        refused = KernelCache(
            None,
            f"{problem}: gemma-chat runs without compiled kernels (slower); "
            f"make it private (chmod 700, your own) or set GEMMA_CHAT_CACHE_DIR",
        )
        os.environ[DISABLE_ENV] = "1"
        mx = sys.modules.get("mlx.core")
        if mx is not None:  # imported already (a script that came first): it reads the variable once
            mx.disable_compile()
        return refused
    os.environ["TMPDIR"] = str(folder)
    return KernelCache(folder, note, persistent)


def active() -> KernelCache | None:
    """What `use_private_kernel_cache` decided in this process (None: it was not called)."""
    return _active


# -- prepared pairings --------------------------------------------------------------------------------
def pairing_signature(parts: list[str]) -> str:
    """A short stable name for one pairing's kernel set (config files, dtype, MLX version, plan version)."""
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]


def marker_path(cache: KernelCache, signature: str) -> Path | None:
    return cache.folder / "prepared" / f"{signature}.json" if cache.folder is not None else None


def is_prepared(cache: KernelCache, signature: str) -> bool:
    """A marker for `signature` exists and every kernel it lists is still on disk."""
    marker = marker_path(cache, signature)
    if marker is None or cache.folder is None:
        return False
    try:
        names = json.loads(marker.read_text()).get("kernels", [])
    except (OSError, ValueError, AttributeError):
        return False
    return all((cache.folder / n).is_file() for n in names)


def write_marker(cache: KernelCache, signature: str) -> None:
    marker = marker_path(cache, signature)
    if marker is None or cache.folder is None:
        return
    names = sorted(  # MLX's kernels, not the BLAS forwarder beside them (it is core.blas's, for every pairing)
        str(p.relative_to(cache.folder)) for p in cache.folder.rglob("*.so") if p.parent != cache.folder / "blas"
    )
    marker.parent.mkdir(mode=0o700, exist_ok=True)
    tmp = marker.with_suffix(".tmp")
    tmp.write_text(json.dumps({"kernels": names}))
    tmp.replace(marker)
