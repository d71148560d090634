"""`gemma-chat doctor`: what this machine offers gemma-chat, in one screen.

MLX backend and default device, package versions, the Hugging Face cache and its free disk,
gemma-chat's own config/data/cache paths, memory budget, local pairings, and what the terminal
can show for images. Reads only; never touches the network; never loads textual.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from core.units import format_bytes

if TYPE_CHECKING:
    from core.hub.catalog import CatalogEntry

PACKAGES = (
    "mlx",
    "mlx-lm",
    "textual",
    "textual-image",
    "huggingface_hub",
    "transformers",
    "platformdirs",
    "pillow",
    "soundfile",
    "soxr",
)


def _version(dist: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def mlx_info() -> dict[str, str]:
    try:
        import mlx.core as mx
    except Exception as e:  # noqa: BLE001 - a broken install is exactly what doctor reports
        return {"backend": f"unavailable ({type(e).__name__}: {e})"}
    info = {}
    try:
        metal = bool(mx.metal.is_available())
    except Exception:  # noqa: BLE001
        metal = False
    info["backend"] = "Metal (GPU)" if metal else "CPU"
    try:
        info["default device"] = str(mx.default_device())
    except Exception as e:  # noqa: BLE001
        info["default device"] = f"unknown ({e})"
    try:
        dev = mx.device_info() if hasattr(mx, "device_info") else mx.metal.device_info()
    except Exception:  # noqa: BLE001
        dev = {}
    name = dev.get("device_name") or dev.get("architecture")
    if name:
        info["device"] = f"{name} ({dev.get('architecture', '?')})"
    if dev.get("max_recommended_working_set_size"):
        info["gpu working set"] = format_bytes(float(dev["max_recommended_working_set_size"]), unit="GB")
    from core import blas

    choice = blas.active()  # chosen at start-up (app.cli), before mlx was imported
    if choice is not None and not metal:
        info["float32 products"] = choice.description
    return info


def terminal_images(env: Mapping[str, str] | None = None) -> str:
    """Best guess from the environment (textual-image decides for real when the chat screen starts)."""
    env = os.environ if env is None else env
    term = env.get("TERM", "")
    program = env.get("TERM_PROGRAM", "")
    if env.get("KITTY_WINDOW_ID") or "kitty" in term:
        return "kitty graphics protocol (full-resolution images)"
    if program in ("WezTerm", "ghostty") or "ghostty" in term:
        return f"kitty graphics protocol likely ({program or term})"
    if program == "iTerm.app":
        return "iTerm2 inline images likely (sixel on iTerm2 >= 3.5)"
    if env.get("WT_SESSION") or "foot" in term or "mlterm" in term or "sixel" in term:
        return "sixel likely"
    if program == "Apple_Terminal":
        return "no image protocol: images show as unicode half-blocks"
    if not term or term == "dumb":
        return "not a terminal (TERM unset): no images"
    return "unknown terminal: images fall back to unicode half-blocks unless it speaks sixel or kitty"


def demo_state() -> str:
    """The offline demo pairing: shipped in the package, checked against its manifest when it opens."""
    try:
        from core.hub.demo import DEMO_DIR, demo_version, verify

        verify()
        return f"always available offline (gemma-chat --demo); shipped in the package: {DEMO_DIR} ({demo_version()})"
    except Exception as e:  # noqa: BLE001
        return f"always available offline (gemma-chat --demo); damaged: {type(e).__name__}: {e}"


def kernels_state(ready: list[str]) -> str:
    """Which of the demo and the downloaded pairings have their compiled CPU kernels on this machine (a one-shot
    `generate` without them runs uncompiled: core.engine.kernels)."""
    from core.engine.kernels import cpu_jit, signature
    from core.engine.pairings import catalogue_spec, demo_spec
    from core.user import kernel_cache

    if not cpu_jit():
        return "none needed (no C++ kernels on this backend)"
    cache = kernel_cache.active()
    if cache is None or cache.folder is None or not cache.compile_allowed:
        return "none: the kernel cache is refused (see kernel cache above)"
    if os.environ.get(kernel_cache.DISABLE_ENV):
        return f"none: compilation is off ({kernel_cache.DISABLE_ENV})"
    built: list[str] = []
    missing: list[str] = []
    for name in ["demo", *ready]:
        try:
            spec = demo_spec() if name == "demo" else catalogue_spec(name)
        except Exception:  # noqa: BLE001 (said on its own line above)
            continue
        drafter = Path(spec.drafter) if spec.drafter else None
        sig = signature(spec, Path(spec.target), drafter)
        (built if kernel_cache.is_prepared(cache, sig) else missing).append(name)
    said = [f"built for {', '.join(built)}"] if built else []
    if missing:
        said.append(f"not yet for {', '.join(missing)} (the app and serve build them; or generate --build-kernels)")
    return "; ".join(said) or "unknown (no pairing could be read)"


def audio_support(entries: list[CatalogEntry]) -> str:
    """Which catalogue families take audio, and what decodes it here."""
    families: dict[str, bool] = {}
    for e in entries:
        families.setdefault(e.pairing.family.label.removeprefix("Gemma 4 ").split(" (")[0], e.pairing.audio)
    yes = ", ".join(k for k, v in families.items() if v) or "none"
    no = ", ".join(k for k, v in families.items() if not v)
    try:
        import soundfile

        decoder = f"libsndfile {soundfile.__libsndfile_version__}"
    except Exception as e:  # noqa: BLE001  (a missing or broken libsndfile: audio cannot be decoded)
        decoder = f"no decoder: {type(e).__name__}: {e}"
    return f"{yes}" + (f" (not {no})" if no else "") + f"; files decoded by {decoder}"


def gather() -> list[tuple[str, list[tuple[str, str]]]]:
    from app import __version__
    from core.hub import catalog, fit
    from core.hub.download import default_cache_dir, free_disk_bytes
    from core.user import kernel_cache, paths

    sections = []
    sections.append(
        (
            "gemma-chat",
            [
                ("version", __version__),
                ("python", f"{platform.python_version()} ({sys.executable})"),
                ("platform", f"{platform.system()} {platform.release()} {platform.machine()}"),
            ],
        )
    )
    sections.append(("MLX", list(mlx_info().items())))
    sections.append(("packages", [(name, _version(name)) for name in PACKAGES]))

    cache = default_cache_dir()
    try:
        free = format_bytes(free_disk_bytes(cache))
    except OSError as e:
        free = f"unknown ({e})"
    hf = [("cache", cache), ("free disk", free)]
    for var in ("HF_HOME", "HF_HUB_CACHE", "HF_ENDPOINT", "HF_HUB_OFFLINE"):
        if os.environ.get(var):
            hf.append((var, os.environ[var]))
    sections.append(("Hugging Face", hf))

    where = [(k.replace("_", " "), v) for k, v in paths.describe().items()]
    kernels = kernel_cache.active()  # chosen at start-up (app.cli), before mlx was imported
    if kernels is not None:
        where.append(("kernel cache", str(kernels.folder) if kernels.folder else f"refused: {kernels.problem}"))
    sections.append(("gemma-chat paths", where))

    machine = fit.machine_memory()
    mem = [
        ("RAM", format_bytes(machine.total_bytes) if machine.total_bytes else "unknown"),
        (
            "usable for models",
            (format_bytes(machine.budget_bytes) if machine.budget_bytes else "unknown") + f" ({machine.note})",
        ),
    ]
    if machine.wired_limit_mb is not None:
        mem.append(
            (
                "iogpu.wired_limit_mb",
                str(machine.wired_limit_mb) + (" (default)" if machine.wired_limit_mb == 0 else ""),
            )
        )
    sections.append(("memory", mem))

    try:
        entries = catalog.list_entries(machine=machine)
        ready = [e.pairing.name for e in entries if e.status == "ready"]
        partial = [e.pairing.name for e in entries if e.status == "partial"]
        pairs = [
            ("demo", demo_state()),
            ("ready", ", ".join(ready) or "none (gemma-chat models download NAME)"),
            ("audio", audio_support(entries)),
            ("kernels", kernels_state(ready)),
        ]
        if partial:
            pairs.append(("partial", ", ".join(partial)))
    except Exception as e:  # noqa: BLE001
        pairs = [("error", f"{type(e).__name__}: {e}")]
    sections.append(("pairings", pairs))

    term = [
        (var, os.environ[var])
        for var in ("TERM", "TERM_PROGRAM", "COLORTERM", "KITTY_WINDOW_ID")
        if os.environ.get(var)
    ]
    term.append(("images", terminal_images()))
    sections.append(("terminal", term))
    return sections


def run(args: argparse.Namespace) -> int:
    from app.commands.common import fit_to, output_columns

    columns = output_columns()
    for title, rows in gather():
        print(title)
        width = max((len(k) for k, _ in rows), default=0)
        for key, value in rows:  # a long value wraps under its own column, not from the margin
            print(fit_to(f"  {key.ljust(width)}  {value}", columns, hang=width + 4))
    return 0
