"""What is in the shared Hugging Face cache: complete, partial or missing repositories. No network.

Repo ids are matched case-insensitively: the Hub resolves `gemma-4-31B-it-bf16` and
`gemma-4-31b-it-bf16` to the same repository, but the cache folder keeps the spelling that was used.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from core.hub.download import DEFAULT_ALLOW_PATTERNS, default_cache_dir, local_snapshot


@dataclass(frozen=True)
class RepoStatus:
    repo_id: str  # as asked for
    state: str  # "complete" | "partial" | "missing"
    size_on_disk: int  # bytes of blobs, unfinished ones included
    snapshot: Path | None  # the complete snapshot directory, when complete
    cached_id: str | None = None  # the spelling found in the cache, when it differs in case
    partial_bytes: int = 0  # bytes in unfinished *.incomplete blobs

    @property
    def complete(self) -> bool:
        return self.state == "complete"


def _cache(cache_dir: str | os.PathLike | None) -> Path:
    return Path(cache_dir or default_cache_dir()).expanduser()


def _repo_folders(cache: Path) -> dict[str, tuple[str, Path]]:
    """lower-case repo id -> (repo id as spelled on disk, folder), for model repos."""
    out: dict[str, tuple[str, Path]] = {}
    if not cache.is_dir():
        return out
    for entry in cache.iterdir():
        if entry.is_dir() and entry.name.startswith("models--"):
            repo_id = entry.name[len("models--") :].replace("--", "/")
            out[repo_id.lower()] = (repo_id, entry)
    return out


def _blob_bytes(folder: Path) -> tuple[int, int]:
    total = partial = 0
    blobs = folder / "blobs"
    if blobs.is_dir():
        for b in blobs.iterdir():
            try:
                size = b.stat().st_size
            except OSError:
                continue
            total += size
            if b.name.endswith(".incomplete"):
                partial += size
    return total, partial


def repo_status(
    repo_id: str,
    *,
    cache_dir: str | os.PathLike | None = None,
    allow_patterns: Sequence[str] = DEFAULT_ALLOW_PATTERNS,
    _folders: dict[str, tuple[str, Path]] | None = None,
) -> RepoStatus:
    """A local directory counts as complete when it holds a config and weights."""
    local_dir = Path(repo_id).expanduser()
    if local_dir.is_dir():
        snap = local_snapshot(str(local_dir))
        size = sum(p.stat().st_size for p in local_dir.glob("*") if p.is_file())
        return RepoStatus(repo_id, "complete" if snap else "partial", size, snap)
    cache = _cache(cache_dir)
    folders = _folders if _folders is not None else _repo_folders(cache)
    found = folders.get(repo_id.lower())
    if found is None:
        return RepoStatus(repo_id, "missing", 0, None)
    cached_id, folder = found
    size, partial = _blob_bytes(folder)
    snap = local_snapshot(cached_id, cache_dir=cache, allow_patterns=allow_patterns)
    return RepoStatus(
        repo_id,
        "complete" if snap is not None else "partial",
        size,
        snap,
        cached_id if cached_id != repo_id else None,
        partial,
    )


def statuses(repo_ids: Sequence[str], *, cache_dir: str | os.PathLike | None = None) -> dict[str, RepoStatus]:
    """Status of several repos with one listing of the cache folder."""
    folders = _repo_folders(_cache(cache_dir))
    return {r: repo_status(r, cache_dir=cache_dir, _folders=folders) for r in repo_ids}


def scan(cache_dir: str | os.PathLike | None = None) -> list[RepoStatus]:
    """Every model repository in the cache, complete or partial (huggingface_hub's scan + folders).

    `scan_cache_dir` skips repos it finds inconsistent (e.g. a first download cancelled before any
    snapshot existed); those still show up here as partial.
    """
    from huggingface_hub import scan_cache_dir

    cache = _cache(cache_dir)
    folders = _repo_folders(cache)
    ids = {}
    if cache.is_dir():
        info = scan_cache_dir(cache)
        for repo in info.repos:
            if repo.repo_type == "model":
                ids[repo.repo_id.lower()] = repo.repo_id
    for key, (repo_id, _) in folders.items():
        ids.setdefault(key, repo_id)
    return [repo_status(ids[k], cache_dir=cache, _folders=folders) for k in sorted(ids)]


def delete_repos(repo_ids: Sequence[str], *, cache_dir: str | os.PathLike | None = None) -> int:
    """Remove these repositories from the cache (every revision, partial blobs too); return bytes freed."""
    from huggingface_hub import scan_cache_dir

    cache = _cache(cache_dir)
    if not cache.is_dir():
        return 0
    wanted = {r.lower() for r in repo_ids}
    folders = {k: v for k, v in _repo_folders(cache).items() if k in wanted}
    freed = sum(_blob_bytes(folder)[0] for _, folder in folders.values())
    info = scan_cache_dir(cache)
    # delete_revisions matches commit hashes in every repo it was given: hand it only ours.
    mine = frozenset(r for r in info.repos if r.repo_type == "model" and r.repo_id.lower() in wanted)
    hashes = [rev.commit_hash for repo in mine for rev in repo.revisions]
    if hashes:
        dataclasses.replace(info, repos=mine).delete_revisions(*hashes).execute()
    # Whatever the client's deletion left (unfinished blobs, refs of a cancelled first download).
    for _, folder in folders.values():
        if folder.exists() and folder.parent.resolve() == cache.resolve():
            shutil.rmtree(folder, ignore_errors=True)
    return freed
