"""``--compare REF``: the same workloads on the code of another git ref, in the same run.

The ref is checked out once into a worktree under ``.bench-refs/`` (ignored
by git, outside the packages that lint and type checks read); its consumers run from there (their ``manage.py``, their
``order_timeout``), on the same database, Redis and workloads, between this
code's rows, so both meet the same machine. The harness itself, the orders it
creates and the members it schedules are this code's: a ref whose pending
set or order table this code cannot feed is refused.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from .systems import ROOT, System

# The rows run again on the ref's code: the plain one, the one with a reminder per order, a held
# tenth, and the one with an order_expired receiver per order.
COMPARED = ("ours", "ours_reminders", "ours_held", "ours_per_order")

# What a compared row measures; the ratio is new / old for each.
FIGURES = (
    ("steady", "lateness_ms", "p50", "steady lateness p50 (ms)"),
    ("steady", "lateness_ms", "p99", "steady lateness p99 (ms)"),
    ("steady", "lateness_ms", "max", "steady lateness max (ms)"),
    ("steady", "db_queries_per_close", None, "DB queries per steady close"),
    ("steady", "redis_commands_per_close", None, "Redis commands per steady close"),
    ("burst", "closes_per_s", None, "burst closes/s"),
    ("burst", "cpu_ms_per_close", None, "closers' CPU per burst close (ms)"),
    ("burst", "lateness_ms", "p50", "burst lateness p50 (ms)"),
    ("burst", "lateness_ms", "p99", "burst lateness p99 (ms)"),
    ("burst", "db_queries_per_close", None, "DB queries per burst close"),
    ("burst", "redis_commands_per_close", None, "Redis commands per burst close"),
    ("idle", "redis_round_trips_per_s", None, "idle Redis commands sent/s"),
)


def checkout(ref: str) -> tuple[Path, str]:
    """A worktree of ``ref`` (made once, reused), and the commit it names."""
    sha = subprocess.run(["git", "rev-parse", "--verify", f"{ref}^{{commit}}"], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout.strip()
    tree = ROOT / ".bench-refs" / sha[:12]
    if not (tree / "manage.py").exists():
        tree.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "worktree", "add", "--force", "--detach", str(tree), sha], cwd=ROOT,
                       check=True, capture_output=True)
    for needed in ("manage.py", "order_timeout/management/commands/run_timeout_consumer.py",
                   "bench/recorder.py"):
        if not (tree / needed).exists():
            raise SystemExit(f"--compare {ref}: {needed} is missing there; that ref cannot be measured.")
    return tree, sha


def at_ref(cls: type[System], tree: Path, ref: str, sha: str) -> type[System]:
    """``cls`` with its closers running the code of ``ref``."""
    return type(f"{cls.__name__}AtRef", (cls,), {
        "name": f"{cls.name}@{ref}", "label": f"{cls.label} at {ref} ({sha[:7]})", "root": tree,
        # The create-transaction measure creates rows with this code: nothing of the ref's.
        "measures_create": False,
        # A speed comparison: no crash workload (the ref's recorder may predate eager records).
        "workloads": tuple(kind for kind in cls.workloads if kind != "crash"),
    })


def ratios(data: dict[str, Any], new: str, old: str) -> list[tuple[str, Any, Any, float | None]]:
    """(figure, new, old, new / old) for every figure both rows have."""
    rows = []
    systems = data["systems"]
    for workload, key, part, label in FIGURES:
        values = []
        for name in (new, old):
            value = (systems[name].get(workload) or {}).get(key)
            values.append(value.get(part) if part and isinstance(value, dict) else value)
        if values[0] is None or values[1] is None:
            continue
        rows.append((label, values[0], values[1], values[0] / values[1] if values[1] else None))
    return rows
