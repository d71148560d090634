"""Shared test fixtures.

`factory_checkpoints` (session scope): tiny random-weight Gemma 4 checkpoints from
`core.factory`, built lazily on first request and reused for the whole session (a build takes
~0.1 s; nothing is built that no test asks for):

    def test_x(factory_checkpoints):
        target = factory_checkpoints.target("moe-style", layout="mlx", dtype="q4")
        target, drafter = factory_checkpoints.pairing("e-style")

Variants: "e-style" (E2B-like), "moe-style" (26B-A4B-like), "dense-style" (31B-like); layouts
"hf" and "mlx"; dtypes "float32", "bfloat16", "q4" (mlx layout only). Treat the directories as
read-only: they are shared by every test in the session.

`pack_dir`: the reference pack's models directory (tests/data/pack/models).

`_isolated_dirs` (autouse): every test runs with gemma-chat's config file and data directory in its
own temp dir, and its cache (where the demo pairing is built once) and the Hugging Face cache in one
temp dir per session, so no test reads or writes the user's real files. A test that needs other
places sets them itself (monkeypatch.setenv), as before.

`make_app` (tests/pilot.py): the one way to build the app over the scripted fake engine.

Markers by kind (`pytest -m unit`, `-m "not e2e"` ...): each test module is listed in KINDS below;
a new module gets "unit" unless it is listed (or its name starts with test_tui_, which makes it "tui").
A module may also set `pytestmark` itself. Folders per kind are left for later: several people add
tests in parallel and a move would conflict with every one of them.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

PACK_MODELS = Path(__file__).parent / "data" / "pack" / "models"

# -- directories -------------------------------------------------------------------------------------
# Set at import, before any test module imports huggingface_hub (which reads HF_HOME once) or starts a
# subprocess (the tmux app, the download child): they inherit these too.
_SESSION_ROOT = Path(tempfile.mkdtemp(prefix="gemma-chat-tests-"))
os.environ["GEMMA_CHAT_CACHE_DIR"] = str(_SESSION_ROOT / "cache")
os.environ["HF_HOME"] = str(_SESSION_ROOT / "hf")
os.environ.pop("HF_HUB_CACHE", None)  # else it wins over HF_HOME


def pytest_unconfigure(config):
    shutil.rmtree(_SESSION_ROOT, ignore_errors=True)


@pytest.fixture(autouse=True)
def _isolated_dirs(tmp_path_factory, monkeypatch):
    home = tmp_path_factory.mktemp("gemma-chat-home")
    monkeypatch.setenv("GEMMA_CHAT_CONFIG", str(home / "config" / "config.toml"))
    monkeypatch.setenv("GEMMA_CHAT_DATA_DIR", str(home / "data"))


# -- markers: what kind each test is -------------------------------------------------------------------
KINDS = {
    # the engine against independent implementations and its own plain path (MLX, tiny checkpoints)
    "engine": {
        "test_cache",
        "test_drafter",
        "test_engine",
        "test_factory",
        "test_image_engine",
        "test_sampling",
        "test_spec",
        "test_target",
        "test_vision",
        "test_bench",
        "test_demo",
    },
    # the product driven from outside: installed wheel, CLI processes, a real terminal
    "e2e": {"test_packaging", "test_tui_tmux", "test_generate_cli", "test_models_cli"},
}
KIND_MARKERS = ("unit", "engine", "tui", "e2e")


def _kind(module: str) -> str:
    for kind, modules in KINDS.items():
        if module in modules:
            return kind
    return "tui" if module.startswith("test_tui_") else "unit"


def pytest_collection_modifyitems(config, items):
    for item in items:
        if any(item.get_closest_marker(k) for k in KIND_MARKERS):
            continue  # the module or test says what it is
        module = item.module.__name__.rsplit(".", 1)[-1] if item.module else ""
        item.add_marker(getattr(pytest.mark, _kind(module)))


class FactoryCheckpoints:
    def __init__(self, root: Path):
        self.root = root
        self._built: dict[tuple, object] = {}

    def _key_dir(self, kind: str, variant: str, layout: str, dtype: str, seed: int) -> Path:
        return self.root / f"{kind}-{variant}-{layout}-{dtype}-s{seed}"

    def target(self, variant: str = "e-style", layout: str = "hf", dtype: str = "float32", seed: int = 0) -> Path:
        key = ("target", variant, layout, dtype, seed)
        if key not in self._built:
            from core.factory import build_checkpoint

            self._built[key] = build_checkpoint(self._key_dir(*key), variant, layout, dtype, seed)
        return self._built[key]

    def drafter(self, variant: str = "e-style", dtype: str = "float32", seed: int = 0) -> Path:
        key = ("drafter", variant, "hf", dtype, seed)
        if key not in self._built:
            from core.factory import build_drafter

            self._built[key] = build_drafter(self._key_dir(*key), variant, dtype, seed)
        return self._built[key]

    def pairing(
        self, variant: str = "e-style", layout: str = "hf", dtype: str = "float32", seed: int = 0
    ) -> tuple[Path, Path]:
        return self.target(variant, layout, dtype, seed), self.drafter(variant, dtype, seed)


@pytest.fixture(scope="session")
def factory_checkpoints(tmp_path_factory) -> FactoryCheckpoints:
    return FactoryCheckpoints(tmp_path_factory.mktemp("factory"))


@pytest.fixture(scope="session")
def pack_dir() -> Path:
    return PACK_MODELS
