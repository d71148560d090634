"""`gemma-chat models list|download|rm`: the pairing catalogue, downloads with a progress bar, removal.

Everything goes through core.hub.catalog / core.hub.download / core.hub.hfcache; nothing here imports mlx or
textual. Exit codes: 0 done, 1 failed or refused, 2 unknown pairing name, 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, TextIO

from app.commands.common import fit_to, output_columns, printable
from core.hub.download import looks_like_repo_id
from core.modeltypes import is_drafter
from core.units import format_bytes

if TYPE_CHECKING:
    from core.hub.catalog import Pairing
    from core.hub.download import DownloadProgress
    from core.hub.fit import MachineMemory


def run(args: argparse.Namespace) -> int:
    action = args.models_command
    if action == "list":
        return list_pairings(as_json=args.json)
    if action == "download":
        return download_pairing(args.name, offline=args.offline)
    if action == "rm":
        return remove_pairing(args.name, yes=args.yes)
    print(f"unknown action {action!r}", file=sys.stderr)
    return 2


def configured_pairing() -> str | None:
    """The config's default_pairing; None when unset, or when the config cannot be read."""
    from core.user.config import ConfigError, load_config

    try:
        return load_config().default_pairing
    except (ConfigError, OSError):
        return None


def config_file() -> str:
    from core.user import paths

    return str(paths.config_file())


def _gb(n: float) -> str:
    return format_bytes(n, unit="GB")  # one unit down the table's columns


def _endpoint() -> str | None:
    # huggingface_hub reads HF_ENDPOINT itself; passing it through keeps error messages exact.
    return os.environ.get("HF_ENDPOINT") or None


# -- list -------------------------------------------------------------------------------------------


def list_pairings(as_json: bool = False) -> int:
    from core.hub import catalog, fit
    from core.hub.download import default_cache_dir
    from core.hub.fit import FIT_WORDS

    machine = fit.machine_memory()
    entries = catalog.list_entries(machine=machine)
    default = configured_pairing()
    if as_json:
        payload = {
            "cache_dir": default_cache_dir(),
            "default": default,  # the config's default_pairing: what a plain `gemma-chat` opens (None: unset)
            "machine": {
                "total_bytes": machine.total_bytes,
                "budget_bytes": machine.budget_bytes,
                "note": machine.note,
                "wired_limit_mb": machine.wired_limit_mb,
            },
            "pairings": [e.as_dict() for e in entries],
            "other_local": [
                {
                    "repo_id": c.status.repo_id,
                    "model_type": c.model_type,
                    "status": c.status.state,
                    "local_bytes": c.status.size_on_disk,
                    "path": str(c.status.snapshot) if c.status.snapshot else None,
                }
                for c in catalog.other_local_checkpoints()
            ],
        }
        print(json.dumps(payload, indent=2))
        return 0
    rows = [("NAME", "STATUS", "DOWNLOAD", "MEMORY", "FIT", "VISION", "AUDIO", "BLOCK", "TARGET")]
    # the offline demo pairing, always there (shipped in the package, checked against its sha256)
    demo = "demo" + (" *" if default == "demo" else "")
    rows.append(
        (demo, "ready", "—", "< 0.1 GB", "ok", "yes", "no", "auto", "shipped with gemma-chat: gemma-chat --demo")
    )
    for e in entries:
        p = e.pairing
        status = catalog.STATUS_WORDS.get(e.status, e.status)
        if e.status == "partial":
            status = f"partial ({_gb(e.local_bytes)})"
        name = p.name + (" *" if p.name == default else "") + ("" if p.confirmed else " ?")
        rows.append(
            (
                name,
                status,
                _gb(p.download_bytes),
                _gb(e.memory.total_bytes),
                FIT_WORDS.get(e.fit.level, e.fit.level),
                "yes" if p.vision else "no",
                "yes" if p.audio else "no",
                str(p.block_size),
                p.target_repo,
            )
        )
    columns = output_columns()
    for line in _table(rows, columns):
        print(line)
    others = catalog.other_local_checkpoints()
    if others:
        print("\nOther Gemma 4 checkpoints in the cache (use with --model / --drafter):")
        for c in others:
            kind = "?" if c.model_type is None else ("drafter" if is_drafter(c.model_type) else "target")
            print(f"  {c.status.repo_id}  {kind}  {c.status.state}  {_gb(c.status.size_on_disk)}")
    print()
    for note in _notes(entries[0].memory.context, machine):
        print(fit_to(note, columns))
    return 0


def _notes(context: int, machine: MachineMemory) -> list[str]:
    """The paragraphs under the table: what its marks, columns and numbers mean."""
    from core.hub import catalog
    from core.hub.download import default_cache_dir

    budget = _gb(machine.budget_bytes) if machine.budget_bytes else "unknown"
    return [
        f"* the pairing a plain `gemma-chat` opens (default_pairing in {config_file()})",
        f"? {catalog.UNCONFIRMED_NOTE}",
        "demo: a tiny trained Gemma 4 pair shipped with gemma-chat (checked against its sha256 when it "
        "loads), offline; short answers on a few topics, real speculative decoding "
        "(gemma-chat --demo, gemma-chat generate --demo, gemma-chat bench --demo)",
        f"MEMORY = weights + K/V cache at {context} tokens + overhead; "
        f"usable here: {budget} ({machine.note}); BLOCK = the suggested block size",
        f"Drafters: the family's '-assistant-bf16' repository, downloaded with the target. "
        f"Cache: {default_cache_dir()}",
    ]


def _table(rows: Sequence[Sequence[str]], columns: int | None) -> list[str]:
    """The rows' columns padded to line up. Where the whole table is wider than `columns`, the last
    column (the target's repository) goes on its own indented line under its row instead of wrapping
    (and the gaps shrink to one space where the rest is still too wide: 80 columns)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    if columns is None or sum(widths) + 2 * (len(widths) - 1) <= columns:
        return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    gap = " " * (2 if sum(widths[:-1]) + 2 * (len(widths) - 2) <= columns else 1)
    out = []
    for r in rows:
        out.append(gap.join(c.ljust(w) for c, w in zip(r[:-1], widths)).rstrip())
        out.append(f"    {r[-1]}")
    return out


# -- download ---------------------------------------------------------------------------------------


class _Bar:
    """One self-rewriting line on stderr (a TTY), or a line every few seconds (a log)."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self._last = 0.0

    def show(self, ev: DownloadProgress) -> None:
        now = time.monotonic()
        if not self.tty and now - self._last < 5 and ev.done_bytes < ev.total_bytes:
            return
        self._last = now
        frac = ev.done_bytes / ev.total_bytes if ev.total_bytes else 1.0
        width = 24
        filled = int(frac * width)
        rate = f"{ev.rate_bps / 1e6:.1f} MB/s" if ev.rate_bps else "-- MB/s"
        eta = _clock(ev.eta_s) if ev.eta_s is not None else "--:--"
        name = printable(ev.filename)
        name = name if len(name) <= 32 else "…" + name[-31:]
        line = (
            f"[{'#' * filled}{'.' * (width - filled)}] {frac * 100:5.1f}%  "
            f"{_gb(ev.done_bytes)} / {_gb(ev.total_bytes)}  {rate}  ETA {eta}  "
            f"file {ev.files_done}/{ev.files_total} {name}"
        )
        if self.tty:
            self.stream.write("\r\x1b[2K" + line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def end(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


def _clock(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def _catalogue_pairing(name: str) -> Pairing | None:
    """The catalogue pairing `name`, or None after saying on stderr that there is none."""
    from core.hub import catalog

    try:
        return catalog.get_pairing(name)
    except KeyError as e:
        print(f"gemma-chat: {printable(e.args[0])}", file=sys.stderr)
        return None


def download_pairing(name: str, offline: bool = False) -> int:
    from core.hub import catalog, fit
    from core.hub.download import (
        DownloadCancelled,
        DownloadFailed,
        DownloadFinished,
        DownloadPlanned,
        DownloadProgress,
        start_download,
    )

    if looks_like_repo_id(name):
        # A repository id (a custom target or drafter): just that repository.
        label = name
        handle = start_download([name], offline=offline, endpoint=_endpoint())
    else:
        p = _catalogue_pairing(name)
        if p is None:
            return 2
        label = p.name
        report = fit.check_fit(p.memory().total_bytes)
        if report.warn:
            print(f"warning: {p.name}: {report.message}", file=sys.stderr)
        handle = catalog.start_pairing_download(p.name, offline=offline, endpoint=_endpoint())
    bar = _Bar()
    shown = False
    try:
        for ev in handle.events():
            if isinstance(ev, DownloadPlanned):
                print(
                    f"{label}: {', '.join(r.repo_id for r in ev.repos)}\n"
                    f"  {_gb(ev.to_download_bytes)} to download ({_gb(ev.total_bytes)} in all, "
                    f"{_gb(ev.free_bytes)} free on disk)",
                    file=sys.stderr,
                )
            elif isinstance(ev, DownloadProgress):
                bar.show(ev)
                shown = True
    except KeyboardInterrupt:
        handle.cancel()
        handle.wait(timeout=10)
        if shown:
            bar.end()
        print("download cancelled; run the same command again to resume", file=sys.stderr)
        return 130
    if shown:
        bar.end()
    final = handle.result
    if isinstance(final, DownloadFinished):
        if final.from_cache:
            print(f"{printable(label)} is already downloaded (nothing fetched).", file=sys.stderr)
        else:
            print(f"{printable(label)} downloaded.", file=sys.stderr)
        for repo, path in final.paths.items():
            print(f"{repo}\t{path}")
        return 0
    if isinstance(final, DownloadFailed):
        print(f"gemma-chat: {printable(final.message)}", file=sys.stderr)
        return 1
    if isinstance(final, DownloadCancelled):
        print("download cancelled; run the same command again to resume", file=sys.stderr)
        return 130
    print("gemma-chat: the download ended without a result", file=sys.stderr)
    return 1


# -- rm ---------------------------------------------------------------------------------------------


def remove_pairing(name: str, yes: bool = False) -> int:
    from core.hub import catalog, hfcache

    if looks_like_repo_id(name):
        # A repository id, as `download` takes it: just that repository.
        label = name
        status = hfcache.statuses([name])[name]
        doomed = [status.cached_id or name] if status.state != "missing" else []
        kept: list[str] = []
    else:
        p = _catalogue_pairing(name)
        if p is None:
            return 2
        label = p.name
        # The drafter is shared by every pairing of its family: kept while another one is on disk.
        doomed, kept = catalog.removal_plan(p.name)
    if kept:
        print(f"keeping {kept[0]}: also used by {', '.join(kept[1:])}", file=sys.stderr)
    if not doomed:
        print(f"{printable(label)}: nothing to remove (not in the Hugging Face cache).", file=sys.stderr)
        return 0
    size = sum(s.size_on_disk for s in hfcache.statuses(doomed).values())
    print(f"will remove {', '.join(doomed)} ({_gb(size)}) from the Hugging Face cache", file=sys.stderr)
    if not yes:
        if not sys.stdin.isatty():
            print("gemma-chat: not a terminal: pass --yes to confirm", file=sys.stderr)
            return 1
        answer = input("remove? [y/N] ").strip().lower()
        if answer not in ("y", "yes"):
            print("kept.", file=sys.stderr)
            return 1
    freed = hfcache.delete_repos(doomed)
    print(f"removed {printable(label)}: {_gb(freed)} freed.", file=sys.stderr)
    return 0
