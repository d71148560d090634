"""Packaging: import hygiene of the CLI and a working install from the built wheel."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

HYGIENE = textwrap.dedent(
    """
    import sys
    from app.cli import main
    try:
        main({argv!r})
    except SystemExit:
        pass
    heavy = sorted(m for m in sys.modules if m.split('.')[0] in {{'mlx', 'mlx_lm', 'textual', 'transformers'}})
    print('HEAVY=' + ','.join(heavy))
    """
)


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["generate", "--help"],
        ["bench", "--help"],
        ["models", "--help"],
        ["doctor", "--help"],
        ["serve", "--help"],
        ["--version"],
    ],
)
def test_help_imports_neither_mlx_nor_textual(argv):
    out = subprocess.run(
        [sys.executable, "-c", HYGIENE.format(argv=argv)], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout
    assert "usage: gemma-chat" in out or "gemma-chat " in out
    heavy = out.rsplit("HEAVY=", 1)[1].strip()
    assert heavy == "", f"`gemma-chat {' '.join(argv)}` imported {heavy}"


def test_python_dash_m_entry():
    out = subprocess.run([sys.executable, "-m", "app", "--help"], capture_output=True, text=True, check=True, cwd=ROOT)
    assert "usage: gemma-chat" in out.stdout


def test_bad_block_size_is_a_clear_error():
    res = subprocess.run(
        [sys.executable, "-m", "app", "generate", "--block-size", "zero"], capture_output=True, text=True, cwd=ROOT
    )
    assert res.returncode == 2
    assert "block size must be an integer" in res.stderr


def test_wheel_installs_into_a_fresh_venv_with_assets(tmp_path):
    """Build the wheel, install it (no deps) into a new venv whose dependencies come from this one."""
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dist), str(ROOT)],
        check=True,
        capture_output=True,
    )
    (wheel,) = dist.glob("gemma_chat-*.whl")
    venv_dir = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv_dir)], check=True)
    py = venv_dir / "bin" / "python"
    new_site = Path(
        subprocess.run(
            [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    # Dependencies are visible through a plain path entry; this venv's own site-packages comes first,
    # and the editable install's finder (.pth in the dev venv) is not processed from a plain entry.
    (new_site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps", "--no-index", str(wheel)],
        check=True,
        capture_output=True,
    )
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH"}}
    help_out = subprocess.run(
        [str(venv_dir / "bin" / "gemma-chat"), "--help"],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        cwd=tmp_path,
    ).stdout
    assert "usage: gemma-chat" in help_out
    probe = subprocess.run(
        [
            str(py),
            "-c",
            "import app, core; from app.resources import assets_dir; d = assets_dir(); "
            "print(app.__file__); print(core.__file__); print(d); "
            "print(sorted(p.name for p in (d / 'styles').iterdir()))",
        ],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        cwd=tmp_path,
    ).stdout.splitlines()
    assert all(line.startswith(str(new_site)) for line in probe[:3]), probe
    assert "chat.tcss" in probe[3]
    # the OpenBLAS forwarder's C source travels in the wheel, and the installed code builds and loads it
    blas_probe = subprocess.run(
        [
            str(py),
            "-c",
            "from core.user.kernel_cache import use_private_kernel_cache; use_private_kernel_cache(); "
            "from core import blas; import mlx.core as mx; mx.eval(mx.ones((2, 3)) @ mx.ones((3, 2))); "
            "print(blas.active()); print(blas.forwarded_calls())",
        ],
        capture_output=True,
        text=True,
        check=True,
        env={**env, "GEMMA_CHAT_KERNEL_DIR": str(tmp_path / "kernels")},
        cwd=tmp_path,
    ).stdout.splitlines()
    if sys.platform.startswith("linux"):
        assert "fast=True" in blas_probe[0] and int(blas_probe[1]) >= 1, blas_probe
