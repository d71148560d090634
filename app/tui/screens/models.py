"""F2 / palette "Models": the pairing catalogue with local status, downloads, switching and removal.

Rows: the offline demo pairing, every catalogue pairing (status in the HF cache, download size,
memory needed and fit on this machine, vision, audio, suggested block size, whether the repository
name is confirmed), then other Gemma 4 checkpoints found in the cache. A screen narrower than the whole
table (80 columns) gets NARROW_COLUMNS instead, rebuilt on resize, so nothing is off to the right; the
details under the table say all of it (label, repositories, what it takes, block size) for the
highlighted row.

Keys: Enter uses the highlighted pairing (the chat screen loads it in the running engine; a pairing
that will not fit asks first), d downloads it (progress with bytes, rate, ETA and the current file;
x cancels; d again resumes from the bytes already on disk), r removes it from the cache after a
confirmation, Esc goes back to the chat.

Nothing here blocks the UI: the cache is read in a thread worker, a download is a child process whose
`DownloadHandle` is drained by a timer, and a load is the engine's (the chat screen's bridge).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from rich.cells import cell_len
from rich.text import Text
from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.command import DiscoveryHit, Hit, Hits, Provider
from textual.screen import Screen
from textual.widgets import DataTable, Footer, ProgressBar, Static

from app.resources import style_path
from app.tui.messages import PairingFailed, PairingLoaded, PairingProgress
from app.tui.session import ChatSession
from core.hub.catalog import STATUS_WORDS, UNCONFIRMED_NOTE
from core.hub.fit import FIT_WORDS
from core.modeltypes import is_drafter
from core.units import format_bytes

if TYPE_CHECKING:
    from core.engine.contract import PairingSpec
    from core.hub.catalog import CatalogEntry, LocalCheckpoint
    from core.hub.download import DownloadEvent, DownloadFailed, DownloadHandle, DownloadProgress
    from core.hub.fit import MachineMemory

DEMO_KEY = "demo"
OTHER_PREFIX = "other:"
POLL_HZ = 10.0

OFFLINE_MESSAGE = (
    "Offline mode is on (--offline, or offline = true in the config): downloads are disabled. "
    "Turn it off to download, or use a pairing that is already here (the demo always works)."
)


def gb(n: float) -> str:
    return format_bytes(n, unit="GB")  # one unit down the table's columns


def clock(seconds: float | None) -> str:
    if seconds is None:
        return "--:--"
    s = int(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def progress_line(ev: DownloadProgress) -> str:
    """One line for a DownloadProgress: bytes, rate, ETA, current file."""
    pct = 100.0 * ev.done_bytes / ev.total_bytes if ev.total_bytes else 100.0
    rate = f"{ev.rate_bps / 1e6:.1f} MB/s" if ev.rate_bps else "-- MB/s"
    name = ev.filename if len(ev.filename) <= 40 else "…" + ev.filename[-39:]
    return (
        f"{pct:5.1f}%  {gb(ev.done_bytes)} / {gb(ev.total_bytes)}  {rate}  ETA {clock(ev.eta_s)}  "
        f"file {ev.files_done}/{ev.files_total}: {ev.repo_id.split('/')[-1]}/{name}"
    )


@dataclass
class ModelsOptions:
    """How the screen reaches the Hub and the cache; tests point these at a fake hub and a tmp dir."""

    cache_dir: str | None = None
    endpoint: str | None = None
    token: str | bool | None = None
    offline: bool = False
    machine: MachineMemory | None = None  # None = this machine
    remember: bool = False  # save the chosen catalogue pairing (or "demo") as the config's default_pairing


# One row of the table, a tagged union: `kind` says which it is, and only a pairing has an `entry`,
# only another checkpoint has `other` (mypy narrows on `row.kind == ...`).
# `cells` in COLUMNS' order, `narrow` in NARROW_COLUMNS' (a terminal too narrow for the whole table).
@dataclass
class DemoRow:
    key: str
    cells: tuple
    narrow: tuple
    kind: Literal["demo"] = "demo"


@dataclass
class PairingRow:
    key: str
    entry: CatalogEntry
    cells: tuple
    narrow: tuple
    kind: Literal["pairing"] = "pairing"


@dataclass
class OtherRow:
    key: str
    other: LocalCheckpoint
    cells: tuple
    narrow: tuple
    kind: Literal["other"] = "other"


Row = DemoRow | PairingRow | OtherRow


# -- rows ------------------------------------------------------------------------------------------

# (key, title): whether a pairing fits this machine comes right after its name, so it is in view at
# 80 columns without scrolling the table sideways; each row's cells are in this order.
COLUMNS = (
    ("pairing", "Pairing"),
    ("fit", "Fit"),
    ("memory", "Memory"),
    ("status", "Status"),
    ("download", "Download"),
    ("vision", "Vision"),
    ("audio", "Audio"),
    ("block", "Block"),
    ("repo", "Repo name"),
)
# Where the whole table does not fit (80 columns: it takes ~117), each pairing is its name, then what
# decides a choice (fit, memory, whether it is here, the download), then what it takes in short; the
# label, block size and repository are in the details under the table, for the highlighted row.
NARROW_COLUMNS = (
    ("pairing", "Pairing"),
    ("fit", "Fit"),
    ("memory", "Memory"),
    ("status", "Status"),
    ("download", "Download"),
    ("takes", "Takes"),
)

_FIT_STYLE = {"ok": "green", "tight": "yellow", "wont_fit": "bold red", "unknown": "dim"}
_FIT_TEXT = FIT_WORDS  # one wording with the CLI


def size_text(n: float) -> str:
    return format_bytes(n)


def status_text(state: str, local_bytes: int = 0) -> Text:
    if state == "ready":
        return Text("ready", style="green")
    if state == "partial":
        return Text(f"partial {size_text(local_bytes)}", style="yellow")
    if state == "drafter_only":  # the family's drafter came with another pairing
        return Text(STATUS_WORDS["drafter_only"], style="dim")
    return Text(STATUS_WORDS["missing"], style="dim")


def entry_state(entry: CatalogEntry) -> str:
    if entry.status == "partial" and entry.local_bytes == 0:  # a folder left by a refused download
        return "missing"
    if entry.status == "partial" and entry.target.state == "missing" and entry.drafter.complete:
        return "drafter_only"
    return entry.status


DEFAULT_MARK = "  *"  # the pairing a plain start opens (the config's default_pairing)


def demo_row(default: str | None = None) -> Row:
    label = Text("demo  tiny trained model, offline", style="bold")
    if default == DEMO_KEY:
        label.append(DEFAULT_MARK)
    cells = (
        label,
        Text("ok", style="green"),
        "< 0.1 GB",
        Text("ready", style="green"),
        "—",
        "yes",  # the demo target has a (tiny) vision tower: it takes images like the real E models
        "no",  # and no audio tower
        "auto",
        "shipped",
    )
    name = Text(DEMO_KEY + (DEFAULT_MARK if default == DEMO_KEY else ""), style="bold")
    return DemoRow(DEMO_KEY, cells, (name, *cells[1:5], takes_short(True, False)))


def short_label(label: str) -> str:
    """A catalogue label without the "Gemma 4 " every one of them starts with (the table is narrow)."""
    return label.removeprefix("Gemma 4 ")


def pairing_row(entry: CatalogEntry, default: str | None = None) -> PairingRow:
    p = entry.pairing
    label = f"{p.name}  {short_label(p.label)}" + (DEFAULT_MARK if p.name == default else "")
    cells = (
        label,
        Text(_FIT_TEXT.get(entry.fit.level, entry.fit.level), style=_FIT_STYLE.get(entry.fit.level, "")),
        gb(entry.memory.total_bytes),
        status_text(entry_state(entry), entry.local_bytes),
        gb(p.download_bytes),
        "yes" if p.vision else "no",
        "yes" if p.audio else "no",
        str(p.block_size),
        "confirmed" if p.confirmed else Text("unconfirmed", style="dim"),
    )
    name = p.name + (DEFAULT_MARK if p.name == default else "")
    return PairingRow(p.name, entry, cells, (name, *cells[1:5], takes_short(p.vision, p.audio)))


def other_row(ckpt: LocalCheckpoint) -> OtherRow:
    st = ckpt.status
    kind = "?" if ckpt.model_type is None else ("drafter" if is_drafter(ckpt.model_type) else "target")
    cells = (
        f"{st.repo_id}  ({kind})",
        "—",
        "—",
        status_text("ready" if st.complete else "partial", st.size_on_disk),
        gb(st.size_on_disk),
        "—",
        "—",
        "—",
        "in cache",
    )
    short = st.repo_id.rsplit("/", 1)[-1]  # the owner and the kind are in the details
    return OtherRow(OTHER_PREFIX + st.repo_id, ckpt, cells, (short, *cells[1:5], "—"))


NAME_WIDTH = 33  # the wide table's Pairing column at most (the demo's width): a longer name is cut with "…"
NARROW_NAME_MIN = 8  # the narrow table's Pairing column at least, however narrow the screen ("e2b-8bit")
PADDING = 2  # a column's cell padding, 1 a side
SCROLLBAR = 2  # the table's vertical scrollbar


def column_widths(rows: list[Row], narrow: bool) -> list[int]:
    """Each column's content width: its widest cell or title (the Pairing column as shown: at most NAME_WIDTH)."""
    columns = NARROW_COLUMNS if narrow else COLUMNS
    widths = []
    for i, (_, title) in enumerate(columns):
        widest = max([cell_len(title), *(cell_len(str(r.narrow[i] if narrow else r.cells[i])) for r in rows)])
        widths.append(min(widest, NAME_WIDTH) if i == 0 else widest)
    return widths


def table_width(rows: list[Row]) -> int:
    """Columns the whole (wide) table takes, padding and scrollbar included."""
    return sum(w + PADDING for w in column_widths(rows, narrow=False)) + SCROLLBAR


def clipped(cell: str | Text, width: int) -> str | Text:
    """The cell cut to `width` columns with "…" where it is longer (the highlighted row's details say all)."""
    text = Text(cell) if isinstance(cell, str) else cell
    if text.cell_len <= width:
        return cell
    text = text.copy()
    text.truncate(width, overflow="ellipsis")
    return text


def offer_text(row: PairingRow) -> str:
    """What the screen says when it opens on a pairing asked for by name that is not downloaded."""
    e, name = row.entry, row.key
    size = gb(e.pairing.download_bytes)
    if entry_state(e) == "partial":  # a download stopped part way: d goes on from the bytes on disk
        said = f"{name} is partly downloaded ({gb(e.local_bytes)} of {size}): press d to finish, then Enter to use it."
    else:
        said = f"{name} is not downloaded yet: press d to download it ({size}), then Enter to use it."
    return said + " Esc: the demo."


def intro_text(ready: str | None) -> str:
    demo = "the offline demo (a tiny model trained on gemma-chat's notes: short answers, real speculative decoding)"
    if ready is None:
        return (
            f"Welcome! No pairing is set up yet. Press Enter to start {demo}, "
            "or pick a pairing below and press d to download it."
        )
    return (
        f"Welcome! {ready} is downloaded: press Enter to use it, or choose {demo}, or download another pairing with d."
    )


def details_for(row: Row) -> str:
    if row.kind == "demo":
        return (
            "Demo: a tiny Gemma 4 target and its drafter, trained on gemma-chat's own notes and Python "
            "docstrings, shipped with the app. Short answers on a few topics (greetings, the keys, speculative "
            "decoding, Gemma 4, short Python); the speculative decoding is real. Text only: an image gets a reply not "
            "about it; no audio. Works offline. Enter: use it."
        )
    if row.kind == "other":
        st = row.other.status
        kind = "drafter" if is_drafter(row.other.model_type) else "target"
        use = (
            "Enter: use it as the target without a drafter"
            if kind == "target"
            else ("a drafter: pair it with its target via --model/--drafter")
        )
        where = f"in the Hugging Face cache ({st.state}, {gb(st.size_on_disk)})"
        return f"{st.repo_id}: a Gemma 4 {kind} {where}. {use}. r: remove."
    e = row.entry
    p = e.pairing
    what = {"ready": "Enter: use it", "partial": "d: resume the download", "missing": "d: download it"}[e.status]
    confirmed = "" if p.confirmed else f" Unconfirmed: {UNCONFIRMED_NOTE}."
    return (
        f"{p.label}: target {p.target_repo} + drafter {p.drafter_repo}. Takes {takes(p.vision, p.audio)}. "
        f"Memory: {e.fit.message}. Suggested block size {p.block_size}. {what}.{confirmed}"
    )


def takes_short(vision: bool, audio: bool) -> str:
    """The narrow table's Takes cell: 'img+aud', 'img', 'text' (what a prompt may hold besides text)."""
    return "+".join([*(["img"] if vision else []), *(["aud"] if audio else [])]) or "text"


def takes(vision: bool, audio: bool) -> str:
    """'text, images and audio', 'text and images (no audio)', ...: what a pairing's prompts may hold."""
    kinds = ["text", *(["images"] if vision else []), *(["audio"] if audio else [])]
    said = ", ".join(kinds[:-1]) + " and " + kinds[-1] if len(kinds) > 1 else kinds[0]
    return said if audio else f"{said} (no audio)"


# -- the screen ------------------------------------------------------------------------------------


class ModelsScreen(Screen):
    CSS_PATH = str(style_path("models.tcss"))
    BINDINGS = [
        Binding("enter", "use", "Use", priority=True),
        Binding("d", "download", "Download"),
        Binding("x", "cancel_download", "Cancel download"),
        Binding("r,delete", "remove", "Remove"),
        Binding("escape", "close", "Back"),
    ]

    def __init__(
        self,
        session: ChatSession,
        options: ModelsOptions | None = None,
        *,
        highlight: str | None = None,
        first_run: bool = False,
        close_keys: str = "f2",
        offer: str | None = None,
    ) -> None:
        """offer: a catalogue pairing asked for by name that is not downloaded (`gemma-chat --pairing NAME`):
        the screen opens on it and says how to download it."""
        super().__init__()
        self.session = session  # the app's: what is loaded, and where a Use loads
        self.options = options or ModelsOptions()
        self.highlight = highlight or offer
        self.first_run = first_run
        self.offer = offer
        if close_keys:
            self._bindings.bind(close_keys, "close", "Back", show=False)
        self.rows: list[Row] = []
        self.loaded_once = False  # the first listing arrived
        self.narrow = False  # the table shows NARROW_COLUMNS (the screen is narrower than the whole table)
        self.download_handle: DownloadHandle | None = None
        self.download_name: str | None = None
        self.last_progress: DownloadProgress | None = None
        self.download_result: DownloadEvent | None = None  # the last download's final event
        self.pending_load: PairingSpec | None = None  # the pairing the session is loading for us
        self.message = ""
        self.table: DataTable[str | Text] = DataTable(id="models-table", cursor_type="row", zebra_stripes=True)
        self.details = Static("", id="models-details")
        self.bar = ProgressBar(id="models-bar", show_eta=False)
        self.progress = Static("", id="models-progress-text")
        self.notice = Static("", id="models-message")

    def compose(self) -> ComposeResult:
        yield Static(
            Text("Models", style="bold") + Text("  a Gemma 4 target + its MTP drafter", style="dim"), id="models-title"
        )
        if self.first_run:
            yield Static(intro_text(None), id="models-intro")
        yield Static("", id="models-machine")
        yield self.table
        yield self.details
        yield self.bar
        yield self.progress
        yield self.notice
        yield Footer()

    def on_mount(self) -> None:
        self.session.subscribe(self)
        self._fill_table(narrow=False)
        self.bar.display = False
        self.progress.display = False
        self.table.focus()
        self.set_interval(1 / POLL_HZ, self._tick, name="models-poll")
        if self.options.offline:
            self.say(OFFLINE_MESSAGE, "warning")
        self.refresh_rows()

    # -- listing ---------------------------------------------------------------------------------
    @work(thread=True, exclusive=True, group="models-list")
    def refresh_rows(self) -> None:
        from core.hub import catalog, fit

        machine = self.options.machine or fit.machine_memory()
        entries = catalog.list_entries(cache_dir=self.options.cache_dir, machine=machine)
        others = catalog.other_local_checkpoints(cache_dir=self.options.cache_dir)
        default = configured_pairing()
        rows: list[Row] = [
            demo_row(default),
            *(pairing_row(e, default) for e in entries),
            *(other_row(c) for c in others),
        ]
        budget = gb(machine.budget_bytes) if machine.budget_bytes else "unknown"
        context = entries[0].memory.context if entries else 0
        line = (
            f"Usable memory here: {budget}, {machine.note} · Memory = weights + K/V cache at {context} tokens "
            f"+ overhead · * opens at start · unconfirmed repo name: see its details"
        )
        self.app.call_from_thread(self._show_rows, rows, line)

    def _show_rows(self, rows: list[Row], machine_line: str) -> None:
        keep = self.highlight or self.selected_key
        if keep is None and self.first_run:  # a downloaded pairing if there is one, else the demo
            keep = next((r.key for r in rows if r.kind == "pairing" and r.entry.status == "ready"), DEMO_KEY)
        self.highlight = None
        if self.first_run and keep != DEMO_KEY:
            self.query_one("#models-intro", Static).update(intro_text(keep))
        self.rows = rows
        self.query_one("#models-machine", Static).update(machine_line)
        self._fill_table(self.too_narrow(), keep)
        offered = self.row(self.offer) if self.offer is not None and not self.loaded_once else None
        if offered is not None and offered.kind == "pairing" and not self.options.offline:
            self.say(offer_text(offered))
        self.loaded_once = True
        self._show_details()

    def too_narrow(self) -> bool:
        """Whether the screen is narrower than the whole table (then it shows NARROW_COLUMNS)."""
        return bool(self.rows) and self.size.width < table_width(self.rows)

    def _fill_table(self, narrow: bool, keep: str | None = None) -> None:
        """(Re)build the table with the columns for the width, the cursor on `keep` (a row's key)."""
        self.narrow = narrow
        self.table.clear(columns=True)
        for key, title in NARROW_COLUMNS if narrow else COLUMNS:
            self.table.add_column(title, key=key)
        widths = column_widths(self.rows, narrow)
        name_width = widths[0]
        if narrow:  # the name gets what the other columns leave
            rest = sum(w + PADDING for w in widths[1:]) + PADDING + SCROLLBAR
            name_width = max(NARROW_NAME_MIN, min(name_width, self.size.width - rest))
        for row in self.rows:
            name, *cells = row.narrow if narrow else row.cells
            self.table.add_row(clipped(name, name_width), *cells, key=row.key)
        index = next((i for i, r in enumerate(self.rows) if r.key == keep), 0)
        if self.rows:
            self.table.move_cursor(row=index)
        if self.download_name is not None and self.download_handle is not None:
            self._mark_downloading()

    def on_resize(self) -> None:
        if self.rows and self.too_narrow() != self.narrow:
            self._fill_table(not self.narrow, self.selected_key)

    def row(self, key: str) -> Row | None:
        return next((r for r in self.rows if r.key == key), None)

    @property
    def selected(self) -> Row | None:
        if not self.rows or self.table.row_count == 0:
            return None
        index = self.table.cursor_row
        return self.rows[index] if 0 <= index < len(self.rows) else None

    @property
    def selected_key(self) -> str | None:
        row = self.selected
        return row.key if row else None

    def select(self, key: str) -> None:
        index = next(i for i, r in enumerate(self.rows) if r.key == key)
        self.table.move_cursor(row=index)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._show_details()

    def _show_details(self) -> None:
        row = self.selected
        self.details.update(details_for(row) if row else "")

    def say(self, text: str, severity: str = "information") -> None:
        self.message = text
        self.notice.update(text)
        self.notice.set_class(severity == "error", "-error")
        self.notice.set_class(severity == "warning", "-warning")

    # -- download --------------------------------------------------------------------------------
    @property
    def downloading(self) -> bool:
        return self.download_handle is not None

    def action_download(self) -> None:
        row = self.selected
        if row is None:
            return
        if row.kind != "pairing":
            self.say("Only catalogue pairings download from here (the demo ships with gemma-chat).", "warning")
            return
        if self.options.offline:
            self.say(OFFLINE_MESSAGE, "error")
            return
        if self.downloading:
            self.say(f"{self.download_name} is downloading; x cancels it first.", "warning")
            return
        if row.entry.status == "ready":
            self.say(f"{row.key} is already downloaded. Enter: use it.")
            return
        from core.hub.catalog import start_pairing_download

        o = self.options
        self.download_result = None
        self.last_progress = None
        self.download_name = row.key
        try:
            self.download_handle = start_pairing_download(
                row.key, cache_dir=o.cache_dir, endpoint=o.endpoint, token=o.token, offline=o.offline
            )
        except (OSError, LookupError) as e:  # the child could not start, or the cache is unreadable
            self.download_name = None
            self.say(f"Could not start the download of {row.key}: {e}", "error")
            return
        resumed = f" (resuming: {gb(row.entry.local_bytes)} already here)" if row.entry.status == "partial" else ""
        self.say(f"Downloading {row.key}{resumed}… x cancels; d later resumes.")
        self.bar.update(total=None, progress=0)
        self.bar.display = True
        self.progress.update("planning…")
        self.progress.display = True
        self._mark_downloading()

    def _mark_downloading(self, pct: float | None = None) -> None:
        name = self.download_name
        if name is None or self.row(name) is None:
            return
        label = "downloading" if pct is None else f"downloading {pct:.0f}%"
        self.table.update_cell(name, "status", Text(label, style="cyan"))

    def action_cancel_download(self) -> None:
        if self.download_handle is None:
            self.say("No download is running.")
            return
        self.download_handle.cancel()
        self.say(f"Cancelling {self.download_name}…")

    def _tick(self) -> None:
        if self.download_handle is not None:
            self._drain_download()

    def _drain_download(self) -> None:
        from core.hub.download import (
            DownloadCancelled,
            DownloadFailed,
            DownloadFinished,
            DownloadPlanned,
            DownloadProgress,
        )

        handle = self.download_handle
        if handle is None:
            return
        for ev in handle.poll():
            if isinstance(ev, DownloadPlanned):
                self.bar.update(total=max(ev.to_download_bytes, 1), progress=ev.to_download_bytes - ev.needed_bytes)
                self.progress.update(
                    f"{gb(ev.to_download_bytes)} to fetch ({gb(ev.needed_bytes)} new, {gb(ev.free_bytes)} free on disk)"
                )
            elif isinstance(ev, DownloadProgress):
                self.last_progress = ev
                self.bar.update(total=max(ev.total_bytes, 1), progress=ev.done_bytes)
                self.progress.update(progress_line(ev))
                self._mark_downloading(100.0 * ev.done_bytes / ev.total_bytes if ev.total_bytes else None)
            elif isinstance(ev, (DownloadFinished, DownloadFailed, DownloadCancelled)):
                self._download_ended(ev)
                return

    def _download_ended(self, ev: DownloadEvent) -> None:
        from core.hub.download import DownloadCancelled, DownloadFailed, DownloadFinished

        name = self.download_name
        self.download_handle = None
        self.download_result = ev
        self.download_name = None
        if isinstance(ev, DownloadFinished):
            if self.last_progress is not None:
                self.bar.update(total=max(self.last_progress.total_bytes, 1), progress=self.last_progress.total_bytes)
            self.progress.update("100%: complete" if not ev.from_cache else "already in the cache")
            self.say(f"{name} is downloaded. Enter: use it.")
        elif isinstance(ev, DownloadFailed):
            self.bar.display = False
            self.progress.display = False
            self.say(f"Download of {name} failed: {failure_text(ev)}", "error")
        elif isinstance(ev, DownloadCancelled):
            kept = self.last_progress.done_bytes if self.last_progress else 0
            self.bar.display = False
            self.progress.display = False
            self.say(f"Download of {name} cancelled; {gb(kept)} kept. d resumes from there.", "warning")
        self.refresh_rows()

    # -- use / load ------------------------------------------------------------------------------
    def action_use(self) -> None:
        row = self.selected
        if row is None:
            return
        if self.pending_load is not None:
            self.say("A pairing is loading; wait for it.", "warning")
            return
        from core.hub.pairing import PairingError

        try:
            spec = self._spec_for(row)
        except (LookupError, PairingError) as e:  # not (completely) in the cache any more
            self.say(str(e), "error")
            return
        except (OSError, RuntimeError) as e:  # the demo could not be built
            self.say(f"Could not prepare {row.key}: {e}", "error")
            return
        if spec is None:
            return
        if row.kind == "pairing" and row.entry.fit.level == "wont_fit":
            from app.tui.screens.confirm import ConfirmScreen

            question = f"{row.key} will probably not fit in this machine's memory. Load it anyway?"
            self.app.push_screen(
                ConfirmScreen(question, detail=row.entry.fit.message, yes="Load anyway", no="Cancel"),
                partial(self._confirmed_load, spec, row.key),
            )
            return
        # the demo is remembered too (default_pairing = "demo"): the next start opens it, no welcome
        self._load(spec, row.key if row.kind in ("pairing", "demo") else None)

    def _confirmed_load(self, spec: PairingSpec, name: str, yes: bool | None) -> None:
        if yes:
            self._load(spec, name)
        else:
            self.say(f"Not loaded: {name} would not fit.")

    def _spec_for(self, row: Row) -> PairingSpec | None:
        from core.engine.pairings import catalogue_spec, demo_spec, snapshot_spec

        if row.kind == "demo":
            current = self.session.spec
            return current if current.demo else demo_spec()
        if row.kind == "other":
            st = row.other.status
            if is_drafter(row.other.model_type):
                self.say("That is a drafter: start with --model TARGET --drafter " + st.repo_id, "warning")
                return None
            if not st.complete or st.snapshot is None:
                self.say(f"{st.repo_id} is only partly downloaded.", "warning")
                return None
            return snapshot_spec(st.repo_id, st.snapshot)
        if row.key == self.download_name:
            self.say(f"{row.key} is still downloading.", "warning")
            return None
        if row.entry.status != "ready":
            self.say(f"{row.key} is not downloaded yet: press d to download it.", "warning")
            return None
        return catalogue_spec(row.key, cache_dir=self.options.cache_dir)

    def _load(self, spec: PairingSpec, catalogue_name: str | None) -> None:
        session = self.session
        current = session.spec
        if (current.target, current.drafter) == (spec.target, spec.drafter) and session.load_error is None:
            spec = current  # already loaded (or loading): wait for it and go back
        elif (refused := session.switch(spec)) is not None:
            self.say(refused, "warning")
            return
        self.pending_load = spec
        self.say(f"Loading {spec.name}… {session.load_stage}".rstrip())
        if catalogue_name and self.options.remember:
            # the app's worker, not this screen's: the screen leaves once the pairing loads, and the write
            # must not depend on how long the screen lives (a worker belongs to the node that started it)
            turn = _REMEMBERED.ask(catalogue_name)
            self.app.run_worker(partial(_remember, self.app, turn), thread=True, group="models-config")
        if session.loaded:  # it was already
            self._loaded(spec)

    # the session's load, as it goes (a load someone else started meanwhile is not ours to report)
    def on_pairing_progress(self, message: PairingProgress) -> None:
        if message.spec is self.pending_load:
            self.say(f"Loading {message.spec.name}… {message.stage}")

    def on_pairing_loaded(self, message: PairingLoaded) -> None:
        if message.spec is self.pending_load:
            self._loaded(message.spec)

    def on_pairing_failed(self, message: PairingFailed) -> None:
        if message.spec is self.pending_load:
            self.pending_load = None
            self.say(f"Could not load {message.spec.name}: {message.error}", "error")

    def _loaded(self, spec: PairingSpec) -> None:
        self.pending_load = None
        self.app.notify(f"Now chatting with {spec.name}")
        self.dismiss()

    # -- remove ----------------------------------------------------------------------------------
    def action_remove(self) -> None:
        row = self.selected
        if row is None:
            return
        if row.kind == "demo":
            self.say("The demo is tiny and ships with gemma-chat; there is nothing to remove.")
            return
        if self.downloading and row.key == self.download_name:
            self.say("Cancel the download first (x).", "warning")
            return
        from core.hub.catalog import removal_plan

        if row.kind == "pairing":
            doomed, kept = removal_plan(row.key, cache_dir=self.options.cache_dir)
        else:
            doomed, kept = [row.other.status.cached_id or row.other.status.repo_id], []
        if not doomed:
            self.say(f"{row.key}: nothing to remove (not in the cache).")
            return
        spec = self.session.spec
        in_use = any(repo_in_path(r, p) for r in doomed for p in (spec.target, spec.drafter or ""))
        if in_use:
            self.say(f"{row.key} is the pairing in use: switch to another one first.", "warning")
            return
        from core.hub import hfcache

        local = hfcache.statuses(doomed, cache_dir=self.options.cache_dir)
        size = sum(s.size_on_disk for s in local.values())
        detail = f"Deletes {', '.join(doomed)} ({gb(size)}) from the Hugging Face cache."
        if kept:
            detail += f" Keeps {kept[0]} (shared with {', '.join(kept[1:])})."
        from app.tui.screens.confirm import ConfirmScreen

        self.app.push_screen(
            ConfirmScreen(f"Remove {row.key}?", detail=detail, yes="Remove"),
            partial(self._confirmed_remove, row.key, doomed),
        )

    def _confirmed_remove(self, name: str, doomed: list[str], yes: bool | None) -> None:
        if yes:
            self.say(f"Removing {name}…")
            self._remove(name, doomed)

    @work(thread=True, group="models-remove")
    def _remove(self, name: str, doomed: list[str]) -> None:
        from core.hub import hfcache

        try:
            freed = hfcache.delete_repos(doomed, cache_dir=self.options.cache_dir)
        except OSError as e:
            self.app.call_from_thread(self.say, f"Could not remove {name}: {e}", "error")
            return
        self.app.call_from_thread(self.say, f"Removed {name}: {gb(freed)} freed.")
        self.app.call_from_thread(self.refresh_rows)

    # -- leaving -----------------------------------------------------------------------------------
    def action_close(self) -> None:
        if self.downloading:
            # Nobody would drain the child once this screen is gone: stop it; d resumes later.
            self.app.notify(
                f"Download of {self.download_name} paused: d on the Models screen resumes it.", severity="warning"
            )
            self._stop_download()
        self.dismiss()

    def on_unmount(self) -> None:
        self.session.unsubscribe(self)
        self._stop_download()

    def _stop_download(self) -> None:
        handle, self.download_handle = self.download_handle, None
        if handle is not None:
            handle.cancel()
            # reap the child off the UI thread
            threading.Thread(target=handle.wait, args=(10,), name="download-reap", daemon=True).start()


def configured_pairing() -> str | None:
    """The config's default_pairing (what a plain `gemma-chat` opens); None when unset or unreadable."""
    from core.user.config import ConfigError, load_config

    try:
        return load_config().default_pairing
    except (ConfigError, OSError):
        return None


def failure_text(ev: DownloadFailed) -> str:
    """The core's message, with what to do for the kinds people hit most."""
    hints = {
        "gated": "",  # the core's message already says: accept the terms, then HF_TOKEN / hf auth login
        "network": " Meanwhile the demo works offline.",  # the core's message says what to check
        "offline": "",
    }
    return ev.message + hints.get(ev.kind, "")


def repo_in_path(repo_id: str, path: str) -> bool:
    """Whether a snapshot path lies in this repo's HF cache folder."""
    folder = "models--" + repo_id.replace("/", "--")
    return any(part.lower() == folder.lower() for part in Path(path).parts)


class ModelsCommands(Provider):
    """Command palette: open the models screen."""

    async def discover(self) -> Hits:
        yield DiscoveryHit("Models", self._open, help="pairings: download, switch, remove")

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for name in ("Models", "Switch model / pairing", "Download a model"):
            score = matcher.match(name)
            if score > 0:
                yield Hit(score, matcher.highlight(name), self._open, help="pairings: download, switch, remove")

    async def _open(self) -> None:
        await self.app.run_action("models")  # GemmaChatApp.action_models


class _LastChoice:
    """The pairing chosen last, for the config writes: two choices in quick succession start two writer
    threads, and each reads the file, changes one key and renames its copy over it, so the older one
    could finish last and leave the wrong default. The writes take turns, and a write whose choice has
    been overtaken writes nothing (the newer write has it, or will)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # held for a moment: the UI thread takes it in `ask`
        self.writing = threading.Lock()  # held for a whole write: the writes' turns
        self.count = 0
        self.name = ""

    def ask(self, name: str) -> int:
        """On the UI thread: `name` is the newest choice; its ticket for `_remember`."""
        with self.lock:
            self.count += 1
            self.name = name
            return self.count


_REMEMBERED = _LastChoice()


def _remember(app: App, ticket: int, choices: _LastChoice = _REMEMBERED) -> None:
    """The next start opens the pairing of `ticket` (config default_pairing), unless a newer choice has
    come since. On a worker thread."""
    from core.user.config import ConfigError, save_config

    with choices.writing:
        with choices.lock:
            if ticket != choices.count:
                return
            name = choices.name
        try:
            save_config({"default_pairing": name})
        except (ConfigError, OSError) as e:
            app.call_from_thread(app.notify, f"Could not save the default pairing: {e}", severity="warning")
