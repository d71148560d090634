"""Run the hostile suite (issue 24) and count its cases per item and outcome.

    python scripts/hostile_report.py [--root DIR]

The suite is the tests themselves: the modules in HOSTILE below, whose test names start with the issue's
item number (test_02_... for item 2). Each case is a hostile input with the clean outcome it must get;
a failing case is classed by what happened instead: a traceback (one shows in the failure), a hang (a
timeout ended it), or a wrong or silent result (anything else; for items 2-7 a security or resource
finding). `--root` runs the suite in another checkout: copy the modules, tests/e2e/conftest.py and
tests/serve_process.py there first (e.g. a `git worktree add /tmp/base main`), which is how the
before/after figures of issue 24 were taken.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from pathlib import Path

HOSTILE = [
    "tests/e2e/test_serve_hostile.py",
    "tests/e2e/test_connect_hostile.py",
    "tests/e2e/test_hostile_checkpoints.py",
    "tests/e2e/test_hostile_config.py",
    "tests/engine/test_hostile_engine.py",
]
SECURITY_ITEMS = {2, 3, 4, 5, 6, 7}
_NOT_RAISED = {"AssertionError", "Failed", "TimeoutError", "concurrent.futures._base.TimeoutError", "socket.timeout"}
# read in the failure's message line only (its source listing mentions timeouts everywhere)
HANG = re.compile(r"\bhung\b|TimeoutError|timed out|ReadTimeout|did not answer|the server stopped answering")


def classify(case: ET.Element) -> str:
    failure = case.find("failure")
    if failure is None:
        failure = case.find("error")
    if failure is None:
        return "skipped" if case.find("skipped") is not None else "clean"
    message = failure.get("message") or ""
    raised = re.match(r"(\w+(?:\.\w+)*): ", message)  # the product raised into the test, not an assert
    if "Traceback (most recent call last)" in message or (raised and raised.group(1) not in _NOT_RAISED):
        return "traceback"
    if HANG.search(message):
        return "hang"
    return "security/resource" if item_of(case) in SECURITY_ITEMS else "wrong/silent"


def item_of(case: ET.Element) -> int:
    m = re.match(r"test_(\d+)_", case.get("name", ""))
    return int(m.group(1)) if m else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--junit", type=Path, help="keep pytest's report here; with --count-only, read it")
    parser.add_argument("--count-only", action="store_true", help="count the --junit report, run nothing")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        report = args.junit or Path(tmp) / "hostile.xml"
        if not args.count_only:
            cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}", *HOSTILE]
            subprocess.run(cmd, cwd=args.root)
        cases = list(ET.parse(report).iter("testcase"))
    per_item: dict[int, Counter] = defaultdict(Counter)
    for case in cases:
        per_item[item_of(case)][classify(case)] += 1
    kinds = ["clean", "traceback", "hang", "wrong/silent", "security/resource", "skipped"]
    print(f"{'item':>4}  " + "  ".join(f"{k:>17}" for k in kinds))
    total: Counter = Counter()
    for item in sorted(per_item):
        total.update(per_item[item])
        name = str(item) if item else "log"
        print(f"{name:>4}  " + "  ".join(f"{per_item[item][k]:>17}" for k in kinds))
    print(f"{'all':>4}  " + "  ".join(f"{total[k]:>17}" for k in kinds) + f"   ({len(cases)} cases)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
