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
"""

from __future__ import annotations

from pathlib import Path

import pytest

PACK_MODELS = Path(__file__).parent / "data" / "pack" / "models"


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
