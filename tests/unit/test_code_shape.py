"""Shape rules the linters do not check: no function in core/ or app/ longer than 80 lines."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 80


def long_functions(*packages: Path) -> list[tuple[str, int]]:
    """(path:line name, length) of every function under `packages` longer than MAX_LINES."""
    found = []
    for package in packages:
        for path in sorted(package.rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    length = (node.end_lineno or node.lineno) - node.lineno + 1
                    if length > MAX_LINES:
                        found.append((f"{path.relative_to(package.parent)}:{node.lineno} {node.name}", length))
    return found


def test_no_function_in_core_or_app_is_longer_than_80_lines():
    assert long_functions(ROOT / "core", ROOT / "app") == [], "split these: one job per function"


def test_the_rule_finds_nested_and_async_functions(tmp_path):
    body = "\n".join(f"            x{i} = {i}" for i in range(MAX_LINES))
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text(f"class C:\n    def f(self):\n        async def g():\n{body}\n")
    found = long_functions(tmp_path / "pkg")
    assert [(where.split()[-1], n) for where, n in found] == [("f", MAX_LINES + 2), ("g", MAX_LINES + 1)]
