"""Numbers for people. The one byte formatter: downloads, the cache, memory, the doctor and the panels
all write sizes through `format_bytes`."""

from __future__ import annotations

_DECIMAL = (("B", 1), ("KB", 1000), ("MB", 1000**2), ("GB", 1000**3), ("TB", 1000**4))
_BINARY = (("B", 1), ("KiB", 1024), ("MiB", 1024**2), ("GiB", 1024**3), ("TiB", 1024**4))


def format_bytes(n: float, *, unit: str | None = None, binary: bool = False) -> str:
    """`n` bytes as "512 B", "1.5 GB" (decimal units; binary=True: KiB, MiB, GiB for memory).
    The unit is the largest one that keeps the number under 1000 (1024), or `unit` when given
    ("GB": a table column whose figures line up). Bytes are whole, the rest has one decimal."""
    units = _BINARY if binary else _DECIMAL
    if unit is not None:
        scale = dict(units)[unit]
    else:
        step = 1024 if binary else 1000
        unit, scale = units[-1]
        for name, size in units:
            if abs(n) < size * step:
                unit, scale = name, size
                break
    return f"{n:.0f} B" if unit == "B" else f"{n / scale:.1f} {unit}"


def format_duration(seconds: float) -> str:
    """An audio clip's length: '0.25 s', '3.7 s', '1:05', '1:02:03' (the chat's chips and export)."""
    if seconds < 1:
        return f"{seconds:.2f} s"
    if seconds < 60:
        return f"{seconds:.1f} s"
    s = int(seconds + 0.5)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"
