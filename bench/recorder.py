"""When did each close commit? The same ``order_expired`` receiver in every system's closer.

The receiver only registers an ``on_commit`` callback, so it costs every
system the same few microseconds and no query. Each process writes its
``(order id, commit time)`` pairs to BENCH_RECORD_DIR when it exits; a close
that was rolled back never commits and is never recorded.

With BENCH_RECORD_EAGER=1 (the crash workload's closers only) each pair is
written the moment it commits instead, one ``write`` to a file opened with
O_APPEND, so the records of a process killed with SIGKILL survive it; the
other workloads keep the cheap records at exit.

With BENCH_RECORD_KEYS=1 (our rows but the per-order one) the recorder is no receiver at
all: ``Consumer.process`` is wrapped, and when a batch of the order close returns (its COMMIT
behind it) the keys it closed (its report's ``moments.due``) are stamped together, the way the
floor records its own after its COMMIT (the crash workload's closers, BENCH_RECORD_EAGER=1, keep
an ``order_keys_expired`` receiver: ``on_keys_expired``). A row with no receiver of its own then builds no
instance, sends no signal and keeps the two-round-trip transaction of a batch that runs none
of the shop's code (db/two_trips.py), as a shop with no receiver does; an ``order_keys_expired``
receiver, as before, took it off that path.

With BENCH_RECORD_AT_COMMIT=1 (the notices rows) every order of a transaction
is recorded at one instant, its COMMIT's, taken by the transaction's first
``on_commit`` callback: a row whose own receivers register slow callbacks after
the recorder's (the Celery peer's ``delay()`` per order, bench/peers/celery_notices.py)
would otherwise record each order when the publishes before it were done, and
its notices' lateness after the commit would read shorter than it is.
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


class _AtCommit:
    """The orders of one transaction, recorded together when it commits (BENCH_RECORD_AT_COMMIT)."""

    def __init__(self, hooks: list[Any]) -> None:
        # The connection's list of on_commit callbacks this transaction fills: Django starts a
        # new list once they ran (or were thrown away by a rollback), so a new transaction is
        # told by a new list. Kept referenced, so its identity is never reused.
        self.hooks = hooks
        self.pks: list[int] = []
        self.done = False

    def stamp(self) -> None:
        self.done = True
        at = time.time()
        if eager():
            append([(pk, at) for pk in self.pks])
        else:
            _commits.extend((pk, at) for pk in self.pks)


_open: _AtCommit | None = None


def on_expired_at_commit(sender: Any, order: Any, **kwargs: Any) -> None:
    global _open
    hooks = transaction.get_connection().run_on_commit
    if _open is None or _open.done or _open.hooks is not hooks:
        _open = _AtCommit(hooks)
        _open.pks.append(order.pk)
        transaction.on_commit(_open.stamp)  # outside a transaction: runs now, with this order
        return
    _open.pks.append(order.pk)


def on_keys_expired(sender: Any, keys: list[Any], **kwargs: Any) -> None:
    """``order_keys_expired``, in the crash workload's closers (BENCH_RECORD_KEYS=1 and
    BENCH_RECORD_EAGER=1): the batch's keys stamped at its COMMIT, so that a SIGKILL right after
    it loses no record; the report, which ``record_from_reports`` stamps from, comes back a moment
    later. The receiver keeps such a batch in Django's ``atomic``: what the crash workload
    measures is the recovery, not the close's speed."""
    pks = list(keys)
    transaction.on_commit(lambda: stamp(pks))


def stamp(pks: list[Any]) -> None:
    """These closes committed now."""
    at = time.time()
    if eager():
        append([(pk, at) for pk in pks])
    else:
        _commits.extend((pk, at) for pk in pks)


def record_from_reports() -> None:
    """BENCH_RECORD_KEYS=1: each batch of the order close stamps the keys it closed as
    ``Consumer.process`` returns, from its report; no receiver is connected."""
    from order_timeout.consumer import Consumer
    from order_timeout.timers.closes import OrderTimeout

    process = Consumer.process

    def recording(self: Consumer, claim: Any, now: Any) -> Any:
        report = process(self, claim, now)
        if report.moments is not None and report.moments.due and isinstance(self.kind_of(claim)[0], OrderTimeout):
            stamp(list(report.moments.due))
        return report

    setattr(Consumer, "process", recording)  # noqa: B010 (mypy: no assigning a method)


def records_keys() -> bool:
    return os.environ.get("BENCH_RECORD_KEYS") == "1"


def receiver() -> Callable[..., None]:
    """The ``order_expired`` receiver this process records with."""
    if os.environ.get("BENCH_RECORD_AT_COMMIT") == "1":
        return on_expired_at_commit
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


def first_commits(commits: Iterable[tuple[int, float]]) -> tuple[dict[int, float], set[int]]:
    """Each order's first commit record, and the orders recorded more than once (closed twice)."""
    first: dict[int, float] = {}
    twice = set()
    for pk, at in commits:
        if pk in first:
            twice.add(pk)
        first[pk] = min(at, first.get(pk, at))
    return first, twice
