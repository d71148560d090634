"""The test suite's own guard: conftest's autouse fixture keeps every test away from the user's files."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import platformdirs

from core.user import paths


def _inside_temp(p: Path) -> bool:
    return Path(p).resolve().is_relative_to(Path(tempfile.gettempdir()).resolve())


def test_gemma_chat_directories_are_temporary():
    for where in (paths.config_file(), paths.data_dir(), paths.cache_dir(), paths.history_db()):
        assert _inside_temp(where), where
        assert not Path(where).resolve().is_relative_to(platformdirs.user_config_path().resolve())


def test_the_hugging_face_cache_is_temporary():
    assert _inside_temp(Path(os.environ["HF_HOME"]))
    assert "HF_HUB_CACHE" not in os.environ or _inside_temp(Path(os.environ["HF_HUB_CACHE"]))


def test_each_test_gets_its_own_config_and_data(tmp_path):
    # a file written here must not be seen by another test (see the next one)
    paths.ensure_dir(paths.data_dir())
    (paths.data_dir() / "marker").write_text("x")
    assert (paths.data_dir() / "marker").exists()


def test_each_test_gets_its_own_config_and_data_too():
    assert not (paths.data_dir() / "marker").exists()
