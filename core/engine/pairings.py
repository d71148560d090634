"""Every `PairingSpec` the app opens is built here: the demo, a catalogue pairing, local checkpoints.

The CLI (`gemma-chat`, `gemma-chat generate`) and the models screen call these, so a pairing's name,
paths and demo flag come out the same wherever it is chosen. Failures raise `core.hub.pairing.PairingError`
with a sentence for the user. Nothing here imports mlx.
"""

from __future__ import annotations

import os
from pathlib import Path

from core.engine.contract import PairingSpec
from core.hub.demo import DEMO_NAME
from core.hub.pairing import PairingError


def demo_spec(*, drafter: bool = True) -> PairingSpec:
    """The offline demo pairing shipped in the package; damaged files raise PairingError."""
    from core.hub.demo import DemoError, ensure_demo_pairing

    try:
        target, drafter_dir = ensure_demo_pairing()
    except DemoError as e:
        raise PairingError(str(e)) from None
    return PairingSpec(name=DEMO_NAME, target=str(target), drafter=str(drafter_dir) if drafter else None, demo=True)


class PairingNotDownloaded(PairingError):
    """A catalogue pairing whose files are not (all) in the cache: the sentence says what to run."""

    def __init__(self, message: str, name: str) -> None:
        super().__init__(message)
        self.name = name  # the catalogue name, as the models screen and `models download` take it


def catalogue_spec(name: str, *, cache_dir: str | os.PathLike | None = None, drafter: bool = True) -> PairingSpec:
    """A catalogue pairing that is completely downloaded (else PairingNotDownloaded)."""
    from core.hub.catalog import get_pairing, resolve_pairing

    try:
        p = resolve_pairing(name, cache_dir=cache_dir)
    except KeyError:
        raise PairingError(f"unknown pairing {name!r} (see `gemma-chat models list`)") from None
    except LookupError as e:  # PairingNotLocal: says what to run
        raise PairingNotDownloaded(str(e), get_pairing(name).name) from None
    return PairingSpec(name=p.name, target=str(p.target_path), drafter=str(p.drafter_path) if drafter else None)


def snapshot_spec(repo_id: str, snapshot: str | os.PathLike) -> PairingSpec:
    """A target found complete in the Hugging Face cache, without a drafter (plain decoding)."""
    return PairingSpec(name=repo_id.split("/")[-1], target=str(snapshot), drafter=None)


def resolve_checkpoint(value: str | os.PathLike) -> Path:
    """A local directory, or a repo id resolved to its snapshot in the local Hugging Face cache."""
    from core.model.loader import CheckpointError
    from core.model.loader import resolve_checkpoint as resolve

    try:
        return resolve(str(value))
    except CheckpointError as e:
        raise PairingError(str(e)) from None


def checkpoint_spec(
    target: str | os.PathLike, drafter: str | os.PathLike | None = None, *, name: str | None = None
) -> PairingSpec:
    """Local checkpoints (directories, or repo ids already in the cache); no drafter: plain decoding.
    `name` defaults to the target directory's. The demo's directories, passed by path, keep their demo label."""
    from core.hub.demo import is_demo_checkpoint

    target_dir = resolve_checkpoint(target)
    drafter_dir = resolve_checkpoint(drafter) if drafter else None
    return PairingSpec(
        name=name or target_dir.name,
        target=str(target_dir),
        drafter=str(drafter_dir) if drafter_dir else None,
        demo=is_demo_checkpoint(target_dir),
    )
