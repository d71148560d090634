"""Where gemma-chat keeps its files: config, history, cache.

platformdirs picks the per-OS places; each can be moved with an environment variable, which is also how
tests keep away from the real user directories:

  GEMMA_CHAT_CONFIG      the config FILE (not its directory)
  GEMMA_CHAT_DATA_DIR    history database and other user data
  GEMMA_CHAT_CACHE_DIR   disposable caches

Nothing here creates a directory: callers that write call `ensure_dir`.
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP_NAME = "gemma-chat"
CONFIG_ENV = "GEMMA_CHAT_CONFIG"
DATA_DIR_ENV = "GEMMA_CHAT_DATA_DIR"
CACHE_DIR_ENV = "GEMMA_CHAT_CACHE_DIR"
CONFIG_FILENAME = "config.toml"
HISTORY_FILENAME = "history.sqlite3"


def _from_env(name: str) -> Path | None:
    value = os.environ.get(name, "").strip()
    return Path(value).expanduser() if value else None


def config_file() -> Path:
    return _from_env(CONFIG_ENV) or platformdirs.user_config_path(APP_NAME, appauthor=False) / CONFIG_FILENAME


def config_dir() -> Path:
    return config_file().parent


def data_dir() -> Path:
    return _from_env(DATA_DIR_ENV) or platformdirs.user_data_path(APP_NAME, appauthor=False)


def cache_dir() -> Path:
    return _from_env(CACHE_DIR_ENV) or platformdirs.user_cache_path(APP_NAME, appauthor=False)


def documents_dir() -> Path:
    """The user's documents folder (exports go there unless export_dir says otherwise)."""
    return platformdirs.user_documents_path()


def history_db() -> Path:
    return data_dir() / HISTORY_FILENAME


def ensure_dir(path: Path) -> Path:
    """Create `path` if needed, private to the user (0700): it holds their config and conversations.
    A folder that already exists keeps the permissions the user gave it."""
    if not path.is_dir():
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def describe() -> dict[str, str]:
    """Every location, for `gemma-chat doctor`."""
    return {
        "config_file": str(config_file()),
        "data_dir": str(data_dir()),
        "history_db": str(history_db()),
        "cache_dir": str(cache_dir()),
    }
