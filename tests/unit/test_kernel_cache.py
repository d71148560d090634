"""The MLX kernel cache is private (issue 24 §1): compiled CPU kernels go to gemma-chat's own 0700 folder, a
library planted in the shared temp folder is never loaded, and a folder another user owns or can write is
refused (compilation off, the app still works). Each case runs in a fresh Python process: the cache is
chosen once per process, before mlx is imported."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# one compiled function: its kernel's name is deterministic (graph, dtypes, layout)
PROBE = """
import json, os, sys
if sys.argv[1] == "private":
    from core.user.kernel_cache import use_private_kernel_cache
    cache = use_private_kernel_cache()
    folder, problem = (str(cache.folder) if cache.folder else None), cache.problem
else:
    folder = problem = None
import mlx.core as mx
f = mx.compile(lambda a, b: mx.exp(a * b + 3.0) - a)
out = f(mx.ones(5), mx.ones(5)).tolist()
print(json.dumps({"folder": folder, "problem": problem, "out": out, "tmpdir": os.environ.get("TMPDIR"),
                  "disabled": os.environ.get("MLX_DISABLE_COMPILE")}))
"""


def probe(tmp_path: Path, how: str, *, cache: Path, tmpdir: Path) -> dict:
    env = {**os.environ, "GEMMA_CHAT_CACHE_DIR": str(cache), "TMPDIR": str(tmpdir)}
    env.pop("GEMMA_CHAT_KERNEL_DIR", None)  # the tests' shared kernel folder: here the default place is tested
    env.pop("MLX_DISABLE_COMPILE", None)
    out = subprocess.run(
        [sys.executable, "-c", PROBE, how], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def kernels(folder: Path) -> list[Path]:
    """MLX's compiled kernels under `folder` (not the OpenBLAS forwarder core.blas builds into blas/)."""
    return sorted(p for p in folder.rglob("*.so") if p.parent.name != "blas")


def plant(lib: Path, symbol: str, marker: Path) -> None:
    """A library with MLX's file name and symbol that, when loaded, writes `marker` (as an attacker's would)."""
    src = lib.with_suffix(".c")
    src.write_text(
        textwrap.dedent(f"""
        #include <stdio.h>
        __attribute__((constructor)) static void planted(void) {{
            FILE *f = fopen("{marker}", "w"); if (f) {{ fputs("loaded", f); fclose(f); }}
        }}
        void {symbol}(int *shape, long **strides, void **args) {{ }}
        """)
    )
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True, capture_output=True)
    src.unlink()


@pytest.fixture
def compiler() -> None:
    if shutil.which("g++") is None or shutil.which("gcc") is None:
        pytest.skip("MLX's CPU backend compiles nothing without a C++ compiler")


def test_kernels_go_to_the_private_folder_and_a_planted_library_in_tmp_is_not_loaded(tmp_path, compiler):
    shared_tmp = tmp_path / "shared-tmp"  # stands in for the system temp folder
    shared_tmp.mkdir()
    # learn the kernel's file name where MLX puts it by default, then replace it with a planted library
    learn = probe(tmp_path, "plain", cache=tmp_path / "unused", tmpdir=shared_tmp)
    [built] = kernels(shared_tmp)
    marker = tmp_path / "planted-code-ran"
    symbol = built.name.removeprefix("lib").removesuffix(".so")
    built.unlink()
    plant(built, symbol, marker)

    # control: MLX as it comes loads the planted file (and runs its code) without asking who wrote it
    probe(tmp_path, "plain", cache=tmp_path / "unused", tmpdir=shared_tmp)
    assert marker.exists(), "the planted library was not loaded: this test would prove nothing"
    marker.unlink()

    cache = tmp_path / "cache"
    got = probe(tmp_path, "private", cache=cache, tmpdir=shared_tmp)
    assert not marker.exists(), "gemma-chat loaded a library planted in the shared temp folder"
    assert got["out"] == learn["out"]
    folder = cache / "kernels"
    assert got["folder"] == str(folder) and got["tmpdir"] == str(folder) and got["problem"] is None
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert [p.name for p in kernels(folder)] == [built.name]  # built afresh, in the private folder


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o722])
def test_a_kernel_folder_others_can_write_is_refused_and_nothing_is_compiled(tmp_path, compiler, mode):
    cache = tmp_path / "cache"
    folder = cache / "kernels"
    folder.mkdir(parents=True)
    folder.chmod(mode)
    shared_tmp = tmp_path / "shared-tmp"
    shared_tmp.mkdir()
    got = probe(tmp_path, "private", cache=cache, tmpdir=shared_tmp)
    assert got["folder"] is None and got["disabled"] == "1"
    assert "writable by other users" in got["problem"] and str(folder) in got["problem"]
    assert "runs without compiled kernels" in got["problem"]
    assert got["out"] == pytest.approx([53.598150033144236] * 5, rel=1e-5)  # still works, uncompiled
    assert kernels(folder) == [] and kernels(shared_tmp) == []  # no kernel built or loaded anywhere


def test_a_writable_folder_inside_the_kernel_folder_is_refused(tmp_path, compiler):
    cache = tmp_path / "cache"
    inner = cache / "kernels" / "mlx" / "0.32.4" / "cpu"
    inner.mkdir(parents=True)
    (cache / "kernels").chmod(0o700)
    inner.chmod(0o777)
    got = probe(tmp_path, "private", cache=cache, tmpdir=tmp_path)
    assert got["folder"] is None and str(inner) in got["problem"]


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user needs root")
def test_a_kernel_folder_another_user_owns_is_refused(tmp_path, compiler):
    cache = tmp_path / "cache"
    folder = cache / "kernels"
    folder.mkdir(parents=True, mode=0o700)
    os.chown(folder, 12345, 12345)
    got = probe(tmp_path, "private", cache=cache, tmpdir=tmp_path)
    assert got["folder"] is None and "belongs to another user (uid 12345)" in got["problem"]


def test_a_parent_others_can_write_is_refused_unless_sticky(tmp_path, compiler):
    parent = tmp_path / "open"
    parent.mkdir()
    parent.chmod(0o777)
    got = probe(tmp_path, "private", cache=parent / "cache", tmpdir=tmp_path)
    assert got["folder"] is None and f"parent {parent} is writable by other users" in got["problem"]
    parent.chmod(0o1777)  # sticky, as /tmp: nobody can rename our folder away
    got = probe(tmp_path, "private", cache=parent / "cache2", tmpdir=tmp_path)
    assert got["folder"] == str(parent / "cache2" / "kernels")


def test_the_app_says_the_one_sentence_and_still_answers(tmp_path, compiler):
    """The CLI entry point goes through it: a refused folder is one line on stderr, the reply still comes."""
    cache = tmp_path / "cache"
    (cache / "kernels").mkdir(parents=True)
    (cache / "kernels").chmod(0o777)
    env = {**os.environ, "GEMMA_CHAT_CACHE_DIR": str(cache), "TMPDIR": str(tmp_path)}
    env.pop("GEMMA_CHAT_KERNEL_DIR", None)
    exe = Path(sys.executable).with_name("gemma-chat")
    out = subprocess.run(
        [str(exe), "generate", "--demo", "--prompt", "Hi!", "--max-tokens", "4"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    lines = [ln for ln in out.stderr.splitlines() if "kernel cache folder" in ln]
    assert len(lines) == 1 and "writable by other users" in lines[0], out.stderr
    assert out.stdout.strip()
    assert kernels(cache) == [] and kernels(tmp_path / "mlx") == []
