"""When did each close commit? The same ``order_expired`` receiver in every system's closer.

The receiver only registers an ``on_commit`` callback, so it costs every
system the same few microseconds and no query. Each process writes its
``(order id, commit time)`` pairs to BENCH_RECORD_DIR when it exits; a close
that was rolled back never commits and is never recorded.
"""

from __future__ import annotations

import atexit
import os
import time
from pathlib import Path
from typing import Any

from django.db import transaction

_commits: list[tuple[int, float]] = []


def on_expired(sender: Any, order: Any, **kwargs: Any) -> None:
    pk = order.pk
    transaction.on_commit(lambda: _commits.append((pk, time.time())))


def dump_at_exit() -> None:
    if os.environ.get("BENCH_RECORD_DIR"):
        atexit.register(flush)


def flush() -> None:
    """Append what this process recorded so far to its file (prefork children call it too)."""
    directory = os.environ.get("BENCH_RECORD_DIR")
    if directory and _commits:
        lines = "".join(f"{pk} {at:.6f}\n" for pk, at in _commits)
        with (Path(directory) / f"commits-{os.getpid()}.txt").open("a") as out:
            out.write(lines)
        _commits.clear()


def read_commits(directory: Path) -> list[tuple[int, float]]:
    commits = []
    for path in directory.glob("commits-*.txt"):
        for line in path.read_text().splitlines():
            pk, at = line.split()
            commits.append((int(pk), float(at)))
    return commits
