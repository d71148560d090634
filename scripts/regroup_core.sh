#!/usr/bin/env bash
# Group core/ into subpackages: pure moves (git mv) plus import rewrites, nothing else (the commit
# "Group core/ into subpackages" on branch habits2 is exactly its output). For the integrator: run it from
# the repository root on a clean main after the other branches are merged, then check with
# `ruff check . && ruff format --check . && mypy && lint-imports` and commit. Idempotent: a second run
# changes nothing. Rewrites every tracked .py/.toml/.md/.tcss file and .ci/, scripts/: `from core import x`
# is split by destination, `core.x` -> `core.<group>.x` (imports, mock.patch strings, `python -m`), and
# `core/x.py` -> `core/<group>/x.py` in text. Delete this script once main has the new layout.
set -euo pipefail
python3 - <<'PY'
import re, subprocess
from pathlib import Path

GROUPS = {
    "model": ["loader", "target", "drafter", "layers", "vision", "unified", "cache", "memory", "image"],
    "decode": ["spec", "autoblock", "detok", "prompt"],
    "hub": ["download", "_download_child", "catalog", "hfcache", "pairing", "fit"],
    "user": ["store", "config", "paths", "export", "clipboard", "keymap"],
}
DOCS = {
    "model": "The models: checkpoint loading, the Gemma 4 target and its MTP drafter, their layers, caches,\n"
             "the vision encoders and image preprocessing, and Metal memory settings.",
    "decode": "Decoding: the speculative round loop (Decoder), automatic block size, prompt rendering and the\n"
              "streaming detokenizer.",
    "hub": "Checkpoints on the Hub and on disk: downloads (in a child process), the Hugging Face cache, the\n"
           "pairing catalogue, whether a drafter fits a target, and whether a pairing fits this machine.",
    "user": "The user's own files: config, directories, chat history store, export, clipboard and key map.",
}
WHERE = {m: g for g, ms in GROUPS.items() for m in ms}

def git(*a):
    subprocess.run(["git", *a], check=True)

# 1. moves
for g, ms in GROUPS.items():
    d = Path("core") / g
    d.mkdir(exist_ok=True)
    init = d / "__init__.py"
    if not init.exists():
        init.write_text(f'"""{DOCS[g]}"""\n')
        git("add", str(init))
    for m in ms:
        src = Path("core") / f"{m}.py"
        if src.exists():
            git("mv", str(src), str(d / f"{m}.py"))

# 2. rewrites over every tracked text file that can name a module
files = subprocess.run(["git", "ls-files", "*.py", "*.toml", "*.md", "*.tcss", ".ci/*", "scripts/*"],
                       check=True, capture_output=True, text=True).stdout.split()
names = "|".join(sorted(WHERE, key=len, reverse=True))
dotted = re.compile(rf"(?<![\w.])core\.({names})\b")
slashed = re.compile(rf"(?<![\w/])core/({names})\.py\b")
from_core = re.compile(r"^(?P<ind>[ \t]*)from core import (?P<body>\([^)]*\)|[^\n]*)", re.M)

def split_from_core(m):
    ind, body = m.group("ind"), m.group("body")
    comment = ""
    if not body.startswith("(") and "#" in body:
        body, comment = body.split("#", 1)
        comment = "  #" + comment
    items = [x.strip() for x in body.strip("()").replace("\n", " ").split(",") if x.strip()]
    groups: dict[str, list[str]] = {}
    for it in items:
        name = it.split(" as ")[0].strip()
        groups.setdefault(f"core.{WHERE[name]}" if name in WHERE else "core", []).append(it)
    if list(groups) == ["core"]:
        return m.group(0)
    lines = [f"{ind}from {pkg} import {', '.join(its)}" for pkg, its in sorted(groups.items())]
    lines[-1] += comment
    return "\n".join(lines)

for f in files:
    p = Path(f)
    if not p.is_file() or p.name == "regroup_core.sh":
        continue
    try:
        s = p.read_text()
    except UnicodeDecodeError:
        continue
    t = from_core.sub(split_from_core, s) if f.endswith(".py") else s
    t = dotted.sub(lambda m: f"core.{WHERE[m.group(1)]}.{m.group(1)}", t)
    t = slashed.sub(lambda m: f"core/{WHERE[m.group(1)]}/{m.group(1)}.py", t)
    # __import__("core.x") returns the top package: the attribute path grows with the subpackage
    t = re.sub(r'__import__\("core\.(\w+)\.(\w+)"\)\.\2\b', r'__import__("core.\1.\2").\1.\2', t)
    if t != s:
        p.write_text(t)

# 3. data files a moved module finds next to itself now sit one folder up (core/data)
cat = Path("core/hub/catalog.py")
s = cat.read_text()
s2 = s.replace('Path(__file__).parent / "data"', 'Path(__file__).parents[1] / "data"')
if s2 != s:
    cat.write_text(s2)
PY
.venv/bin/ruff check --fix --select I . >/dev/null || true   # import order after the rewrites
.venv/bin/ruff format . >/dev/null
