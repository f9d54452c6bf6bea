"""``python -m bench.kit_speed [--out DIR]``: the median time of one timer test written with the
testing kit against the same test written the ``transaction=True`` + ``call_command`` way
(bench/kit_speed/test_one_close.py), each run 15 times in one pytest run; setup,
call and teardown counted (JUnit's ``time``). Prints a Markdown table; a ratio from one run on
one machine, as every figure of docs/benchmarks.md is.

Needs DATABASE_URL and REDIS_URL (scripts/bench's servers, or the test command's).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = "bench/kit_speed/test_one_close.py"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="also write the table to DIR/results.md")
    options = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "junit.xml"
        run = subprocess.run([sys.executable, "-m", "pytest", TESTS, "-q", "-p", "no:cacheprovider", "-o", "addopts=",
                              "-p", "no:randomly", f"--junitxml={report}", "-o", "junit_duration_report=total"],
                             cwd=ROOT, env={**os.environ, "DJANGO_SETTINGS_MODULE": "testproject.settings"},
                             check=False)
        if run.returncode != 0:
            return run.returncode
        times: dict[str, list[float]] = defaultdict(list)
        for case in ElementTree.parse(report).iter("testcase"):
            times[case.get("name", "").split("[")[0]].append(float(case.get("time", "0")))
    kit = statistics.median(times["test_with_the_kit"])
    old = statistics.median(times["test_with_transaction_true_and_the_command"])
    database = os.environ.get("DATABASE_URL", "sqlite").split(":")[0]
    table = "\n".join([
        "| the test | runs | median (ms) |",
        "|---|---|---|",
        f"| with the kit, default `django_db` | {len(times['test_with_the_kit'])} | {kit * 1000:.1f} |",
        f"| `transaction=True` and `call_command(\"run_timeout_consumer\", \"--once\")` | "
        f"{len(times['test_with_transaction_true_and_the_command'])} | {old * 1000:.1f} |",
        "",
        f"The kit's test takes {kit / old:.2f}x the time of the other ({old / kit:.1f} times as fast); "
        f"{database}, Python {platform.python_version()}, {os.cpu_count()} CPUs.",
    ])
    print(table)
    if options.out:
        options.out.mkdir(parents=True, exist_ok=True)
        (options.out / "results.md").write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
