"""Chat history: persistence, crash safety, migration, search."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from core.events import TurnStats
from core.user import paths
from core.user.store import (
    DEFAULT_TITLE,
    SCHEMA_V1,
    SCHEMA_VERSION,
    Attachment,
    ChatNotFound,
    Store,
    StoreError,
    fts5_available,
)


@pytest.fixture(autouse=True)
def _private_dirs(tmp_path, monkeypatch):
    monkeypatch.setenv(paths.DATA_DIR_ENV, str(tmp_path / "data"))
    monkeypatch.setenv(paths.CACHE_DIR_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv(paths.CONFIG_ENV, str(tmp_path / "config" / "config.toml"))


@pytest.fixture
def image(tmp_path) -> Path:
    p = tmp_path / "cat.png"
    p.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4)
    return p


def test_default_location_follows_env(tmp_path):
    with Store() as store:
        assert store.path == tmp_path / "data" / "history.sqlite3"
    assert store.path.is_file()


def test_history_survives_reopen(tmp_path, image):
    db = tmp_path / "h.db"
    with Store(db) as store:
        cid = store.create_chat(
            pairing="E2B",
            target_id="google/gemma-4-E2B-it",
            drafter_id="google/d",
            params={"temperature": 0.7, "block_size": "auto"},
            system_prompt="Be brief.",
        )
        store.append_user_message(cid, "What is in this picture?\nPlease be precise.", attachments=[image])
        stats = TurnStats(
            decode_tokens=12,
            decode_s=0.5,
            rounds=4,
            drafted=9,
            accepted=6,
            stop_reason="eos",
            block_size_counts={4: 3, 3: 1},
        )
        store.append_assistant_message(cid, "A cat.", thinking="Looks like fur.", stats=stats)
        store.append_user_message(cid, "Longer please")
        store.append_assistant_message(cid, "A small grey", stopped=True)
    with Store(db) as store:
        chat = store.load_chat(cid)
    assert chat.title == "What is in this picture?"  # named from the first line of the first message
    assert (chat.pairing, chat.target_id, chat.drafter_id) == ("E2B", "google/gemma-4-E2B-it", "google/d")
    assert chat.params == {"temperature": 0.7, "block_size": "auto"}
    assert chat.system_prompt == "Be brief."
    assert [(m.seq, m.role, m.content, m.stopped) for m in chat.messages] == [
        (0, "user", "What is in this picture?\nPlease be precise.", False),
        (1, "assistant", "A cat.", False),
        (2, "user", "Longer please", False),
        (3, "assistant", "A small grey", True),
    ]
    (att,) = chat.messages[0].attachments
    assert att.path == str(image.resolve()) and att.size == image.stat().st_size and att.mime == "image/png"
    assert att.sha256 == Attachment.from_file(image).sha256 and att.status() == "ok"
    reply = chat.messages[1]
    assert reply.thinking == "Looks like fur."
    assert reply.stats["decode_tokens"] == 12 and reply.stats["acceptance"] == pytest.approx(6 / 9)
    assert reply.stats["block_size_counts"] == {"4": 3, "3": 1}


def test_engine_messages_drop_thinking_and_carry_images(tmp_path, image):
    with Store(tmp_path / "h.db") as store:
        cid = store.create_chat("t", system_prompt="sys")
        store.append_user_message(cid, "look", attachments=[image])
        store.append_assistant_message(cid, "ok", thinking="SECRET REASONING")
        msgs = store.load_chat(cid).engine_messages()
    assert msgs == [
        {"role": "system", "content": "sys"},
        {
            "role": "user",
            "content": [{"type": "image", "path": str(image.resolve())}, {"type": "text", "text": "look"}],
        },
        {"role": "assistant", "content": "ok"},
    ]
    assert "SECRET" not in json.dumps(msgs)


def test_attachment_status_notices_changes(tmp_path, image):
    att = Attachment.from_file(image)
    image.write_bytes(image.read_bytes()[:-1] + b"\x00")
    assert att.status() == "changed"
    image.unlink()
    assert att.status() == "missing"


def test_chat_crud_and_order(tmp_path):
    with Store(tmp_path / "h.db") as store:
        a = store.create_chat("alpha")
        b = store.create_chat("beta")
        c = store.create_chat()
        assert store.get_chat_summary(c).title == DEFAULT_TITLE
        store.append_user_message(a, "bump alpha")  # alpha becomes the most recent
        assert store.get_chat_summary(a).title == "alpha"  # an explicit title is never overwritten
        assert [s.title for s in store.list_chats()] == ["alpha", DEFAULT_TITLE, "beta"]
        store.set_pinned(b, True)
        assert [s.id for s in store.list_chats()] == [b, a, c]
        assert [s.id for s in store.list_chats(limit=1)] == [b]
        store.rename_chat(c, "  gamma ")
        assert store.get_chat_summary(c).title == "gamma"
        with pytest.raises(ValueError):
            store.rename_chat(c, "   ")
        store.update_chat(a, params={"temperature": 1.0}, system_prompt=None)
        store.update_chat(a, pairing="26B")
        chat = store.load_chat(a)
        assert chat.params == {"temperature": 1.0} and chat.pairing == "26B" and chat.system_prompt is None
        assert store.get_chat_summary(a).message_count == 1
        store.delete_chat(a)
        assert a not in [s.id for s in store.list_chats()]
        assert store._con.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 0  # cascaded
        for call in (
            lambda: store.load_chat(a),
            lambda: store.rename_chat(a, "x"),
            lambda: store.append_user_message(a, "x"),
            lambda: store.delete_chat(a),
        ):
            with pytest.raises(ChatNotFound):
                call()
        with pytest.raises(ValueError):
            store.append_message(b, "tool", "x")


def test_truncate_for_regenerate(tmp_path):
    with Store(tmp_path / "h.db") as store:
        cid = store.create_chat("t")
        for i in range(3):
            store.append_user_message(cid, f"q{i}")
            store.append_assistant_message(cid, f"a{i}")
        assert store.truncate_chat(cid, 5) == 1
        assert store.append_assistant_message(cid, "a2 again").seq == 5
        assert [m.content for m in store.load_chat(cid).messages][-2:] == ["q2", "a2 again"]


def test_search(tmp_path):
    with Store(tmp_path / "h.db") as store:
        zebra = store.create_chat("Animals")
        store.append_user_message(zebra, "Tell me about zebras")
        store.append_assistant_message(zebra, "Zebras have black and white stripes; 100% of them.")
        code = store.create_chat("Python help")
        store.append_user_message(code, "How do I reverse a list?")
        store.append_assistant_message(code, "Use reversed() or slicing: xs[::-1]")
        assert [h.chat.id for h in store.search_chats("stripes")] == [zebra]
        assert [h.chat.id for h in store.search_chats("python")] == [code]  # title match
        assert store.search_chats("python")[0].message_seq is None
        hit = store.search_chats("reverse list")[0]  # words in any order, prefixes
        assert hit.chat.id == code and hit.message_seq == 0 and "[" in hit.snippet
        assert store.search_chats("giraffe") == []
        assert store.search_chats('"unbalanced AND (') == []  # never FTS syntax, never an error
        assert store.search_chats("   ") == []
        assert [h.chat.id for h in store.search_chats("100%")] == [zebra]
        assert [h.chat.id for h in store.search_chats("[::")] == [code]  # punctuation only: substring scan
        assert store.search_chats("*") == []
        store.delete_chat(zebra)
        assert store.search_chats("stripes") == []
        if store.has_fts:  # the external-content index followed the cascade delete
            store._con.execute("INSERT INTO messages_fts(messages_fts) VALUES ('integrity-check')")


def test_search_without_fts(tmp_path, monkeypatch):
    monkeypatch.setattr("core.user.store.fts5_available", lambda: False)
    with Store(tmp_path / "h.db") as store:
        assert not store.has_fts
        cid = store.create_chat("t")
        store.append_assistant_message(cid, "Zebras have stripes")
        assert [h.snippet for h in store.search_chats("have str")] == ["Zebras [have str]ipes"]


def test_fts5_is_available_here():
    # The fallback exists for odd builds; the interpreters we ship on have FTS5.
    assert fts5_available()


def _make_v1(db: Path) -> None:
    con = sqlite3.connect(db, isolation_level=None)
    for stmt in SCHEMA_V1:
        con.execute(stmt)
    con.execute("INSERT INTO chats (title, created_at, updated_at, params_json) VALUES ('old', 1, 2, '{\"top_k\": 5}')")
    con.execute(
        "INSERT INTO messages (chat_id, seq, role, content, created_at) VALUES (1, 0, 'user', 'hello zebra', 1)"
    )
    con.execute(
        "INSERT INTO messages (chat_id, seq, role, content, thinking, stopped, created_at)"
        " VALUES (1, 1, 'assistant', 'hi there', 'thought', 1, 2)"
    )
    con.execute(
        "INSERT INTO attachments (message_id, path, sha256, size, mime) VALUES (1, '/x.png', 'ab', 3, 'image/png')"
    )
    con.close()


def test_migrates_v1_database(tmp_path):
    db = tmp_path / "old.db"
    _make_v1(db)
    assert sqlite3.connect(db).execute("PRAGMA user_version").fetchone()[0] == 1
    with Store(db) as store:
        assert store.schema_version() == SCHEMA_VERSION == 3
        chat = store.load_chat(1)
        assert chat.title == "old" and chat.params == {"top_k": 5} and not chat.pinned
        assert [(m.content, m.thinking, m.stopped) for m in chat.messages] == [
            ("hello zebra", None, False),
            ("hi there", "thought", True),
        ]
        assert [m.origins for m in chat.messages] == [None, None]  # replies saved before v3: no origins
        assert chat.messages[0].attachments == [Attachment("/x.png", "ab", 3, "image/png", id=1)]
        assert [h.chat.id for h in store.search_chats("zebra")] == [1]  # old rows were indexed
        store.set_pinned(1, True)
        assert store.list_chats()[0].pinned
        assert store.integrity_check() == "ok"


def test_fresh_database_matches_migrated_schema(tmp_path):
    def schema(db):
        con = sqlite3.connect(db)
        return sorted(con.execute("SELECT type, name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'"))

    _make_v1(tmp_path / "old.db")
    Store(tmp_path / "old.db").close()
    Store(tmp_path / "new.db").close()
    assert schema(tmp_path / "old.db") == schema(tmp_path / "new.db")


def test_refuses_newer_schema(tmp_path):
    db = tmp_path / "future.db"
    Store(db).close()
    sqlite3.connect(db, isolation_level=None).execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(StoreError, match="newer"):
        Store(db)


def test_failed_migration_rolls_back(tmp_path, monkeypatch):
    db = tmp_path / "old.db"
    _make_v1(db)
    monkeypatch.setitem(
        __import__("core.user.store").user.store.MIGRATIONS,
        2,
        ("ALTER TABLE chats ADD COLUMN pinned INTEGER NOT NULL DEFAULT 0", "THIS IS NOT SQL"),
    )
    with pytest.raises(StoreError, match="syntax error"):
        Store(db)
    con = sqlite3.connect(db)
    assert con.execute("PRAGMA user_version").fetchone()[0] == 1
    assert "pinned" not in [r[1] for r in con.execute("PRAGMA table_info(chats)")]


def test_threads_share_one_store(tmp_path):
    with Store(tmp_path / "h.db") as store:
        ids = [store.create_chat(f"c{i}") for i in range(4)]
        errors: list[BaseException] = []

        def work(cid):
            try:
                for i in range(25):
                    store.append_user_message(cid, f"m{i}")
                    store.list_chats()
            except BaseException as e:  # pragma: no cover - reported below
                errors.append(e)

        threads = [threading.Thread(target=work, args=(cid,)) for cid in ids]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        for cid in ids:
            assert [m.seq for m in store.load_chat(cid).messages] == list(range(25))


# --- crash safety -------------------------------------------------------------------------------
# The child writes three complete turns through the Store, then simulates a reply being written when
# the process dies: a second connection opens a write transaction, inserts the reply and keeps
# writing megabytes (a tiny page cache forces uncommitted pages out into the WAL) until SIGKILL.
_CHILD = textwrap.dedent(
    """
    import sqlite3, sys, time
    from core.user.store import Store
    db = sys.argv[1]
    store = Store(db)
    cid = store.create_chat("crash")
    for i in range(3):
        store.append_user_message(cid, f"question {i}")
        store.append_assistant_message(cid, f"answer {i}", stats={"decode_tokens": i})
    store.append_user_message(cid, "question 3")
    import os
    print(os.path.getsize(db + "-wal"), flush=True)
    con = sqlite3.connect(db, isolation_level=None)
    con.execute("PRAGMA cache_size = -64")
    con.execute("BEGIN IMMEDIATE")
    con.execute("INSERT INTO messages (chat_id, seq, role, content, created_at)"
                " VALUES (?, 7, 'assistant', 'partial', 0)", (cid,))
    print("IN_TRANSACTION", flush=True)
    i = 0
    while True:
        con.execute("UPDATE messages SET content = ? WHERE seq = 7 AND chat_id = ?", ("x" * 200_000 + str(i), cid))
        con.execute("INSERT INTO chats (title, created_at, updated_at) VALUES (?, 0, 0)", ("junk" * 1000,))
        i += 1
        if i == 20:
            print("SPILLED", flush=True)
    """
)


def test_sigkill_mid_reply_keeps_completed_turns(tmp_path):
    db = tmp_path / "crash.db"
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(db)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        committed_wal_size = int(proc.stdout.readline())
        assert proc.stdout.readline().strip() == "IN_TRANSACTION"
        assert proc.stdout.readline().strip() == "SPILLED"
        # uncommitted frames (a 200 kB row, rewritten) really are in the WAL when the kill lands
        assert Path(str(db) + "-wal").stat().st_size > committed_wal_size + 200_000
        time.sleep(0.05)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    with Store(db) as store:
        assert store.integrity_check() == "ok"
        (summary,) = store.list_chats()
        chat = store.load_chat(summary.id)
        assert [m.content for m in chat.messages] == [
            "question 0",
            "answer 0",
            "question 1",
            "answer 1",
            "question 2",
            "answer 2",
            "question 3",
        ]
        assert chat.messages[5].stats == {"decode_tokens": 2}
        # and the store is writable again: the next reply goes where the lost one would have
        assert store.append_assistant_message(chat.id, "answer 3").seq == 7


_LOOP_CHILD = textwrap.dedent(
    """
    import sys
    from core.user.store import Store
    store = Store(sys.argv[1])
    cid = store.create_chat("loop")
    i = 0
    while True:
        store.append_user_message(cid, f"q{i} " + "u" * 5000)
        store.append_assistant_message(cid, f"a{i} " + "a" * 20000, thinking="t" * 3000, stats={"i": i})
        i += 1
        if i == 3:
            print("THREE", flush=True)
    """
)


def test_sigkill_while_appending_turns(tmp_path):
    db = tmp_path / "loop.db"
    proc = subprocess.Popen(
        [sys.executable, "-c", _LOOP_CHILD, str(db)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        assert proc.stdout.readline().strip() == "THREE"
        time.sleep(0.3)  # mid-stream of further turns
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        proc.stdout.close()
    with Store(db) as store:
        assert store.integrity_check() == "ok"
        chat = store.load_chat(store.list_chats()[0].id)
    n = len(chat.messages)
    assert n >= 6
    for m in chat.messages:  # every message present is whole; the last may be a user turn awaiting its reply
        i = m.seq // 2
        if m.role == "user":
            assert m.content == f"q{i} " + "u" * 5000
        else:
            assert m.content == f"a{i} " + "a" * 20000
            assert m.stats == {"i": i} and m.thinking == "t" * 3000


def test_not_a_database(tmp_path):
    bad = tmp_path / "h.db"
    bad.write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(StoreError, match="chat history file is damaged"):
        Store(bad)


def test_reply_origins_round_trip_compactly(tmp_path):
    from core.user.store import decode_origins, encode_origins

    runs = [("t", 1), ("d", 5), ("d", 7), ("t", 0), ("t", 4), ("u", 2)]
    encoded = encode_origins(runs)
    assert encoded == "t1d12t4u2"  # neighbours of one origin merged, empty runs dropped
    assert decode_origins(encoded, 19) == [("t", 1), ("d", 12), ("t", 4), ("u", 2)]
    assert decode_origins(encoded, 18) is None  # does not cover the text: unusable
    assert decode_origins("t1x2", None) is None
    with Store(tmp_path / "h.db") as store:
        chat = store.create_chat()
        store.append_user_message(chat, "hi")
        store.append_assistant_message(chat, "a" * 19, origins=encoded)
        with pytest.raises(ValueError, match="origins"):
            store.append_assistant_message(chat, "short", origins=encoded)
    with Store(tmp_path / "h.db") as store:
        assert [m.origins for m in store.load_chat(chat).messages] == [None, "t1d12t4u2"]
