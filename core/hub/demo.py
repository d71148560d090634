"""The offline demo pairing: a tiny trained E-style Gemma 4 target and its drafter, shipped in the package.

    ensure_demo_pairing() -> (target_dir, drafter_dir)

The weights live in `core/data/demo/` (`target/`, `assistant/`), in the real on-disk layout (HF
names, `config.json`, tokenizer, `chat_template.jinja`), float32: the dtype in which drafted and
plain greedy output are exactly equal. `scripts/train_demo.py` trained them (corpus, licence and
shapes are documented there and in scripts/demo_corpus.py) and wrote `gemma_chat_demo.json`, the
manifest with every file's sha256. Nothing is built or downloaded: every call checks the files
against the manifest and returns the package's own directories, or raises `DemoIntegrityError`
naming the damaged file.
"""

from __future__ import annotations

import hashlib
import json
import os
from functools import lru_cache
from pathlib import Path

DEMO_DIR = Path(__file__).resolve().parent.parent / "data" / "demo"
DEMO_MARKER = "gemma_chat_demo.json"
DEMO_NAME = "demo (tiny trained model)"  # the pairing name the UI and CLI show
DEMO_TRAINED_ON = "gemma-chat's own notes and Python docstrings"


class DemoIntegrityError(RuntimeError):
    """The shipped demo files are missing or do not match their recorded sha256."""


DemoError = DemoIntegrityError  # what callers catch: the demo pairing cannot be opened


def _read_manifest(root: Path) -> dict:
    try:
        return json.loads((root / DEMO_MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise DemoIntegrityError(f"the demo's manifest {root / DEMO_MARKER} is missing or unreadable: {e}") from e


def manifest() -> dict:
    """The shipped demo's manifest (label, parameter counts, corpus, per-file sha256)."""
    return _read_manifest(DEMO_DIR)


def demo_parameters() -> int:
    """Parameters of the demo's target text model and drafter together."""
    m = manifest()
    return int(m.get("target_parameters", 0)) + int(m.get("drafter_parameters", 0))


@lru_cache(maxsize=1)
def demo_label() -> str:
    """One honest line for the UI: what the demo is trained on and how small it is."""
    try:
        millions = demo_parameters() / 1e6
    except DemoIntegrityError:
        return f"DEMO — tiny model trained on {DEMO_TRAINED_ON}"
    return f"DEMO — tiny model trained on {DEMO_TRAINED_ON}, {millions:.1f} M params"


def demo_short_label() -> str:
    """The label where a line is short (the compact panel of a narrow terminal)."""
    try:
        return f"DEMO — tiny model, {demo_parameters() / 1e6:.1f} M params"
    except DemoIntegrityError:
        return "DEMO — tiny model"


def demo_version() -> str:
    """A short id of the shipped weights (the manifest's hash)."""
    return hashlib.sha256((DEMO_DIR / DEMO_MARKER).read_bytes()).hexdigest()[:16]


def is_demo_checkpoint(path: str | os.PathLike[str]) -> bool:
    """True for a directory of the demo pairing (or the pairing's root)."""
    return (Path(path) / DEMO_MARKER).is_file()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify(root: Path = DEMO_DIR) -> tuple[Path, Path]:
    """Check every file the manifest lists against its sha256; return (target, drafter)."""
    m = _read_manifest(root)
    files = m.get("sha256") or {}
    if not files:
        raise DemoIntegrityError(f"the demo's manifest {root / DEMO_MARKER} lists no files")
    for rel, expected in sorted(files.items()):
        path = root / rel
        if not path.is_file():
            raise DemoIntegrityError(f"the demo pairing is incomplete: {path} is missing (reinstall gemma-chat)")
        if _sha256(path) != expected:
            raise DemoIntegrityError(
                f"the demo pairing is damaged: {path} does not match its sha256 "
                "(reinstall gemma-chat, or rebuild it with scripts/train_demo.py)"
            )
    return root / m["target"], root / m["drafter"]


def ensure_demo_pairing() -> tuple[Path, Path]:
    """The shipped demo pairing's (target, drafter) directories, checked against the manifest."""
    return verify(DEMO_DIR)
