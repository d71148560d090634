"""Shared test fixtures.

`factory_checkpoints` (session scope): tiny random-weight Gemma 4 checkpoints from
`support.factory`, built lazily on first request and reused for the whole session (a build takes
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

Kinds: the folder a test module sits in is its kind and its marker (`pytest -m unit`, `-m "not e2e"`,
or just `pytest tests/unit`): unit/ (a module on its own, no model, no UI), engine/ (the engine on tiny
checkpoints: parity with the reference pack and independent implementations, exactness of drafted
against plain decoding), tui/ (the headless app on the fake engine, SVG snapshots in tui/__snapshots__),
e2e/ (the product from outside: CLI processes, the installed wheel, `serve`, the app in tmux). A new
test goes in the folder of its kind; nothing else to mark. Shared helpers (pilot.py, fakehub.py,
vllm_standin.py) and data/ stay here, importable from every folder (`from pilot import make_app`:
pytest puts this directory on sys.path for its conftest).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

PACK_MODELS = Path(__file__).parent / "data" / "pack" / "models"

# -- directories -------------------------------------------------------------------------------------
# Set at import, before any test module imports huggingface_hub (which reads HF_HOME once) or starts a
# subprocess (the tmux app, the download child): they inherit these too.
# pytest-xdist's workers inherit the controller's environment, whose TMPDIR use_private_kernel_cache (below)
# pointed at the controller's kernel folder: each process starts from the temp folder the suite was given.
tempfile.tempdir = os.environ.setdefault("GEMMA_CHAT_TESTS_TMPDIR", tempfile.gettempdir())
_SESSION_ROOT = Path(tempfile.mkdtemp(prefix="gemma-chat-tests-"))
os.environ["GEMMA_CHAT_CACHE_DIR"] = str(_SESSION_ROOT / "cache")
os.environ["HF_HOME"] = str(_SESSION_ROOT / "hf")
os.environ.pop("HF_HUB_CACHE", None)  # else it wins over HF_HOME
# MLX's compiled CPU kernels: one private folder for the session, this process and every gemma-chat it starts
os.environ["GEMMA_CHAT_KERNEL_DIR"] = str(_SESSION_ROOT / "kernels")
# ... but most tests run MLX uncompiled: building the CPU kernels (a C++ compile, ~1 s each, a few hundred
# across the families, dtypes and shapes the suite runs) was half of an engine module's time. The compiled
# path keeps its own tests: the `compiled` fixture (this process and the ones its test starts) and
# `tmux_session.Tmux(compiled=True)` (the app in a terminal).
# GEMMA_CHAT_TEST_COMPILE=1 runs the whole suite compiled.
if os.environ.get("GEMMA_CHAT_TEST_COMPILE") != "1":
    os.environ["MLX_DISABLE_COMPILE"] = "1"
from core.user.kernel_cache import use_private_kernel_cache  # noqa: E402 (after the variables it reads)

use_private_kernel_cache()


def pytest_unconfigure(config):
    shutil.rmtree(_SESSION_ROOT, ignore_errors=True)


@pytest.fixture(autouse=True)
def _isolated_dirs(tmp_path_factory, monkeypatch):
    home = tmp_path_factory.mktemp("gemma-chat-home")
    monkeypatch.setenv("GEMMA_CHAT_CONFIG", str(home / "config" / "config.toml"))
    monkeypatch.setenv("GEMMA_CHAT_DATA_DIR", str(home / "data"))


# -- markers: what kind each test is (its folder) ------------------------------------------------------
KIND_MARKERS = ("unit", "engine", "tui", "e2e")
TESTS_DIR = Path(__file__).parent


def pytest_collection_modifyitems(config, items):
    for item in items:
        kind = item.path.relative_to(TESTS_DIR).parts[0] if item.path.is_relative_to(TESTS_DIR) else ""
        if kind not in KIND_MARKERS:
            folders = ", ".join(f"tests/{k}/" for k in KIND_MARKERS)
            raise pytest.UsageError(f"{item.nodeid}: a test module belongs in one of {folders}")
        item.add_marker(getattr(pytest.mark, kind))


class FactoryCheckpoints:
    def __init__(self, root: Path):
        self.root = root
        self._built: dict[tuple, object] = {}

    def _key_dir(self, kind: str, variant: str, layout: str, dtype: str, seed: int) -> Path:
        return self.root / f"{kind}-{variant}-{layout}-{dtype}-s{seed}"

    def target(self, variant: str = "e-style", layout: str = "hf", dtype: str = "float32", seed: int = 0) -> Path:
        key = ("target", variant, layout, dtype, seed)
        if key not in self._built:
            from support.factory import build_checkpoint

            self._built[key] = build_checkpoint(self._key_dir(*key), variant, layout, dtype, seed)
        return self._built[key]

    def drafter(self, variant: str = "e-style", dtype: str = "float32", seed: int = 0) -> Path:
        key = ("drafter", variant, "hf", dtype, seed)
        if key not in self._built:
            from support.factory import build_drafter

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


@pytest.fixture
def compiled(monkeypatch):
    """MLX compiles in this test, as on a user's machine (the suite runs uncompiled: see the top), and in
    the processes it starts (they inherit the environment)."""
    import mlx.core as mx

    monkeypatch.delenv("MLX_DISABLE_COMPILE", raising=False)
    mx.enable_compile()
    yield


@pytest.fixture(autouse=True)
def _suite_compile_mode():
    """After every test, MLX compiles as the suite does: a test that switched compilation on (the engine
    does once its kernels are ready; the kernel tests restore "on" by hand) must not leave it on."""
    yield
    mx = sys.modules.get("mlx.core")
    if mx is not None and os.environ.get("GEMMA_CHAT_TEST_COMPILE") != "1":
        mx.disable_compile()
