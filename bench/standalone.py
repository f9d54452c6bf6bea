"""What the benchmark's one-database measures (``scripts/bench --scan``, ``--housekeeping``) share:
the guard that keeps them on databases of their own, the result written per database, and the
report of every database's results side by side. Each passes its own ``markdown`` and ``failures``."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

Markdown = Callable[[list[dict[str, Any]]], str]
Failures = Callable[[dict[str, Any]], list[str]]


def refusal(option: str) -> str | None:
    """Why the measure must not run here (it empties its tables and its Redis database), or None.
    Django is set up; the Redis database is claimed as the benchmark's (bench/ownership.py)."""
    from django.db import connection
    from django_redis import get_redis_connection

    from . import ownership

    if not connection.settings_dict["NAME"].endswith("_bench") or os.environ.get("BENCH_OK") != "1":
        return (f"use scripts/bench {option}, which points it at databases of its own (a database name "
                "ending in _bench) and sets BENCH_OK=1.")
    try:
        ownership.claim(get_redis_connection("order_timeout"), f"Redis at {os.environ.get('REDIS_URL')}")
    except ownership.NotOurs as exc:
        return str(exc)
    return None


def _judged(results: list[dict[str, Any]], failures: Failures) -> int:
    problems = [problem for result in results for problem in failures(result)]
    for problem in problems:
        print(f"FAILED: {problem}", file=sys.stderr)
    return 1 if problems else 0


def write(out: Path, result: dict[str, Any], markdown: Markdown, failures: Failures) -> int:
    """This database's result as ``out/<vendor>.json``, printed and judged: the exit code."""
    from django.db import connection

    out.mkdir(parents=True, exist_ok=True)
    (out / f"{connection.vendor}.json").write_text(json.dumps(result, indent=2))
    print(markdown([result]))
    return _judged([result], failures)


def report(out: Path, markdown: Markdown, failures: Failures) -> int:
    """Every database's result in ``out`` side by side, as ``out/results.md`` too: the exit code."""
    found = [json.loads(path.read_text()) for path in sorted(out.glob("*.json"))]
    if not found:
        print(f"No results in {out}.", file=sys.stderr)
        return 2
    text = markdown(found)
    (out / "results.md").write_text(text + "\n")
    print(text)
    return _judged(found, failures)
