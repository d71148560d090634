"""Download checkpoints into the shared Hugging Face cache, with real progress, resume and cancel.

Flow (one call to `start_download`):

  already complete in the cache?  -> finished at once, no network at all (local_files_only)
  offline?                        -> refused with a clear message if anything is missing
  child process (`python -m core.hub._download_child`, messages back over a pipe):
    plan       snapshot_download(dry_run=True) per repo: per-file sizes, what is cached
    disk       bytes still needed (+ margin) vs free space under the cache -> refuse with numbers
    fetch      per file: HEAD for the blob's etag, then GET into blobs/<etag>.incomplete, resuming
               from its current length with a Range request; renamed to blobs/<etag> when whole
    finalize   snapshot_download(revision=commit): finds every blob present, writes the snapshot
               symlinks and the cached tree listing (so a later offline check is exact); then
               refs/<revision> -> commit (`_record_ref`)

Why a child process: huggingface_hub has no cancel API, so cancel = terminate the child (a plain
subprocess, not multiprocessing's spawn, which re-imports the parent's `__main__`). Why our own
fetch step: huggingface_hub 2.4 downloads each file into a process-unique temporary file that it
deletes on failure (`_download_to_tmp_and_move`), so a killed or cancelled download would restart
from zero. The fetch step uses the client's own `http_get` (Range resume, retries, our `tqdm_class`
for byte progress) but a stable `<etag>.incomplete` name, the layout older clients used, so bytes
survive a cancel. Weights only ever live in the HF cache; nothing is copied elsewhere.

The UI sees only the dataclass events below, never hub objects.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.units import format_bytes  # noqa: F401  # re-exported: callers import it from here

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

# Only what the engine reads: configs, weights, tokenizer, chat template.
DEFAULT_ALLOW_PATTERNS: tuple[str, ...] = ("*.json", "*.safetensors", "*.jinja", "tokenizer*", "*.model")

# Resume and progress granularity. The client's default (10 MiB) makes progress jumpy and, for a
# download killed mid-file, keeps up to 10 MiB in memory instead of on disk.
CHUNK_BYTES = 1024 * 1024
# A server that accepts the connection and then says nothing (or trickles a byte a second) would leave
# a download waiting for ever: with no message from the download process for this long, it is stopped
# and reported. Progress arrives every CHUNK_BYTES, so a working link slower than ~17 KB/s trips it too.
STALL_ENV = "GEMMA_CHAT_HUB_TIMEOUT"
DEFAULT_STALL_S = 60.0


def looks_like_repo_id(value: str) -> bool:
    """`owner/name` (a Hugging Face repo id), not a path: one slash, not starting with `.`, `/` or `~`."""
    return value.count("/") == 1 and not value.startswith((".", "/", "~"))


def stall_seconds() -> float:
    try:
        value = float(os.environ.get(STALL_ENV, ""))
    except ValueError:
        return DEFAULT_STALL_S
    return value if value > 0 else DEFAULT_STALL_S


# ---------------------------------------------------------------------------------------------
# Plan and events
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FilePlan:
    filename: str
    size: int  # bytes; 0 when the server did not say
    cached: bool


@dataclass(frozen=True)
class RepoPlan:
    repo_id: str
    commit: str
    files: tuple[FilePlan, ...]
    partial_bytes: int = 0  # bytes already on disk in unfinished *.incomplete blobs

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def to_download_bytes(self) -> int:
        return sum(f.size for f in self.files if not f.cached)


@dataclass(frozen=True)
class DownloadPlanned:
    repos: tuple[RepoPlan, ...]
    total_bytes: int  # every selected file
    to_download_bytes: int  # files not yet cached (includes bytes already in partial files)
    needed_bytes: int  # to_download_bytes minus partial bytes already on disk
    free_bytes: int


@dataclass(frozen=True)
class DownloadProgress:
    repo_id: str
    filename: str
    file_done: int
    file_total: int
    done_bytes: int  # over all files still to download, resumed bytes included
    total_bytes: int
    rate_bps: float  # bytes per second over the last few seconds (this session's bytes only)
    eta_s: float | None
    files_done: int
    files_total: int


@dataclass(frozen=True)
class DownloadFinished:
    paths: dict[str, str]  # repo id -> snapshot directory in the HF cache
    from_cache: bool  # True: everything was already there, the network was not touched


@dataclass(frozen=True)
class DownloadFailed:
    kind: str  # gated | not_found | auth | network | offline | disk_space | disk_full | error
    message: str


@dataclass(frozen=True)
class DownloadCancelled:
    pass


DownloadEvent = DownloadPlanned | DownloadProgress | DownloadFinished | DownloadFailed | DownloadCancelled


class DownloadError(Exception):
    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind
        self.message = message


# ---------------------------------------------------------------------------------------------
# Local cache (no network)
# ---------------------------------------------------------------------------------------------


def default_cache_dir() -> str:
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE


def local_snapshot(
    repo_id: str,
    *,
    cache_dir: str | Path | None = None,
    revision: str = "main",
    allow_patterns: Sequence[str] = DEFAULT_ALLOW_PATTERNS,
) -> Path | None:
    """The complete cached snapshot of `repo_id`, or None. Never touches the network.

    A repo id that is a local directory counts as itself. Completeness: the client's cached tree
    listing when there is one (it raises on missing files), then our own check that the weights
    the index names are all there.
    """
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import IncompleteSnapshotError, LocalEntryNotFoundError

    if Path(repo_id).expanduser().is_dir():
        return Path(repo_id).expanduser().resolve()
    try:
        snapshot = snapshot_download(
            repo_id,
            revision=revision,
            cache_dir=cache_dir,
            local_files_only=True,
            allow_patterns=list(allow_patterns),
        )
    except (IncompleteSnapshotError, LocalEntryNotFoundError, FileNotFoundError, ValueError):
        return None
    path = Path(snapshot)
    return path if snapshot_looks_complete(path) else None


def snapshot_looks_complete(path: Path) -> bool:
    """config.json present, and weights: every shard the index names, or a single file."""
    import json

    if not (path / "config.json").is_file():
        return False
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = set(json.loads(index.read_text())["weight_map"].values())
        except (ValueError, KeyError):
            return False
        return bool(shards) and all((path / s).is_file() for s in shards)
    return any(p.is_file() for p in path.glob("*.safetensors"))


def free_disk_bytes(path: str | os.PathLike) -> int:
    """Free bytes on the disk holding `path` (the nearest existing parent)."""
    p = Path(path).expanduser().resolve()
    while not p.exists() and p != p.parent:
        p = p.parent
    return shutil.disk_usage(p).free


def margin_bytes(needed: int) -> int:
    """Room kept free after a download: 512 MiB plus 2 % of it (the OS, logs, swap need some)."""
    return 512 * 1024 * 1024 + needed // 50


def check_disk_space(
    plans: Sequence[RepoPlan], cache_dir: str | os.PathLike, free_bytes_fn: Callable[[str], int] = free_disk_bytes
) -> tuple[int, int]:
    """Raise DownloadError('disk_space') if the plan does not fit; return (needed, free)."""
    needed = sum(max(0, p.to_download_bytes - p.partial_bytes) for p in plans)
    free = int(free_bytes_fn(str(cache_dir)))
    if needed and needed + margin_bytes(needed) > free:
        raise DownloadError(
            "disk_space",
            f"not enough disk space in {cache_dir}: this download needs {format_bytes(needed)} "
            f"plus a margin of {format_bytes(margin_bytes(needed))}, and only {format_bytes(free)} is free. "
            "Free some space (`gemma-chat models rm NAME` removes a pairing) or point HF_HOME at a bigger disk.",
        )
    return needed, free


# ---------------------------------------------------------------------------------------------
# Errors -> one clear message each
# ---------------------------------------------------------------------------------------------


def classify_error(exc: BaseException, repo_id: str = "", endpoint: str | None = None) -> DownloadError:
    """Map whatever huggingface_hub / httpx / the OS raised to (kind, message)."""
    import httpx2
    from huggingface_hub import errors as hf_errors
    from huggingface_hub.utils import OfflineModeIsEnabled

    if isinstance(exc, DownloadError):
        return exc
    # The dry run wraps the real cause ("raise DryRunError(...) from api_call_error").
    seen = exc
    while isinstance(seen, (hf_errors.DryRunError, hf_errors.LocalEntryNotFoundError)) and seen.__cause__ is not None:
        seen = seen.__cause__
    exc = seen
    where = endpoint or "the Hugging Face Hub"
    repo = repo_id or "the repository"
    if isinstance(exc, hf_errors.GatedRepoError):
        return DownloadError(
            "gated",
            f"{repo} is gated: accept its terms on its Hub page, then log in (`hf auth login`) or set HF_TOKEN.",
        )
    if isinstance(exc, hf_errors.RevisionNotFoundError):
        return DownloadError("not_found", f"{repo}: that revision does not exist on {where}.")
    if isinstance(exc, hf_errors.RemoteEntryNotFoundError):
        return DownloadError("not_found", f"{repo}: a file is missing on {where} ({exc}).")
    if isinstance(exc, hf_errors.RepositoryNotFoundError):
        return DownloadError(
            "not_found",
            f"{repo} was not found on {where} (check the name; a private repo also needs you to be logged in).",
        )
    if isinstance(exc, hf_errors.HfHubHTTPError):
        status = exc.response.status_code if exc.response is not None else None
        if status in (401, 403):
            return DownloadError(
                "auth",
                f"{repo}: access denied ({status}). Your Hugging Face token is missing, invalid or lacks "
                "permission: log in again (`hf auth login`) or set HF_TOKEN.",
            )
        return DownloadError("network", f"{repo}: the Hub answered HTTP {status}: try again later.")
    if isinstance(exc, OfflineModeIsEnabled):
        return DownloadError(
            "offline", "huggingface_hub is in offline mode (HF_HUB_OFFLINE=1) and the files are not in the cache."
        )
    if isinstance(exc, (httpx2.ConnectError, httpx2.TimeoutException, httpx2.RemoteProtocolError, httpx2.NetworkError)):
        return DownloadError(
            "network",
            f"cannot reach {where} ({type(exc).__name__}): check your connection, "
            "or use --offline with a pairing that is already downloaded.",
        )
    if isinstance(exc, json.JSONDecodeError) or (isinstance(exc, ValueError) and "Expecting value" in str(exc)):
        sent = " ".join(str(getattr(exc, "doc", "") or "").split())
        sent = "".join(ch if ch.isprintable() else "?" for ch in sent)[:120]
        return DownloadError(
            "network",
            f"{where} did not answer like the Hugging Face Hub"
            + (f"; it sent: {sent!r}" if sent else " (an empty or non-JSON answer)")
            + ". A captive portal or proxy login page? Open a browser to log in, or check HF_ENDPOINT.",
        )
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return DownloadError(
            "disk_full",
            f"the disk filled up while downloading {repo}: free some space and retry (the download resumes).",
        )
    if isinstance(exc, OSError) and "Consistency check failed" in str(exc):
        return DownloadError("network", f"{repo}: a file arrived truncated ({exc}); retry, the download resumes.")
    return DownloadError("error", f"{repo}: {type(exc).__name__}: {exc}")


# ---------------------------------------------------------------------------------------------
# The child process
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Job:
    repo_ids: tuple[str, ...]
    revision: str
    cache_dir: str
    endpoint: str | None
    token: str | bool | None
    allow_patterns: tuple[str, ...]
    free_bytes_fn: Callable[[str], int]


class _Silent:
    """A do-nothing progress bar for the plan and finalize steps (they move no bytes)."""

    def __init__(self, *args: object, **kwargs: Any) -> None:
        self.n = 0
        self.total = kwargs.get("total") or 0
        self.format_dict: dict = {}

    def __enter__(self) -> _Silent:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def update(self, n: int | None = 1) -> None:
        self.n += n or 0

    def refresh(self, *a: object, **k: object) -> None:
        pass

    def close(self) -> None:
        pass

    def set_description(self, *a: object, **k: object) -> None:
        pass

    set_description_str = set_postfix_str = set_description


def _progress_bar_class(send: Callable[[tuple], None], repo_id: str, filename: str) -> type[_Silent]:
    """A tqdm stand-in that reports bytes of one file over the pipe (at most ~10 per second)."""

    class _Reporter(_Silent):
        def __init__(self, *args: object, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.initial = int(kwargs.get("initial") or 0)
            self.n = self.initial
            self._last = 0.0
            send(("file", repo_id, filename, self.n, int(self.total or 0), self.initial))

        def update(self, n: int | None = 1) -> None:
            self.n += n or 0
            now = time.monotonic()
            if now - self._last >= 0.1:
                self._last = now
                send(("file", repo_id, filename, self.n, int(self.total or 0), None))

        def close(self) -> None:
            send(("file", repo_id, filename, self.n, int(self.total or 0), None))

        def __exit__(self, *exc: object) -> None:
            self.close()

    return _Reporter


def _plan_repo(job: _Job, repo_id: str) -> RepoPlan:
    from huggingface_hub import snapshot_download
    from huggingface_hub.file_download import repo_folder_name

    infos = snapshot_download(
        repo_id,
        revision=job.revision,
        cache_dir=job.cache_dir,
        endpoint=job.endpoint,
        token=job.token,
        allow_patterns=list(job.allow_patterns),
        dry_run=True,
        tqdm_class=_Silent,
    )
    if not infos:
        raise DownloadError("not_found", f"{repo_id} has no files matching {', '.join(job.allow_patterns)}.")
    blobs = Path(job.cache_dir) / repo_folder_name(repo_id=repo_id, repo_type="model") / "blobs"
    partial = sum(p.stat().st_size for p in blobs.glob("*.incomplete")) if blobs.is_dir() else 0
    files = tuple(
        FilePlan(i.filename, int(i.file_size or 0), bool(i.is_cached and not i.will_download))
        for i in sorted(infos, key=lambda i: i.filename)
    )
    return RepoPlan(repo_id, infos[0].commit_hash, files, partial)


def _fetch_file(job: _Job, plan: RepoPlan, filename: str, send: Callable[[tuple], None]) -> None:
    """Bring one file's blob into the cache, resuming a partial one."""
    from huggingface_hub import constants
    from huggingface_hub.file_download import get_hf_file_metadata, hf_hub_url, http_get, repo_folder_name
    from huggingface_hub.utils import WeakFileLock, build_hf_headers

    storage = Path(job.cache_dir) / repo_folder_name(repo_id=plan.repo_id, repo_type="model")
    url = hf_hub_url(plan.repo_id, filename, revision=plan.commit, endpoint=job.endpoint)
    headers = build_hf_headers(token=job.token)
    meta = get_hf_file_metadata(url, token=job.token, endpoint=job.endpoint, headers={})
    if not meta.etag:
        raise DownloadError("error", f"{plan.repo_id}/{filename}: the server sent no ETag")
    blob = storage / "blobs" / meta.etag
    partial = blob.with_name(blob.name + ".incomplete")
    lock = Path(job.cache_dir) / ".locks" / storage.name / f"{meta.etag}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    blob.parent.mkdir(parents=True, exist_ok=True)
    with WeakFileLock(str(lock)):
        if blob.exists():
            size = blob.stat().st_size
            send(("file", plan.repo_id, filename, size, size, size))
            return
        resume = partial.stat().st_size if partial.exists() else 0
        if meta.size is not None and resume > meta.size:
            partial.unlink()
            resume = 0
        if meta.size is not None and resume == meta.size:  # whole, but the rename never happened
            send(("file", plan.repo_id, filename, resume, resume, resume))
        download_url = meta.location or url
        if download_url != url and not download_url.startswith(job.endpoint or constants.ENDPOINT):
            headers.pop("authorization", None)  # a CDN url is signed; never send it our token
        constants.DOWNLOAD_CHUNK_SIZE = CHUNK_BYTES
        with open(partial, "ab") as f:
            http_get(
                download_url,
                f,
                resume_size=resume,
                headers=headers,
                expected_size=meta.size,
                displayed_filename=filename,
                tqdm_class=_progress_bar_class(send, plan.repo_id, filename),
            )
        os.chmod(partial, 0o666 & ~_umask())
        os.replace(partial, blob)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _finalize(job: _Job, plan: RepoPlan) -> str:
    from huggingface_hub import snapshot_download

    snapshot = snapshot_download(
        plan.repo_id,
        revision=plan.commit,
        cache_dir=job.cache_dir,
        endpoint=job.endpoint,
        token=job.token,
        allow_patterns=list(job.allow_patterns),
        tqdm_class=_Silent,
    )
    _record_ref(Path(snapshot).parent.parent, job.revision, plan.commit)
    return snapshot


def _record_ref(storage: Path, revision: str, commit: str) -> None:
    """refs/<revision> names the commit, so that the offline checks (`local_snapshot`) find the snapshot
    by branch. A download by commit writes no ref, and the plan's dry run wrote it only up to
    huggingface_hub 2.4 (2.5 writes nothing in a dry run). The client's own writer (2.4 and 2.5 alike:
    atomic, nothing written when the ref is already right or the revision is a commit)."""
    from huggingface_hub.file_download import _cache_commit_hash_for_specific_revision

    _cache_commit_hash_for_specific_revision(str(storage), revision, commit)


def _child_main(conn: Connection, job: _Job) -> None:
    lock = threading.Lock()

    def send(msg: tuple) -> None:
        with lock:
            conn.send(msg)

    current = ""
    try:
        plans = []
        for repo_id in job.repo_ids:
            current = repo_id
            plans.append(_plan_repo(job, repo_id))
        needed, free = check_disk_space(plans, job.cache_dir, job.free_bytes_fn)
        send(("plan", tuple(plans), needed, free))
        paths = {}
        for plan in plans:
            current = plan.repo_id
            for f in plan.files:
                if not f.cached:
                    _fetch_file(job, plan, f.filename, send)
                    send(("file_done", plan.repo_id, f.filename))
            paths[plan.repo_id] = _finalize(job, plan)
        send(("done", paths))
    except BaseException as exc:  # noqa: BLE001 - everything becomes one clear message for the parent
        err = classify_error(exc, current, job.endpoint)
        send(("error", err.kind, err.message))
    finally:
        conn.close()


# ---------------------------------------------------------------------------------------------
# The parent side: a handle with events and cancel()
# ---------------------------------------------------------------------------------------------


class DownloadHandle:
    """A running (or already finished) download. Read `events()` from one thread; `cancel()` from any.

    `events()` yields DownloadPlanned, then DownloadProgress (many), then exactly one of
    DownloadFinished / DownloadFailed / DownloadCancelled, and stops.
    """

    def __init__(
        self,
        process: _ChildProcess | None = None,
        conn: Connection | None = None,
        final: DownloadEvent | None = None,
        *,
        stall_s: float | None = None,
        where: str = "the Hugging Face Hub",
    ):
        self._process = process
        self._conn = conn if conn is not None or process is None else process.conn
        self._final = final
        self.stall_s = stall_seconds() if stall_s is None else stall_s
        self._where = where
        self._last_message = time.monotonic()
        self._final_pending = final is not None  # a handle born finished still yields its event once
        self._cancelled = threading.Event()
        # progress bookkeeping
        self._files: dict[tuple[str, str], tuple[int, int, int]] = {}  # (repo, file) -> (done, total, initial)
        self._files_done = 0
        self._files_total = 0
        self._total = 0
        self._samples: deque[tuple[float, int]] = deque()

    # -- state --------------------------------------------------------------------------------
    @property
    def finished(self) -> bool:
        return self._final is not None

    @property
    def running(self) -> bool:
        """Whether the child process is still alive (False for a handle born finished)."""
        return self._process is not None and self._process.is_alive()

    @property
    def result(self) -> DownloadEvent | None:
        """The final event once finished (DownloadFinished / DownloadFailed / DownloadCancelled)."""
        return self._final

    def cancel(self) -> None:
        """Stop the download now. Bytes already on disk stay and a later download resumes them."""
        self._cancelled.set()
        if self._process is not None and self._process.is_alive():
            self._process.terminate()

    def wait(self, timeout: float | None = None) -> DownloadEvent | None:
        """Drain events until the end (or `timeout`); return the final event, if any yet."""
        for _ in self.events(timeout=timeout):
            pass
        return self._final

    # -- events -------------------------------------------------------------------------------
    def events(self, timeout: float | None = None) -> Iterator[DownloadEvent]:
        """Blocking iterator over events, ending after the final one (or at `timeout`)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            yield from self.poll(0.2)
            if self._final is not None and self._conn is None and not self._final_pending:
                return
            if deadline is not None and time.monotonic() > deadline:
                return

    def poll(self, timeout: float = 0.0) -> list[DownloadEvent]:
        """Events that arrived so far (waits up to `timeout` for the first one). UI-timer friendly."""
        if self._final_pending and self._final is not None:
            self._final_pending = False
            return [self._final]
        out: list[DownloadEvent] = []
        wait = timeout
        while self._conn is not None:
            try:
                ready = self._conn.poll(wait)
            except (EOFError, OSError):
                ready = True
            if not ready:
                if time.monotonic() - self._last_message > self.stall_s:
                    out.append(self._stalled())
                break
            wait = 0.0
            self._last_message = time.monotonic()
            try:
                msg = self._conn.recv()
            except (EOFError, OSError):
                msg = None
            ev = self._end_without_message() if msg is None else self._translate(msg)
            if ev is not None:
                out.append(ev)
            if self._final is not None:
                self._close()
        return out

    def _stalled(self) -> DownloadEvent:
        """Nothing from the download process for `stall_s`: it is waiting on a server that does not answer."""
        if self._process is not None and self._process.is_alive():
            self._process.terminate()
        self._final = DownloadFailed(
            "network",
            f"{self._where} accepted the connection but sent nothing (or almost nothing) for "
            f"{self.stall_s:g} s: the server or a proxy is stalled. Check your connection (and HF_ENDPOINT), "
            f"then retry; the download resumes. ({STALL_ENV} sets this limit.)",
        )
        self._close()
        return self._final

    def _end_without_message(self) -> DownloadEvent:
        if self._cancelled.is_set():
            self._final = DownloadCancelled()
        else:
            code = self._process.exitcode if self._process is not None else None
            self._final = DownloadFailed("error", f"the download process ended unexpectedly (exit code {code})")
        return self._final

    def _close(self) -> None:
        if self._process is not None:
            self._process.join(timeout=5)
            if self._process.is_alive():
                self._process.kill()
                self._process.join(timeout=5)
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _translate(self, msg: tuple) -> DownloadEvent | None:
        kind = msg[0]
        if self._cancelled.is_set() and kind not in ("done",):
            # A message that raced the terminate: the user asked to stop, so report that.
            self._final = DownloadCancelled()
            return self._final
        if kind == "plan":
            _, plans, needed, free = msg
            self._files_total = sum(1 for p in plans for f in p.files if not f.cached)
            self._total = sum(p.to_download_bytes for p in plans)
            self._samples.append((time.monotonic(), 0))
            return DownloadPlanned(
                repos=plans,
                total_bytes=sum(p.total_bytes for p in plans),
                to_download_bytes=self._total,
                needed_bytes=needed,
                free_bytes=free,
            )
        if kind == "file":
            _, repo_id, filename, done, total, initial = msg
            prev = self._files.get((repo_id, filename))
            if initial is None:
                initial = prev[2] if prev else 0
            self._files[(repo_id, filename)] = (done, total, initial)
            return self._progress(repo_id, filename)
        if kind == "file_done":
            self._files_done += 1
            return self._progress(msg[1], msg[2])
        if kind == "done":
            self._final = DownloadFinished(paths=dict(msg[1]), from_cache=False)
            return self._final
        if kind == "error":
            self._final = DownloadFailed(msg[1], msg[2])
            return self._final
        return None

    def _progress(self, repo_id: str, filename: str) -> DownloadProgress:
        now = time.monotonic()
        done = sum(d for d, _, _ in self._files.values())
        session = sum(d - i for d, _, i in self._files.values())
        self._samples.append((now, session))
        while len(self._samples) > 2 and now - self._samples[0][0] > 3.0:
            self._samples.popleft()
        t0, b0 = self._samples[0]
        rate = (session - b0) / (now - t0) if now - t0 > 0.05 else 0.0
        total = max(self._total, done)
        eta = (total - done) / rate if rate > 0 else None
        f_done, f_total, _ = self._files.get((repo_id, filename), (0, 0, 0))
        return DownloadProgress(
            repo_id=repo_id,
            filename=filename,
            file_done=f_done,
            file_total=f_total,
            done_bytes=done,
            total_bytes=total,
            rate_bps=rate,
            eta_s=eta,
            files_done=self._files_done,
            files_total=self._files_total,
        )


def start_download(
    repo_ids: Sequence[str],
    *,
    revision: str = "main",
    cache_dir: str | os.PathLike | None = None,
    endpoint: str | None = None,
    token: str | bool | None = None,
    offline: bool = False,
    allow_patterns: Sequence[str] = DEFAULT_ALLOW_PATTERNS,
    free_bytes_fn: Callable[[str], int] = free_disk_bytes,
) -> DownloadHandle:
    """Start bringing `repo_ids` into the HF cache; returns at once with a handle.

    Already complete in the cache: a finished handle, no network. `offline=True`: never touches the
    network; a finished handle that failed with kind "offline" if anything is missing.
    `free_bytes_fn(path)` must be picklable (a module-level function): it runs in the child.
    """
    cache_dir = str(Path(cache_dir or default_cache_dir()).expanduser())
    repo_ids = tuple(dict.fromkeys(repo_ids))
    local = {
        r: local_snapshot(r, cache_dir=cache_dir, revision=revision, allow_patterns=allow_patterns) for r in repo_ids
    }
    missing = [r for r, p in local.items() if p is None]
    if not missing:
        return DownloadHandle(final=DownloadFinished({r: str(p) for r, p in local.items()}, from_cache=True))
    if offline:
        names = ", ".join(missing)
        return DownloadHandle(
            final=DownloadFailed(
                "offline",
                f"offline mode: {names} {'is' if len(missing) == 1 else 'are'} not (completely) in the "
                f"Hugging Face cache at {cache_dir}. Download {'it' if len(missing) == 1 else 'them'} first, online.",
            )
        )
    job = _Job(repo_ids, revision, cache_dir, endpoint, token, tuple(allow_patterns), free_bytes_fn)
    return DownloadHandle(process=_ChildProcess(job), conn=None, where=_where(endpoint))


def _where(endpoint: str | None) -> str:
    from huggingface_hub import constants

    url = endpoint or constants.ENDPOINT
    return "the Hugging Face Hub" if url.rstrip("/") == "https://huggingface.co" else f"the server at {url}"


class _ChildProcess:
    """`python -m core.hub._download_child` with a one-way message pipe back to us.

    A plain subprocess rather than multiprocessing's spawn: spawn re-imports the parent's
    `__main__`, which breaks under any entry script without a `__main__` guard.
    """

    def __init__(self, job: _Job):
        import pickle
        import subprocess
        import sys
        from multiprocessing.connection import Connection

        read_fd, write_fd = os.pipe()
        try:
            self._popen = subprocess.Popen(
                [sys.executable, "-m", "core.hub._download_child", str(write_fd)],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,  # the UI owns the terminal; errors come back as messages
                pass_fds=(write_fd,),
                env={**os.environ, "HF_HUB_DISABLE_PROGRESS_BARS": "1"},
            )
        finally:
            os.close(write_fd)
        self.conn = Connection(read_fd, writable=False)
        # The child needs our import path (a test's free-space function lives in a test module).
        payload = pickle.dumps((list(sys.path), pickle.dumps(job)))
        stdin = self._popen.stdin
        assert stdin is not None  # stdin=PIPE
        try:
            stdin.write(payload)
            stdin.close()
        except BrokenPipeError:
            pass

    def is_alive(self) -> bool:
        return self._popen.poll() is None

    def terminate(self) -> None:
        if self.is_alive():
            self._popen.terminate()

    def kill(self) -> None:
        if self.is_alive():
            self._popen.kill()

    def join(self, timeout: float | None = None) -> None:
        import subprocess

        try:
            self._popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pass

    @property
    def exitcode(self) -> int | None:
        return self._popen.poll()


def child_entry(write_fd: int) -> None:
    """Body of `python -m core.hub._download_child FD`: read the job from stdin, report over FD."""
    import pickle
    import sys
    from multiprocessing.connection import Connection

    conn = Connection(write_fd, readable=False)
    sys_path, job_bytes = pickle.loads(sys.stdin.buffer.read())
    for p in reversed(sys_path):
        if p not in sys.path:
            sys.path.insert(0, p)
    _child_main(conn, pickle.loads(job_bytes))


def download(
    repo_ids: Sequence[str], on_event: Callable[[DownloadEvent], None] | None = None, **kwargs: Any
) -> dict[str, str]:
    """Blocking convenience: run `start_download` to the end; return repo -> snapshot path or raise."""
    handle = start_download(repo_ids, **kwargs)
    try:
        for ev in handle.events():
            if on_event is not None:
                on_event(ev)
    except BaseException:
        handle.cancel()
        handle.wait(timeout=10)
        raise
    final = handle.result
    if isinstance(final, DownloadFinished):
        return final.paths
    if isinstance(final, DownloadFailed):
        raise DownloadError(final.kind, final.message)
    raise DownloadError("cancelled", "the download was cancelled")
