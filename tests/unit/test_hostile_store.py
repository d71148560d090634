"""Hostile conditions for the history store and the user's files (issue 15): every fault is a
StoreError with one sentence that names the file (never a raw sqlite3 / OSError), one damaged row
does not make a chat unopenable, and the history and config are private to the user."""

from __future__ import annotations

import os
import sqlite3
import stat

import pytest

from core.user.config import save_config, write_default_config
from core.user.store import Store, StoreError


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def filled(db, n_chats: int = 40, n_messages: int = 30) -> None:
    with Store(db) as store:
        for c in range(n_chats):
            chat = store.create_chat(f"chat {c}")
            for m in range(n_messages):
                store.append_message(chat, "user" if m % 2 == 0 else "assistant", f"message {c}/{m} " + "x" * 300)


def test_history_path_is_a_directory(tmp_path):
    (tmp_path / "history.sqlite3").mkdir()
    with pytest.raises(StoreError, match="is a directory"):
        Store(tmp_path / "history.sqlite3")


def test_history_folder_is_a_file(tmp_path):
    (tmp_path / "data").write_text("x")
    with pytest.raises(StoreError, match="folder is a file"):
        Store(tmp_path / "data" / "history.sqlite3")


def test_damaged_file_at_open(tmp_path):
    db = tmp_path / "history.sqlite3"
    db.write_bytes(os.urandom(8192))
    with pytest.raises(StoreError, match="damaged") as e:
        Store(db)
    assert str(db) in str(e.value)


def test_damaged_middle_pages_are_a_store_error(tmp_path):
    db = tmp_path / "history.sqlite3"
    filled(db)
    size = db.stat().st_size
    with open(db, "r+b") as f:  # wipe a stretch in the middle: b-tree pages of messages and the index
        f.seek(size // 3)
        f.write(os.urandom(size // 3))
    errors = []
    try:
        store = Store(db)
    except StoreError as e:
        errors.append(e)
    else:
        for call in (
            store.list_chats,
            lambda: store.search_chats("message"),
            lambda: [store.load_chat(s) for s in range(1, 41)],
            lambda: store.append_message(1, "user", "more"),
            store.integrity_check,
        ):
            try:
                call()
            except StoreError as e:
                errors.append(e)
            # anything else (sqlite3.DatabaseError, ...) fails the test
        store.close()
    assert errors, "damaging the file went unnoticed"
    assert all(str(db) in str(e) for e in errors)


def test_locked_after_open_is_a_store_error(tmp_path, monkeypatch):
    db = tmp_path / "history.sqlite3"
    monkeypatch.setattr(Store, "busy_timeout_s", 0.05)
    store = Store(db)
    chat = store.create_chat("a chat")
    other = sqlite3.connect(db, isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(StoreError, match="locked by another program"):
            store.append_message(chat, "user", "hello")
    finally:
        other.execute("ROLLBACK")
        other.close()
    store.append_message(chat, "user", "hello")  # works again once the lock is gone
    assert [m.content for m in store.load_chat(chat).messages] == ["hello"]
    store.close()


def test_a_malformed_stats_row_does_not_hide_the_chat(tmp_path):
    db = tmp_path / "history.sqlite3"
    with Store(db) as store:
        chat = store.create_chat("a chat")
        store.append_message(chat, "user", "q")
        store.append_message(chat, "assistant", "a", stats={"rounds": 3})
        store.append_message(chat, "assistant", "b", stats={"rounds": 4})
        store._con.execute("UPDATE messages SET stats_json = '{not json' WHERE content = 'a'")
        store._con.execute("UPDATE chats SET params_json = '[broken' WHERE id = ?", (chat,))
        loaded = store.load_chat(chat)
    assert [m.content for m in loaded.messages] == ["q", "a", "b"]
    assert loaded.messages[1].stats is None and loaded.messages[2].stats == {"rounds": 4}
    assert loaded.params == {}


def test_history_and_config_are_private(tmp_path, monkeypatch):
    old = os.umask(0o022)
    try:
        data = tmp_path / "data"
        Store(data / "history.sqlite3").close()
        assert mode(data) == 0o700
        assert mode(data / "history.sqlite3") == 0o600

        cfg = tmp_path / "conf" / "config.toml"
        write_default_config(cfg)
        assert mode(cfg.parent) == 0o700 and mode(cfg) == 0o600
        os.chmod(cfg, 0o644)  # a file the user (or an older gemma-chat) made readable to all
        save_config({"sampling": {"temperature": 0.5}}, cfg)
        assert mode(cfg) == 0o600
    finally:
        os.umask(old)


def test_a_stored_chat_with_bad_sampling_values_still_chats():
    from app.tui.history import settings_for_chat
    from core.settings import GenerationSettings

    base = GenerationSettings(temperature=0.0, seed=7)
    s = settings_for_chat(base, {"seed": -1, "temperature": float("nan"), "top_k": 5}, None)
    s.validate()
    assert (s.seed, s.temperature, s.top_k) == (7, 0.0, 5)
