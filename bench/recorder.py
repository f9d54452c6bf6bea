"""When did each close commit? The same ``order_expired`` receiver in every system's closer.

The receiver only registers an ``on_commit`` callback, so it costs every
system the same few microseconds and no query. Each process writes its
``(order id, commit time)`` pairs to BENCH_RECORD_DIR when it exits; a close
that was rolled back never commits and is never recorded.

With BENCH_RECORD_EAGER=1 (the crash workload's closers only) each pair is
written the moment it commits instead, one ``write`` to a file opened with
O_APPEND, so the records of a process killed with SIGKILL survive it; the
other workloads keep the cheap records at exit.
"""

from __future__ import annotations

import atexit
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from django.db import transaction

_commits: list[tuple[int, float]] = []
# This process's eager records file (pid, descriptor): a prefork child opens its own.
_eager: tuple[int, int] | None = None


def eager() -> bool:
    return os.environ.get("BENCH_RECORD_EAGER") == "1" and bool(os.environ.get("BENCH_RECORD_DIR"))


def on_expired(sender: Any, order: Any, **kwargs: Any) -> None:
    pk = order.pk
    transaction.on_commit(lambda: _commits.append((pk, time.time())))


def on_expired_eager(sender: Any, order: Any, **kwargs: Any) -> None:
    pk = order.pk
    transaction.on_commit(lambda: append([(pk, time.time())]))


def receiver() -> Callable[..., None]:
    """The ``order_expired`` receiver this process records with."""
    return on_expired_eager if eager() else on_expired


def append(commits: Iterable[tuple[int, float]]) -> None:
    """Write these pairs to this process's file now: in the kernel once this returns."""
    global _eager
    pid = os.getpid()
    if _eager is None or _eager[0] != pid:
        path = Path(os.environ["BENCH_RECORD_DIR"]) / f"commits-{pid}.txt"
        _eager = (pid, os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644))
    os.write(_eager[1], "".join(f"{pk} {at:.6f}\n" for pk, at in commits).encode())


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
