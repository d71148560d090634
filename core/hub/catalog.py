"""The pairing catalogue (core/data/catalog.toml) with local status, memory fit, and resolution.

list_entries()             every pairing + local status (ready/partial/missing) + size + fit
get_pairing(name)          one pairing (KeyError with a helpful message)
resolve_pairing(name)      local snapshot paths for the engine, never the network
start_pairing_download()   core.hub.download.start_download for a pairing's two repositories
"""

from __future__ import annotations

import difflib
import os
import tomllib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from core import modeltypes
from core.hub import fit, hfcache
from core.hub.download import DownloadHandle, start_download

CATALOG_PATH = Path(__file__).parents[1] / "data" / "catalog.toml"


@dataclass(frozen=True)
class Family:
    key: str
    label: str
    params_b: float
    arch: dict  # text_config-shaped numbers for the K/V estimate
    vision: bool
    audio: bool  # an audio tower (E2B/E4B) or audio embedder (12B)
    drafter_repo: str
    drafter_bytes: int
    block_size: int
    confidence: str


@dataclass(frozen=True)
class Pairing:
    name: str
    family: Family
    target_repo: str
    quant: str
    target_bytes: int
    confirmed: bool  # public sources name these exact repositories (the target, and its drafter if its own)
    source: str  # what the name and size rest on
    context: int  # context length used for memory_needed
    # a drafter of its own instead of the family's (a 4-bit assistant), with its size and precision
    own_drafter: str | None = None
    own_drafter_bytes: int | None = None
    drafter_quant: str = "bf16"

    @property
    def drafter_repo(self) -> str:
        return self.own_drafter or self.family.drafter_repo

    @property
    def repos(self) -> tuple[str, str]:
        return (self.target_repo, self.drafter_repo)

    @property
    def drafter_bytes(self) -> int:
        return self.own_drafter_bytes if self.own_drafter_bytes is not None else self.family.drafter_bytes

    @property
    def download_bytes(self) -> int:
        return self.target_bytes + self.drafter_bytes

    @property
    def vision(self) -> bool:
        return self.family.vision

    @property
    def audio(self) -> bool:
        return self.family.audio

    @property
    def block_size(self) -> int:
        return self.family.block_size

    @property
    def label(self) -> str:
        if self.drafter_quant != "bf16":  # "4bit d4": with its own 4-bit drafter (the details name it)
            return f"{self.family.label} {self.quant.removesuffix('bit')}+d{self.drafter_quant.removesuffix('bit')}"
        return f"{self.family.label} {self.quant}"

    def memory(self, context: int | None = None) -> fit.MemoryEstimate:
        return fit.estimate(self.download_bytes, self.family.arch, context or self.context)


@dataclass(frozen=True)
class Catalog:
    pairings: tuple[Pairing, ...]

    def names(self) -> list[str]:
        return [p.name for p in self.pairings]


def _family(key: str, raw: dict) -> Family:
    arch = {
        k: raw[k]
        for k in (
            "hidden_size",
            "vocab_size",
            "num_hidden_layers",
            "num_kv_shared_layers",
            "full_attention_layers",
            "num_key_value_heads",
            "num_global_key_value_heads",
            "head_dim",
            "global_head_dim",
            "sliding_window",
            "attention_k_eq_v",
        )
    }
    arch["num_global_key_value_heads"] = arch["num_global_key_value_heads"] or None
    return Family(
        key,
        raw["label"],
        float(raw["params_b"]),
        arch,
        bool(raw["vision"]),
        bool(raw["audio"]),
        raw["drafter"],
        int(raw["drafter_bytes"]),
        int(raw["block_size"]),
        raw.get("confidence", ""),
    )


def parse_catalog(text: str) -> Catalog:
    data = tomllib.loads(text)
    families = {k: _family(k, v) for k, v in data["families"].items()}
    context = int(data.get("typical_context", fit.DEFAULT_CONTEXT))
    pairings = []
    for raw in data["pairings"]:
        if raw["family"] not in families:
            raise ValueError(f"catalogue pairing {raw['name']!r}: unknown family {raw['family']!r}")
        own = raw.get("drafter")
        pairings.append(
            Pairing(
                raw["name"],
                families[raw["family"]],
                raw["target"],
                raw["quant"],
                int(raw["download_bytes"]),
                bool(raw.get("confirmed", False)) and bool(raw.get("drafter_confirmed", True)),
                raw.get("source", ""),
                context,
                own_drafter=own,
                own_drafter_bytes=int(raw["drafter_bytes"]) if own and "drafter_bytes" in raw else None,
                drafter_quant=raw.get("drafter_quant", "bf16") if own else "bf16",
            )
        )
    names = [p.name for p in pairings]
    if len(set(names)) != len(names):
        raise ValueError("catalogue: duplicate pairing names")
    return Catalog(tuple(pairings))


@lru_cache(maxsize=1)
def load_catalog(path: str | None = None) -> Catalog:
    return parse_catalog(Path(path or CATALOG_PATH).read_text(encoding="utf-8"))


def get_pairing(name: str) -> Pairing:
    catalog = load_catalog()
    for p in catalog.pairings:
        if p.name == name.lower():
            return p
    close = difflib.get_close_matches(name.lower(), catalog.names(), n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise KeyError(f"no pairing named {name!r} (known: {', '.join(catalog.names())}){hint}")


# -- local status -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class CatalogEntry:
    pairing: Pairing
    status: str  # "ready" (both complete) | "partial" | "missing"
    target: hfcache.RepoStatus
    drafter: hfcache.RepoStatus
    memory: fit.MemoryEstimate
    fit: fit.FitReport

    @property
    def local_bytes(self) -> int:
        return self.target.size_on_disk + self.drafter.size_on_disk

    def as_dict(self) -> dict:
        p = self.pairing
        return {
            "name": p.name,
            "label": p.label,
            "family": p.family.key,
            "quant": p.quant,
            "target": p.target_repo,
            "drafter": p.drafter_repo,
            "status": self.status,
            "target_status": self.target.state,
            "drafter_status": self.drafter.state,
            "download_bytes": p.download_bytes,
            "local_bytes": self.local_bytes,
            "memory_bytes": self.memory.total_bytes,
            "memory_context": self.memory.context,
            "kv_cache_bytes": self.memory.kv_bytes,
            "fit": self.fit.level,
            "fit_message": self.fit.message,
            "vision": p.vision,
            "audio": p.audio,
            "block_size": p.block_size,
            "confirmed": p.confirmed,
            "source": p.source,
            "target_path": str(self.target.snapshot) if self.target.snapshot else None,
            "drafter_path": str(self.drafter.snapshot) if self.drafter.snapshot else None,
        }


def _status(target: hfcache.RepoStatus, drafter: hfcache.RepoStatus) -> str:
    if target.complete and drafter.complete:
        return "ready"
    if target.state == drafter.state == "missing":
        return "missing"
    return "partial"


def list_entries(
    *, cache_dir: str | os.PathLike | None = None, machine: fit.MachineMemory | None = None
) -> list[CatalogEntry]:
    """Every catalogue pairing with its local status and fit. Reads the disk only, never the network."""
    catalog = load_catalog()
    machine = machine or fit.machine_memory()
    repos = [r for p in catalog.pairings for r in p.repos]
    local = hfcache.statuses(list(dict.fromkeys(repos)), cache_dir=cache_dir)
    out = []
    for p in catalog.pairings:
        mem = p.memory()
        out.append(
            CatalogEntry(
                p,
                _status(local[p.target_repo], local[p.drafter_repo]),
                local[p.target_repo],
                local[p.drafter_repo],
                mem,
                fit.check_fit(mem.total_bytes, machine),
            )
        )
    return out


# -- resolution and download ------------------------------------------------------------------------


# One wording for a pairing's local state wherever a person reads it (CLI tables, the models screen).
STATUS_WORDS = {"ready": "ready", "partial": "partial", "missing": "not downloaded", "drafter_only": "drafter only"}
# What the catalogue's "unconfirmed" repository names mean, for the CLI and the TUI alike.
UNCONFIRMED_NOTE = (
    "repository name not independently confirmed: it follows the family's naming, but no published "
    "listing was found for it; a download says so if it does not exist"
)


class PairingNotLocal(LookupError):
    pass


@dataclass(frozen=True)
class ResolvedPairing:
    name: str
    target_path: Path
    drafter_path: Path
    block_size: int
    vision: bool


def resolve_pairing(name: str, *, cache_dir: str | os.PathLike | None = None) -> ResolvedPairing:
    """Local snapshot directories of a catalogue pairing, for the engine. Never the network.

    Raises KeyError (unknown name) or PairingNotLocal (not completely downloaded; says what to run).
    """
    p = get_pairing(name)
    local = hfcache.statuses(list(p.repos), cache_dir=cache_dir)
    missing = [r for r in p.repos if not local[r].complete]
    if missing:
        states = ", ".join(f"{r} ({local[r].state})" for r in missing)
        raise PairingNotLocal(
            f"pairing {p.name} is not downloaded: {states}. Run `gemma-chat models download {p.name}`."
        )
    target, drafter = local[p.target_repo].snapshot, local[p.drafter_repo].snapshot
    assert target is not None and drafter is not None  # complete snapshots have a directory
    return ResolvedPairing(p.name, target, drafter, p.block_size, p.vision)


def start_pairing_download(
    name: str,
    *,
    offline: bool = False,
    cache_dir: str | os.PathLike | None = None,
    endpoint: str | None = None,
    token: str | bool | None = None,
) -> DownloadHandle:
    """Start downloading a pairing's target and drafter (the drafter first: it is small)."""
    p = get_pairing(name)
    local = hfcache.statuses(list(p.repos), cache_dir=cache_dir)
    # A copy cached under another spelling of the same repo id is used as is.
    repos: list[str] = []
    for r in (p.drafter_repo, p.target_repo):
        cached = local[r].cached_id
        repos.append(cached if local[r].complete and cached else r)
    return start_download(repos, offline=offline, cache_dir=cache_dir, endpoint=endpoint, token=token)


@dataclass(frozen=True)
class LocalCheckpoint:
    status: hfcache.RepoStatus
    model_type: str | None  # from the snapshot's config.json when complete


def other_local_checkpoints(*, cache_dir: str | os.PathLike | None = None) -> list[LocalCheckpoint]:
    """Gemma 4 repositories in the HF cache that no catalogue pairing names (custom pairs)."""
    import json

    known = {r.lower() for p in load_catalog().pairings for r in p.repos}
    out = []
    for st in hfcache.scan(cache_dir):
        if st.repo_id.lower() in known:
            continue
        model_type = None
        if st.snapshot is not None:
            try:
                model_type = json.loads((st.snapshot / "config.json").read_text()).get("model_type")
            except (OSError, ValueError):
                pass
        if model_type in modeltypes.ALL_TYPES or (model_type is None and "gemma-4" in st.repo_id.lower()):
            out.append(LocalCheckpoint(st, model_type))
    return out


def removal_plan(name: str, *, cache_dir: str | os.PathLike | None = None) -> tuple[list[str], list[str]]:
    """What `models rm NAME` deletes: (repo ids as cached, kept) where kept is [] or
    [drafter repo, pairings that still use it]. A family's drafter is shared by all its pairings,
    so it stays while another pairing of the family has its target on disk."""
    p = get_pairing(name)
    catalog = load_catalog()
    repos = list(dict.fromkeys(r for q in catalog.pairings for r in q.repos))
    local = hfcache.statuses(repos, cache_dir=cache_dir)
    sharing = [
        q.name
        for q in catalog.pairings
        if q.name != p.name and q.drafter_repo == p.drafter_repo and local[q.target_repo].state != "missing"
    ]
    keep_drafter = bool(sharing) and local[p.drafter_repo].state != "missing"
    doomed = [
        local[r].cached_id or r
        for r in p.repos
        if local[r].state != "missing" and not (r == p.drafter_repo and sharing)
    ]
    return doomed, ([p.drafter_repo, *sharing] if keep_drafter else [])
