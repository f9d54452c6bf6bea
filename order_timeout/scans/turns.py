"""The fleet's housekeeping: the compensation scan and the prune, each run by one process at a time,
whoever's turn comes first (a consumer's housekeeping thread, Celery beat, a command).

A job is due when its last complete run started at least its interval ago (``COMPENSATION_INTERVAL``,
``PRUNE_INTERVAL``), by the database's clock: one clock for every host, the one every deadline is
judged by. Its runner holds a lock with a
fencing token, renewed between chunks: a runner that dies or freezes loses it within
``COMPENSATION_LOCK_SECONDS``, and since it never recorded a complete run, the next process to ask
finds the job still due and runs it (each chunk is idempotent: a row acted on again is judged again
under its lock; a row deleted again is already gone). A runner that froze past its lease learns it at
its next renewal and stops; its end is recorded only while it still holds the lock.

Redis unreachable: the scan runs without its lock (the database is the truth, and the safety net must
work when Redis does not), at most once per interval in each process; the prune waits for Redis.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError, router

from ..conf import settings
from ..db.session import database_now
from ..exceptions import QueueUnavailable
from ..models import DeadLetter
from ..queue import TimeoutQueue
from ..queue.housekeeping import HELD, NOT_DUE, TAKEN, Housekeeping
from ..redaction import one_line
from ..timers.members import now_score
from . import refusals
from .compensation import CompensationScan, ScanResult
from .pruning import Prune, PruneResult

logger = logging.getLogger("order_timeout")

SCAN, PRUNE = "scan", "prune"


def where() -> str:
    """This process, as the status names a job's runner."""
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass
class Turn:
    """A job's turn, taken: its token is the fence every renewal and the end are checked against."""

    job: str
    token: str
    housekeeping: Housekeeping
    ttl_ms: int
    # Set once a renewal found the lock gone (another runner may hold it): the run stops.
    lost: bool = False

    def renew(self) -> bool:
        if not self.lost and not self.housekeeping.renew_turn(self.job, self.token, self.ttl_ms):
            logger.warning("%s: this run's turn lapsed (it outran COMPENSATION_LOCK_SECONDS between two "
                           "chunks, or froze); stopping, the next runner goes on", self.job)
            self.lost = True
        return not self.lost

    def end(self, *, complete: bool, figures: dict[str, Any]) -> None:
        try:
            if not self.housekeeping.end_turn(self.job, self.token, complete=complete, figures=figures,
                                              now_ms=database_now_ms()):
                logger.warning("%s: ended after its turn lapsed: its end is not recorded", self.job)
        except QueueUnavailable as error:
            logger.warning("%s: could not record its end (%s); its lock lapses by itself", self.job, error)
        except DatabaseError as error:
            logger.warning("%s: could not read the database's clock to record its end (%s); its lock lapses "
                           "by itself", self.job, one_line(error))


def database_now_ms() -> int:
    """The database's clock (the app's own tables' database), in ms: every turn is judged by it."""
    return now_score(database_now(router.db_for_write(DeadLetter)))


def take_turn(job: str, runner: str, *, interval: float | None, queue: TimeoutQueue | None = None
              ) -> Turn | None:
    """The job's turn for this process, or None (not due, or another runner holds it).

    ``interval`` None: due whatever ran before (asked for by hand), yet never beside another run.
    Raises QueueUnavailable when Redis cannot say.
    """
    housekeeping = (queue or TimeoutQueue.from_settings()).housekeeping
    token = uuid.uuid4().hex
    ttl_ms = round(1000 * settings.COMPENSATION_LOCK_SECONDS)
    status = housekeeping.take_turn(job, token, ttl_ms, 0 if interval is None else round(1000 * interval),
                                    where(), runner, database_now_ms())
    if status == TAKEN:
        return Turn(job, token, housekeeping, ttl_ms)
    if status == HELD:
        # Every consumer asks every few seconds while one runs it: nothing worth a line at INFO.
        logger.debug("%s skipped: another process runs it now", job)
    else:
        assert status == NOT_DUE
    return None


def run_scan(runner: str, *, due_only: bool = True, stop: threading.Event | None = None,
             exit_when_stuck: bool = False, lockless: bool = True, **options: Any) -> ScanResult | None:
    """The scan (heal, then close what is overdue and dropped) if it is this process's turn; None if not.

    ``due_only`` False: now, whatever ran before (the command), yet never beside another scan.
    ``lockless`` False: with Redis unreachable, do nothing (this process ran one without its lock
    less than an interval ago).
    """
    try:
        turn = take_turn(SCAN, runner, interval=settings.COMPENSATION_INTERVAL if due_only else None)
    except QueueUnavailable as error:
        if not lockless:
            return None
        logger.warning("scan: cannot take its turn in Redis (%s); running without its lock", error)
        return CompensationScan(heal=True, stop=stop, exit_when_stuck=exit_when_stuck, **options).run()
    if turn is None:
        return None
    result: ScanResult | None = None
    try:
        result = CompensationScan(heal=True, held_lock=turn.token, stop=stop, exit_when_stuck=exit_when_stuck,
                                  **options).run()
        if not (result.lock_lost or result.stopped or options.get("dry_run")):
            _settle_refused_writes()
    finally:
        # A scan that raised (the database gone) is not complete: the next turn runs it again at once.
        turn.end(complete=result is not None and not (result.lock_lost or result.stopped or turn.lost),
                 figures={} if result is None else scan_figures(result))
    return result


def _settle_refused_writes() -> None:
    """After the scan: the refused writes whose rows reached what they tried, marked settled by
    themselves (scans/refusals.py). A failure is logged: the scan's turn stands."""
    try:
        refusals.settle()
    except DatabaseError as error:
        logger.warning("refused writes not settled this turn (%s: %s)", type(error).__name__, one_line(error))


def run_prune(runner: str, *, due_only: bool = True, budget: float | None = None,
              stop: threading.Event | None = None, **options: Any) -> PruneResult | None:
    """The prune if it is this process's turn (None if not, or with ``PRUNE_INTERVAL`` None and
    ``due_only``). A run that stops at ``budget`` with rows left is not complete: the next turn,
    whoever takes it, goes on at once."""
    interval = settings.PRUNE_INTERVAL
    if due_only and interval is None:
        return None
    try:
        turn = take_turn(PRUNE, runner, interval=interval if due_only else None)
    except QueueUnavailable as error:
        logger.warning("prune skipped: cannot take its turn in Redis (%s); the next turn tries again", error)
        return None
    if turn is None:
        return None
    result: PruneResult | None = None
    try:
        result = Prune(budget=budget, between_chunks=_between_chunks(turn, stop), **options).run()
    finally:
        turn.end(complete=result is not None and result.complete and not turn.lost,
                 figures={} if result is None else {"deleted": sum(result.deleted.values())})
    return result


def _between_chunks(turn: Turn, stop: threading.Event | None) -> Callable[[], bool]:
    """Whether the prune may go on: its turn renewed, and no stop asked."""
    def go_on() -> bool:
        if stop is not None and stop.is_set():
            return False
        try:
            return turn.renew()
        except QueueUnavailable:
            return False
    return go_on


def scan_figures(result: ScanResult) -> dict[str, Any]:
    """What the status shows of a scan: what it did, every kind added up."""
    kinds = [result, *result.timers.values()]
    return {name: sum(getattr(figures, name) for figures in kinds)
            for name in ("examined", "closed", "restored", "missing_from_redis", "dead_lettered", "failed")}
