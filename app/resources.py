"""Where packaged files live, in a source checkout and in an installed wheel."""

from __future__ import annotations

from pathlib import Path


def assets_dir() -> Path:
    here = Path(__file__).resolve().parent
    installed = here / "assets"  # the wheel carries assets/ inside app/
    if installed.is_dir():
        return installed
    return here.parent / "assets"  # source checkout or editable install


def style_path(name: str) -> Path:
    return assets_dir() / "styles" / name
