"""Chat history in SQLite (stdlib sqlite3).

Durability: the database runs in WAL mode and every message is written in its own transaction, so a
crash or SIGKILL loses at most the message that was being written (in practice the unfinished reply,
which the app only saves once it is done or stopped). SQLite's WAL recovery discards uncommitted frames
on the next open, so the file is never left corrupt.

synchronous=FULL rather than NORMAL: with WAL, NORMAL already survives a killed *process* (the WAL is
in the OS page cache), but a power cut or kernel panic can roll back the last commits. FULL fsyncs the
WAL at every commit, which costs a millisecond or so per message; a chat commits a few times a
minute, so we pay it and also keep the last turns across power loss.

Threads: one connection guarded by a lock (check_same_thread=False). The app calls the store from a
worker thread; calls are short, so serialising them costs nothing and keeps transactions simple.

Images are stored by path plus sha256 and size, never as blobs: the history stays small, and the
hash lets the UI tell a moved or changed file from the one that was sent.
"""

from __future__ import annotations

import hashlib
import json
import mimetypes
import os
import re
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.limits import AUDIO_SUFFIXES
from core.user import paths

DEFAULT_TITLE = "New chat"
TITLE_MAX_CHARS = 60
ROLES = ("system", "user", "assistant")
# A reply that called tools keeps its calls (OpenAI `tool_calls` items) and their results
# ({tool_call_id, name, content, shown}) in its stats record under these keys: the conversation the
# model saw is rebuilt from them (Chat.engine_messages), exports list them.
TOOL_CALLS, TOOL_RESULTS = "tool_calls", "tool_results"
TOOL_ERRORS = "tool_errors"  # calls the model wrote that could not be decoded: [{"message", "raw"}]
# Each call as the reply showed it while the model wrote it (app.tui.widgets.conversation.CallDraft), so a
# reopened chat draws it again in its tokens' colours: [{"name", "text", "origins", "state", "failed",
# "from_tokens"}], origins as encode_origins() runs over "text".
CALL_DRAFTS = "call_drafts"

# --- schema -------------------------------------------------------------------------------------
# Kept verbatim: a fresh database is built as v1 and migrated up, so the migration path runs on
# every new install, and tests can build a genuine v1 file from it.
SCHEMA_V1 = (
    """CREATE TABLE chats (
        id            INTEGER PRIMARY KEY,
        title         TEXT    NOT NULL,
        created_at    REAL    NOT NULL,
        updated_at    REAL    NOT NULL,
        pairing       TEXT,
        target_id     TEXT,
        drafter_id    TEXT,
        params_json   TEXT    NOT NULL DEFAULT '{}',
        system_prompt TEXT
    )""",
    """CREATE TABLE messages (
        id          INTEGER PRIMARY KEY,
        chat_id     INTEGER NOT NULL REFERENCES chats(id) ON DELETE CASCADE,
        seq         INTEGER NOT NULL,
        role        TEXT    NOT NULL CHECK (role IN ('system', 'user', 'assistant')),
        content     TEXT    NOT NULL,
        thinking    TEXT,
        stats_json  TEXT,
        stopped     INTEGER NOT NULL DEFAULT 0,
        created_at  REAL    NOT NULL,
        UNIQUE (chat_id, seq)
    )""",
    """CREATE TABLE attachments (
        id          INTEGER PRIMARY KEY,
        message_id  INTEGER NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
        path        TEXT    NOT NULL,
        sha256      TEXT    NOT NULL,
        size        INTEGER NOT NULL,
        mime        TEXT
    )""",
    "CREATE INDEX chats_by_updated ON chats(updated_at)",
    "CREATE INDEX attachments_by_message ON attachments(message_id)",
    "PRAGMA user_version = 1",
)

# v2: pinned chats (sorted first in the list) and full-text search over message text.
# The FTS part is applied only where this SQLite has FTS5 (see _ensure_fts); search falls back to LIKE.
SCHEMA_V2 = (
    "ALTER TABLE chats ADD COLUMN pinned INTEGER NOT NULL DEFAULT 0",
    "PRAGMA user_version = 2",
)

FTS_DDL = (
    # External-content table: the text lives once, in messages; the index follows it by triggers.
    """CREATE VIRTUAL TABLE messages_fts USING fts5(
        content, content='messages', content_rowid='id', tokenize='unicode61 remove_diacritics 2'
    )""",
    """CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages BEGIN
        INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
    END""",
    """CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages BEGIN
        INSERT INTO messages_fts(messages_fts, rowid, content) VALUES ('delete', old.id, old.content);
    END""",
    """CREATE TRIGGER messages_fts_update AFTER UPDATE OF content ON messages BEGIN
        INSERT INTO messages_fts(messages_fts, rowid, content) VALUES ('delete', old.id, old.content);
        INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
    END""",
    "INSERT INTO messages_fts(messages_fts) VALUES ('rebuild')",
)

# v3: each reply's per-token origins (drafted + accepted / the target's own), compactly: see encode_origins.
SCHEMA_V3 = (
    "ALTER TABLE messages ADD COLUMN origins TEXT",
    "PRAGMA user_version = 3",
)

MIGRATIONS: dict[int, tuple[str, ...]] = {1: SCHEMA_V1, 2: SCHEMA_V2, 3: SCHEMA_V3}  # target version -> statements
SCHEMA_VERSION = max(MIGRATIONS)


class StoreError(RuntimeError):
    """The history cannot be read or written; the message is one sentence a user can act on."""


def _why(e: BaseException) -> str:
    """sqlite3 / OS errors in words: what is wrong with the history file and what to do."""
    text = str(e)
    low = text.lower()
    if isinstance(e, sqlite3.Error):
        if "locked" in low or "busy" in low:
            return "the chat history is locked by another program (another gemma-chat?); close it and retry"
        if "not a database" in low or "malformed" in low or "corrupt" in low:
            return (
                "the chat history file is damaged; move it aside (gemma-chat then starts a new one) "
                "or repair it with `sqlite3 history.sqlite3 .recover`"
            )
        if "readonly" in low or "read-only" in low:
            return "the chat history is read-only; make the file and its folder writable"
        if "unable to open" in low:
            return "the chat history file cannot be opened; check that its folder exists, is writable and is not a file"
        if "disk" in low and ("full" in low or "i/o" in low):
            return f"the disk holding the chat history failed or is full ({text})"
        return f"the chat history failed: {text}"
    if isinstance(e, OSError):
        return f"{e.strerror or text}" + (f": {e.filename}" if e.filename else "")
    return text


@contextmanager
def _translated(path: Path) -> Iterator[None]:
    """sqlite3.Error and OSError out of the store become one StoreError that names the file."""
    try:
        yield
    except StoreError:
        raise
    except (sqlite3.Error, OSError) as e:
        raise StoreError(f"{path}: {_why(e)}") from e


def _loads(text: str | None, default: Any) -> Any:
    """A JSON column; one damaged row must not make the chat unopenable."""
    if not text:
        return default
    try:
        return json.loads(text)
    except ValueError:
        return default


class ChatNotFound(KeyError):
    pass


# --- records ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Attachment:
    path: str  # absolute path as it was when sent
    sha256: str
    size: int
    mime: str | None = None
    id: int | None = None

    @classmethod
    def from_file(cls, path: str | Path) -> Attachment:
        p = Path(path).expanduser().resolve()
        digest = hashlib.sha256()
        size = 0
        with p.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
                size += len(chunk)
        mime, _ = mimetypes.guess_type(p.name)
        return cls(path=str(p), sha256=digest.hexdigest(), size=size, mime=mime)

    @property
    def kind(self) -> str:
        """ "audio" for an audio clip, else "image" (what the message's engine item is)."""
        if (self.mime or "").startswith("audio/") or Path(self.path).suffix.lower() in AUDIO_SUFFIXES:
            return "audio"
        return "image"

    def status(self) -> str:
        """'ok', 'missing' (file gone) or 'changed' (same path, different bytes)."""
        p = Path(self.path)
        if not p.is_file():
            return "missing"
        if p.stat().st_size != self.size:
            return "changed"
        return "ok" if Attachment.from_file(p).sha256 == self.sha256 else "changed"


@dataclass
class Message:
    id: int
    chat_id: int
    seq: int  # 0, 1, 2 ... within the chat
    role: str  # "system" | "user" | "assistant"
    content: str
    thinking: str | None = None  # shown, saved, never sent back to the model
    stats: dict | None = None  # TurnStats.as_dict() for assistant replies
    stopped: bool = False  # the user stopped this reply; content is the partial text
    created_at: float = 0.0
    attachments: list[Attachment] = field(default_factory=list)
    origins: str | None = None  # where each token of a reply came from (encode_origins); None: not recorded


@dataclass
class ChatSummary:
    id: int
    title: str
    created_at: float
    updated_at: float
    pairing: str | None
    pinned: bool
    message_count: int


@dataclass
class Chat:
    id: int
    title: str
    created_at: float
    updated_at: float
    pairing: str | None = None
    target_id: str | None = None
    drafter_id: str | None = None
    params: dict = field(default_factory=dict)  # e.g. GenerationSettings fields the chat was run with
    system_prompt: str | None = None
    pinned: bool = False
    messages: list[Message] = field(default_factory=list)

    def engine_messages(self) -> list[dict]:
        """The conversation in Engine.chat's format. Thinking is left out on purpose: the model must
        not see its own earlier reasoning. A stopped reply goes in as the partial text the user saw."""
        out: list[dict] = []
        if self.system_prompt:
            out.append({"role": "system", "content": self.system_prompt})
        for m in self.messages:
            if m.attachments:
                parts: list[dict] = [{"type": a.kind, "path": a.path} for a in m.attachments]
                parts.append({"type": "text", "text": m.content})
                out.append({"role": m.role, "content": parts})
            elif m.role == "assistant" and tool_calls_of(m):
                out += tool_messages(m)
            else:
                out.append({"role": m.role, "content": m.content})
        return out


def tool_calls_of(m: Message) -> list[dict]:
    calls = (m.stats or {}).get(TOOL_CALLS)
    return [c for c in calls if isinstance(c, dict)] if isinstance(calls, list) else []


def tool_messages(m: Message) -> list[dict]:
    """A reply that called tools as the engine takes it: its text (a message of its own: the template
    puts a message's content after its calls), its calls, then one `role: "tool"` message per result."""
    out: list[dict] = []
    if m.content.strip():
        out.append({"role": "assistant", "content": m.content})
    out.append({"role": "assistant", "content": None, "tool_calls": tool_calls_of(m)})
    for r in (m.stats or {}).get(TOOL_RESULTS) or ():
        if isinstance(r, dict):
            result = {"role": "tool", "tool_call_id": r.get("tool_call_id"), "content": str(r.get("content", ""))}
            if isinstance(r.get("name"), str):
                result["name"] = r["name"]
            out.append(result)
    return out


@dataclass
class SearchHit:
    chat: ChatSummary
    snippet: str  # a short piece of the matching text, the match wrapped in [ ]
    message_seq: int | None  # the matching message, None when only the title matched


# --- helpers ------------------------------------------------------------------------------------
_UNSET: Any = object()

# Per-token origins, as runs over the reply's characters: "d" drafted by the drafter and accepted by the
# target, "t" the target's own token, "u" unattributed (text no single token produced, such as the bytes
# of a character a detokenizer held back). Adjacent tokens of one origin share a run, so a reply of a
# thousand tokens is typically a few hundred bytes: "t1d12t4d7t3".
ORIGIN_KINDS = "dtu"
_ORIGIN_RUN = re.compile(r"([dtu])(\d+)")


def encode_origins(runs: Sequence[tuple[str, int]]) -> str:
    """[("t", 1), ("d", 12), ...] (origin, characters) as "t1d12..."; empty runs dropped, neighbours merged."""
    merged: list[list] = []
    for kind, n in runs:
        if kind not in ORIGIN_KINDS:
            raise ValueError(f"origin must be one of {ORIGIN_KINDS!r}, got {kind!r}")
        if n <= 0:
            continue
        if merged and merged[-1][0] == kind:
            merged[-1][1] += n
        else:
            merged.append([kind, n])
    return "".join(f"{k}{n}" for k, n in merged)


def decode_origins(encoded: str | None, length: int | None = None) -> list[tuple[str, int]] | None:
    """The runs of `encode_origins`; None when missing or malformed, or when `length` is given and
    the runs do not cover exactly that many characters (the text and its origins disagree)."""
    if not encoded:
        return None
    runs = [(m.group(1), int(m.group(2))) for m in _ORIGIN_RUN.finditer(encoded)]
    if "".join(f"{k}{n}" for k, n in runs) != encoded:
        return None
    if length is not None and sum(n for _, n in runs) != length:
        return None
    return runs


def _stats_to_dict(stats: Any) -> dict | None:
    if stats is None:
        return None
    if hasattr(stats, "as_dict"):
        stats = stats.as_dict()
    return {str(k): v for k, v in dict(stats).items()}


def _row_id(cur: sqlite3.Cursor) -> int:
    """The id of the row an INSERT just made."""
    assert cur.lastrowid is not None, "not after an INSERT"
    return cur.lastrowid


def _json_dumps(value: Any) -> str:
    # block_size_counts has int keys: JSON turns them into strings, which is fine for display.
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)


def title_from_text(text: str) -> str:
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    if not line:
        return DEFAULT_TITLE
    return line if len(line) <= TITLE_MAX_CHARS else line[: TITLE_MAX_CHARS - 1].rstrip() + "…"


def fts5_available() -> bool:
    try:
        con = sqlite3.connect(":memory:")
        try:
            con.execute("CREATE VIRTUAL TABLE t USING fts5(x)")
        finally:
            con.close()
        return True
    except sqlite3.OperationalError:
        return False


def _fts_query(text: str) -> str:
    # Each word becomes a quoted prefix term, so user input can never be FTS5 syntax.
    terms = ['"' + w.replace('"', '""') + '"*' for w in text.split()]
    return " ".join(terms)


def _like_pattern(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def _like_snippet(content: str, needle: str, width: int = 40) -> str:
    i = content.lower().find(needle.lower())
    if i < 0:
        return content[: 2 * width]
    start, end = max(0, i - width), min(len(content), i + len(needle) + width)
    return (
        ("…" if start else "")
        + content[start:i]
        + "["
        + content[i : i + len(needle)]
        + "]"
        + content[i + len(needle) : end]
        + ("…" if end < len(content) else "")
    )


def _private_dir(path: Path) -> None:
    """The history's folder: created 0700; an existing one is left as the user set it."""
    if path.exists() and not path.is_dir():
        raise StoreError(f"{path}: the chat history's folder is a file; move it aside or set GEMMA_CHAT_DATA_DIR")
    if not path.is_dir():
        path.mkdir(mode=0o700, parents=True, exist_ok=True)


def _private_file(path: Path) -> None:
    """history.sqlite3 (and its WAL files) readable by the user only."""
    for p in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        try:
            if p.exists() and p.stat().st_mode & 0o077:
                os.chmod(p, 0o600)
        except OSError:
            pass  # not ours to change (a shared file): it still works


# --- the store ----------------------------------------------------------------------------------
class Store:
    """Conversation history. Every public method is thread-safe and commits before it returns."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else paths.history_db()
        self._lock = threading.RLock()
        self.has_fts = fts5_available()
        with _translated(self.path):
            if str(self.path) != ":memory:":
                _private_dir(self.path.parent)
                if self.path.is_dir():
                    raise StoreError(f"{self.path}: the chat history path is a directory, not a file")
                # the history is the user's conversations: readable by the user only
                if not self.path.exists():
                    os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600))
            # isolation_level=None: we issue BEGIN/COMMIT ourselves, so a transaction is exactly one `_tx`.
            self._con = sqlite3.connect(
                str(self.path), isolation_level=None, check_same_thread=False, timeout=self.busy_timeout_s
            )
            self._con.row_factory = sqlite3.Row
            try:
                self._con.execute("PRAGMA journal_mode = WAL")
                self._con.execute("PRAGMA synchronous = FULL")
                self._con.execute("PRAGMA foreign_keys = ON")
                self._migrate()
                if str(self.path) != ":memory:":
                    _private_file(self.path)
            except BaseException:
                self._con.close()
                raise

    busy_timeout_s = 10.0  # how long a write waits for another process's lock before it is an error

    # lifecycle
    def close(self) -> None:
        with self._lock:
            self._con.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock, _translated(self.path):
            self._con.execute("BEGIN IMMEDIATE")
            try:
                yield self._con
            except BaseException:
                try:
                    self._con.execute("ROLLBACK")
                except sqlite3.Error:
                    pass  # the failure already ended the transaction
                raise
            self._con.execute("COMMIT")

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        with self._lock, _translated(self.path):
            yield self._con

    # schema
    def schema_version(self) -> int:
        with self._read() as con:
            return con.execute("PRAGMA user_version").fetchone()[0]

    def integrity_check(self) -> str:
        with self._read() as con:
            return con.execute("PRAGMA integrity_check").fetchone()[0]

    def _migrate(self) -> None:
        # The version is read inside each write transaction, so two processes opening an old file
        # at once cannot both apply the same step.
        while True:
            with self._tx() as con:
                version = con.execute("PRAGMA user_version").fetchone()[0]
                if version > SCHEMA_VERSION:
                    raise StoreError(
                        f"{self.path}: history schema v{version} is newer than this gemma-chat understands "
                        f"(v{SCHEMA_VERSION}); upgrade gemma-chat"
                    )
                if version == SCHEMA_VERSION:
                    break
                for stmt in MIGRATIONS[version + 1]:
                    con.execute(stmt)
        self._ensure_fts()

    def _ensure_fts(self) -> None:
        # Idempotent, outside the numbered migrations: a database made where FTS5 was missing gets its
        # index the first time it is opened by a build that has it.
        if not self.has_fts:
            return
        with self._tx() as con:
            exists = con.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'messages_fts'"
            ).fetchone()
            if not exists:
                for stmt in FTS_DDL:
                    con.execute(stmt)

    # chats
    def create_chat(
        self,
        title: str | None = None,
        *,
        pairing: str | None = None,
        target_id: str | None = None,
        drafter_id: str | None = None,
        params: Mapping[str, Any] | None = None,
        system_prompt: str | None = None,
    ) -> int:
        """A new, empty chat; returns its id. Without a title, the first user message names it."""
        now = time.time()
        with self._tx() as con:
            cur = con.execute(
                "INSERT INTO chats (title, created_at, updated_at, pairing, target_id, drafter_id, params_json,"
                " system_prompt) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    title or DEFAULT_TITLE,
                    now,
                    now,
                    pairing,
                    target_id,
                    drafter_id,
                    _json_dumps(dict(params or {})),
                    system_prompt,
                ),
            )
            return _row_id(cur)

    def rename_chat(self, chat_id: int, title: str) -> None:
        title = title.strip()
        if not title:
            raise ValueError("a chat title cannot be empty")
        with self._tx() as con:
            self._require_chat(con, chat_id)
            con.execute("UPDATE chats SET title = ?, updated_at = ? WHERE id = ?", (title, time.time(), chat_id))

    def set_pinned(self, chat_id: int, pinned: bool) -> None:
        with self._tx() as con:
            self._require_chat(con, chat_id)
            con.execute("UPDATE chats SET pinned = ? WHERE id = ?", (int(pinned), chat_id))

    def update_chat(
        self,
        chat_id: int,
        *,
        pairing: str | None = _UNSET,
        target_id: str | None = _UNSET,
        drafter_id: str | None = _UNSET,
        params: Mapping[str, Any] = _UNSET,
        system_prompt: str | None = _UNSET,
    ) -> None:
        """Change the chat's pairing / parameters / system prompt; arguments left out stay as they are.
        `params` replaces the stored dict (merge on the caller's side if you mean to)."""
        sets: list[str] = []
        values: list[Any] = []
        for column, value in (
            ("pairing", pairing),
            ("target_id", target_id),
            ("drafter_id", drafter_id),
            ("system_prompt", system_prompt),
        ):
            if value is not _UNSET:
                sets.append(f"{column} = ?")
                values.append(value)
        if params is not _UNSET:
            sets.append("params_json = ?")
            values.append(_json_dumps(dict(params)))
        if not sets:
            return
        sets.append("updated_at = ?")
        values.append(time.time())
        with self._tx() as con:
            self._require_chat(con, chat_id)
            con.execute(f"UPDATE chats SET {', '.join(sets)} WHERE id = ?", (*values, chat_id))

    def delete_chat(self, chat_id: int) -> None:
        with self._tx() as con:
            self._require_chat(con, chat_id)
            con.execute("DELETE FROM chats WHERE id = ?", (chat_id,))  # messages, attachments cascade

    _SUMMARY_SQL = (
        "SELECT c.id, c.title, c.created_at, c.updated_at, c.pairing, c.pinned,"
        " (SELECT COUNT(*) FROM messages m WHERE m.chat_id = c.id) AS message_count FROM chats c"
    )

    @staticmethod
    def _summary(row: sqlite3.Row) -> ChatSummary:
        return ChatSummary(
            id=row["id"],
            title=row["title"],
            created_at=row["created_at"],
            updated_at=row["updated_at"],
            pairing=row["pairing"],
            pinned=bool(row["pinned"]),
            message_count=row["message_count"],
        )

    def list_chats(self, limit: int | None = None) -> list[ChatSummary]:
        """Pinned chats first, then most recently updated first."""
        sql = self._SUMMARY_SQL + " ORDER BY c.pinned DESC, c.updated_at DESC, c.id DESC"
        args: tuple = ()
        if limit is not None:
            sql += " LIMIT ?"
            args = (limit,)
        with self._read() as con:
            return [self._summary(r) for r in con.execute(sql, args)]

    def get_chat_summary(self, chat_id: int) -> ChatSummary:
        with self._read() as con:
            row = con.execute(self._SUMMARY_SQL + " WHERE c.id = ?", (chat_id,)).fetchone()
        if row is None:
            raise ChatNotFound(chat_id)
        return self._summary(row)

    def search_chats(self, query: str, limit: int = 50) -> list[SearchHit]:
        """Chats whose title contains `query`, or with a message that matches it: with FTS5 every word
        as a word prefix (any order), without FTS5 the whole query as a substring. Title hits first,
        then message hits best first; one hit per chat."""
        query = query.strip()
        if not query:
            return []
        hits: dict[int, SearchHit] = {}
        with self._read():
            # FTS5 indexes words only: punctuation-only queries ("%", "->") go to the LIKE scan
            if self.has_fts and any(ch.isalnum() for ch in query):
                rows = self._con.execute(
                    "SELECT m.chat_id, m.seq,"
                    " snippet(messages_fts, 0, '[', ']', '…', 10) AS snip"
                    " FROM messages_fts JOIN messages m ON m.id = messages_fts.rowid"
                    " WHERE messages_fts MATCH ? ORDER BY bm25(messages_fts) LIMIT ?",
                    (_fts_query(query), limit * 20),
                ).fetchall()
                matches = [(r["chat_id"], r["seq"], r["snip"]) for r in rows]
            else:
                rows = self._con.execute(
                    "SELECT chat_id, seq, content FROM messages WHERE content LIKE ? ESCAPE '\\'"
                    " ORDER BY chat_id DESC, seq LIMIT ?",
                    (_like_pattern(query), limit * 20),
                ).fetchall()
                matches = [(r["chat_id"], r["seq"], _like_snippet(r["content"], query)) for r in rows]
            title_rows = self._con.execute(
                self._SUMMARY_SQL + " WHERE c.title LIKE ? ESCAPE '\\' ORDER BY c.updated_at DESC LIMIT ?",
                (_like_pattern(query), limit),
            ).fetchall()
            for row in title_rows:
                hits[row["id"]] = SearchHit(self._summary(row), _like_snippet(row["title"], query), None)
            for chat_id, seq, snip in matches:
                if len(hits) >= limit:
                    break
                if chat_id not in hits:
                    row = self._con.execute(self._SUMMARY_SQL + " WHERE c.id = ?", (chat_id,)).fetchone()
                    hits[chat_id] = SearchHit(self._summary(row), snip, seq)
        return list(hits.values())[:limit]

    def recent_user_messages(self, limit: int = 1000) -> list[str]:
        """The user's messages of every chat, newest first, each text once (a shell-like input history)."""
        with self._read() as con:
            rows = con.execute(
                "SELECT content FROM messages WHERE role = 'user' AND content != ''"
                " GROUP BY content ORDER BY MAX(created_at) DESC, MAX(id) DESC LIMIT ?",
                (limit,),
            ).fetchall()
        return [r["content"] for r in rows]

    def load_chat(self, chat_id: int) -> Chat:
        with self._read():
            row = self._con.execute("SELECT * FROM chats WHERE id = ?", (chat_id,)).fetchone()
            if row is None:
                raise ChatNotFound(chat_id)
            msg_rows = self._con.execute("SELECT * FROM messages WHERE chat_id = ? ORDER BY seq", (chat_id,)).fetchall()
            att_rows = self._con.execute(
                "SELECT a.* FROM attachments a JOIN messages m ON m.id = a.message_id"
                " WHERE m.chat_id = ? ORDER BY a.id",
                (chat_id,),
            ).fetchall()
        by_message: dict[int, list[Attachment]] = {}
        for a in att_rows:
            by_message.setdefault(a["message_id"], []).append(
                Attachment(path=a["path"], sha256=a["sha256"], size=a["size"], mime=a["mime"], id=a["id"])
            )
        messages = [
            Message(
                id=m["id"],
                chat_id=chat_id,
                seq=m["seq"],
                role=m["role"],
                content=m["content"],
                thinking=m["thinking"],
                stats=_loads(m["stats_json"], None),
                stopped=bool(m["stopped"]),
                created_at=m["created_at"],
                attachments=by_message.get(m["id"], []),
                origins=m["origins"],
            )
            for m in msg_rows
        ]
        return Chat(
            id=row["id"],
            title=row["title"],
            created_at=row["created_at"],
            updated_at=row["updated_at"],
            pairing=row["pairing"],
            target_id=row["target_id"],
            drafter_id=row["drafter_id"],
            params=_loads(row["params_json"], {}),
            system_prompt=row["system_prompt"],
            pinned=bool(row["pinned"]),
            messages=messages,
        )

    # messages
    def append_message(
        self,
        chat_id: int,
        role: str,
        content: str,
        *,
        thinking: str | None = None,
        stats: Any = None,
        stopped: bool = False,
        attachments: Sequence[str | Path | Attachment] = (),
        origins: str | None = None,
    ) -> Message:
        """Append one message (and its attachments) in one transaction. Attachments given as paths
        are hashed now (before the transaction, so a slow disk never holds the write lock)."""
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {role!r}")
        if origins is not None and decode_origins(origins, len(content)) is None:
            raise ValueError("origins must be encode_origins() runs covering the content exactly")
        with _translated(self.path):
            atts = [a if isinstance(a, Attachment) else Attachment.from_file(a) for a in attachments]
        stats_dict = _stats_to_dict(stats)
        now = time.time()
        with self._tx() as con:
            chat = self._require_chat(con, chat_id)
            seq = con.execute(
                "SELECT COALESCE(MAX(seq) + 1, 0) FROM messages WHERE chat_id = ?", (chat_id,)
            ).fetchone()[0]
            cur = con.execute(
                "INSERT INTO messages (chat_id, seq, role, content, thinking, stats_json, stopped, created_at,"
                " origins) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    chat_id,
                    seq,
                    role,
                    content,
                    thinking,
                    _json_dumps(stats_dict) if stats_dict is not None else None,
                    int(stopped),
                    now,
                    origins,
                ),
            )
            message_id = _row_id(cur)
            saved: list[Attachment] = []
            for a in atts:
                acur = con.execute(
                    "INSERT INTO attachments (message_id, path, sha256, size, mime) VALUES (?, ?, ?, ?, ?)",
                    (message_id, a.path, a.sha256, a.size, a.mime),
                )
                saved.append(Attachment(a.path, a.sha256, a.size, a.mime, _row_id(acur)))
            if role == "user" and chat["title"] == DEFAULT_TITLE:
                con.execute("UPDATE chats SET title = ? WHERE id = ?", (title_from_text(content), chat_id))
            con.execute("UPDATE chats SET updated_at = ? WHERE id = ?", (now, chat_id))
        return Message(message_id, chat_id, seq, role, content, thinking, stats_dict, stopped, now, saved, origins)

    def append_user_message(
        self, chat_id: int, content: str, attachments: Sequence[str | Path | Attachment] = ()
    ) -> Message:
        return self.append_message(chat_id, "user", content, attachments=attachments)

    def append_assistant_message(
        self,
        chat_id: int,
        content: str,
        *,
        thinking: str | None = None,
        stats: Any = None,
        stopped: bool = False,
        origins: str | None = None,
    ) -> Message:
        """A finished reply (stopped=False) or one the user stopped (stopped=True, partial text).
        `stats` is a TurnStats, or any mapping (stored as JSON); `origins`: encode_origins() runs."""
        return self.append_message(
            chat_id, "assistant", content, thinking=thinking, stats=stats, stopped=stopped, origins=origins
        )

    def truncate_chat(self, chat_id: int, from_seq: int) -> int:
        """Delete messages with seq >= from_seq (regenerate, edit-and-resend); returns how many."""
        with self._tx() as con:
            self._require_chat(con, chat_id)
            cur = con.execute("DELETE FROM messages WHERE chat_id = ? AND seq >= ?", (chat_id, from_seq))
            con.execute("UPDATE chats SET updated_at = ? WHERE id = ?", (time.time(), chat_id))
            return cur.rowcount

    @staticmethod
    def _require_chat(con: sqlite3.Connection, chat_id: int) -> sqlite3.Row:
        row = con.execute("SELECT id, title FROM chats WHERE id = ?", (chat_id,)).fetchone()
        if row is None:
            raise ChatNotFound(chat_id)
        return row
