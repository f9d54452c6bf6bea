"""The prune: delete what the app wrote and no longer needs, each kind of row after an age of its own.

What it deletes, and from when each age counts (``ORDER_TIMEOUT``; None keeps them for ever):

- notices delivered (``NOTICE_RETENTION`` from their delivery) or dropped (from when they were due);
- reminder records (``REMINDER_RETENTION`` from the deadline they were for: past it no reminder is
  ever sent, so the record guards nothing);
- dead letters staff resolved (``DEAD_LETTER_RETENTION`` from their resolution), and, in Redis,
  the members a claim moved into a quarantine because they name no row (as long after they were
  moved: they are for a person to look at, as dead letters are);
- refused writes staff marked handled (``DEAD_LETTER_RETENTION`` from when they did), and
  timers' pauses staff ended (``DEAD_LETTER_RETENTION`` from the resume).

Never a pending notice, an open dead letter, a refused write not handled yet nor an open pause: those wait for a
consumer or for staff. The ages
are measured by the database's clock, the one that judges a reminder's deadline.

Each chunk is a plain read of at most ``PRUNE_CHUNK`` primary keys along an index, then those rows
deleted by key in a short transaction of their own (``db.deleting``): it locks only the rows it
deletes, none of which a payment, a close or a checkout ever waits on, and no range (a range, or a
whole table scanned, on MySQL would lock the gaps where the consumers and checkouts insert). Run once per
``PRUNE_INTERVAL`` by whoever's turn comes first (a consumer, the beat task: ``scans/turns.py``), and by
``manage.py order_timeout_prune``, one run at a time.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import models, router
from django.db.models import Q
from django.utils import timezone

from ..conf import settings
from ..db.deleting import delete_keys
from ..db.session import database_now
from ..exceptions import QueueUnavailable
from ..models import DeadLetter, Notice, Pause, RefusedWrite, Reminder
from ..queue import TimeoutQueue
from ..queue.keys import CLOSE, NOTICE, REMIND
from ..timers.members import now_score
from ..timers.registry import registry

logger = logging.getLogger("order_timeout")

# progress(done, total): called after each chunk.
Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class Retention:
    """One kind of row the prune deletes: which, past which age, walked along which indexed column."""

    # The name it is counted under (logs, metrics, the status command).
    table: str
    model: type[models.Model]
    # The ORDER_TIMEOUT key of its age.
    setting: str
    # The rows past their age, given the moment the age ends (the cutoff).
    expired: Callable[[datetime], Q]
    # The column the expired rows are read along (an index leads with it, or with ``state`` first).
    along: str

    def age(self) -> float | None:
        value = getattr(settings, self.setting)
        return None if value is None else float(value)


RETENTIONS = (
    # A notice is delivered at or after it is due: the due time bounds the index range, the delivery
    # time decides.
    Retention("notices", Notice, "NOTICE_RETENTION",
              lambda cutoff: Q(state=Notice.State.DELIVERED, due_at__lt=cutoff, delivered_at__lt=cutoff), "due_at"),
    Retention("notices", Notice, "NOTICE_RETENTION",
              lambda cutoff: Q(state=Notice.State.DROPPED, due_at__lt=cutoff), "due_at"),
    Retention("reminders", Reminder, "REMINDER_RETENTION", lambda cutoff: Q(deadline__lt=cutoff), "deadline"),
    Retention("dead_letters", DeadLetter, "DEAD_LETTER_RETENTION",
              lambda cutoff: Q(resolved_at__lt=cutoff), "resolved_at"),
    # Staff's to-do list, as dead letters are: gone only once handled (never while open: NULL < cutoff is
    # never true).
    Retention("refused_writes", RefusedWrite, "DEAD_LETTER_RETENTION",
              lambda cutoff: Q(handled_at__lt=cutoff), "handled_at"),
    # Staff's record of an outage: kept as long as what they resolved; an open pause never goes.
    # A few rows a year, so no index leads with the column.
    Retention("pauses", Pause, "DEAD_LETTER_RETENTION", lambda cutoff: Q(resumed_at__lt=cutoff), "resumed_at"),
)


def tables() -> list[str]:
    """The names the prune counts under, each once, in the order it deletes them."""
    return list(dict.fromkeys(retention.table for retention in RETENTIONS))


@dataclass
class PruneResult:
    dry_run: bool = False
    # Rows deleted (or, with dry_run, that would be), by table.
    deleted: dict[str, int] = field(default_factory=lambda: dict.fromkeys(tables(), 0))
    # Members deleted from the queues' quarantines (None: Redis could not be reached).
    quarantine_trimmed: int | None = 0
    # False when it stopped at its time budget with rows left: the next run goes on.
    complete: bool = True
    elapsed_ms: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Prune:
    """One run: each retention's expired rows deleted a chunk at a time, oldest first."""

    def __init__(self, *, dry_run: bool = False, chunk_size: int | None = None, budget: float | None = None,
                 progress: Progress | None = None, between_chunks: Callable[[], bool] | None = None) -> None:
        self.dry_run = dry_run
        # Asked after each chunk whether to go on (the fleet's turn renewed: scans/turns.py).
        self.between_chunks = between_chunks
        self.chunk_size = chunk_size or settings.PRUNE_CHUNK
        # Seconds this run may take before it stops between two chunks (None: until done).
        self.budget = budget
        self.progress = progress
        self.result = PruneResult(dry_run=dry_run)

    def run(self) -> PruneResult:
        started = time.monotonic()
        rules = [(rule, self._expired(rule)) for rule in RETENTIONS if rule.age() is not None]
        if self.dry_run:
            for rule, rows in rules:
                self.result.deleted[rule.table] += rows.count()
        total = sum(self.result.deleted.values()) if self.dry_run or not self.progress \
            else sum(rows.count() for _rule, rows in rules)
        done = 0
        for rule, rows in [] if self.dry_run else rules:
            for deleted in self._delete(rule, rows):
                self.result.deleted[rule.table] += deleted
                done += deleted
                if self.progress:
                    self.progress(done, max(total, done))
                if self.budget is not None and time.monotonic() - started > self.budget \
                        or self.between_chunks is not None and not self.between_chunks():
                    self.result.complete = False
                    break
            if not self.result.complete:
                break
        if self.dry_run and self.progress:
            self.progress(total, total)
        if not self.dry_run and self.result.complete:
            self.result.quarantine_trimmed = self._trim_quarantines()
        self.result.elapsed_ms = round((time.monotonic() - started) * 1000, 1)
        self._report()
        return self.result

    def _expired(self, rule: Retention) -> models.QuerySet[Any]:
        using = router.db_for_write(rule.model)
        age = rule.age()
        assert age is not None
        cutoff = database_now(using) - timedelta(seconds=age)
        return rule.model._base_manager.db_manager(using).filter(rule.expired(cutoff))

    def _delete(self, rule: Retention, rows: models.QuerySet[Any]) -> Iterator[int]:
        """Delete ``rows`` a chunk at a time, oldest first; yields how many each chunk deleted."""
        ordered = rows.order_by(rule.along).values_list("pk", flat=True)
        while True:
            keys = list(ordered[:self.chunk_size])
            if not keys:
                return
            # By key alone (db/deleting.py): a row past its age stays past it (a delivered notice,
            # a resolved dead letter and a reminder's deadline never change back).
            yield delete_keys(rule.model, rows.db, keys)
            if len(keys) < self.chunk_size:
                return

    @staticmethod
    def _trim_quarantines() -> int | None:
        age = settings.DEAD_LETTER_RETENTION
        if age is None:
            return 0
        before_ms = now_score(timezone.now()) - round(1000 * age)
        try:
            queue = TimeoutQueue.from_settings()
            # Every queue the app has, whether configured now or not (reminders turned off leave theirs).
            spaces = dict.fromkeys([CLOSE, REMIND, NOTICE, *(kind.key_space for kind in registry.declared())])
            return sum(queue.of_kind(space).trim_quarantine(before_ms) for space in spaces)
        except QueueUnavailable as error:
            logger.warning("prune could not trim the quarantine (%s); the next prune does", error)
            return None

    def _report(self) -> None:
        deleted = self.result.deleted
        verb = "would delete" if self.dry_run else "deleted"
        logger.info("prune %s " + " ".join(f"{table}=%d" for table in deleted)
                    + " quarantine=%s complete=%s elapsed_ms=%s", verb, *deleted.values(),
                    self.result.quarantine_trimmed, self.result.complete, self.result.elapsed_ms,
                    extra={"prune": self.result.as_dict()})
        if self.dry_run:
            return
        try:
            TimeoutQueue.from_settings().housekeeping.record_prune(deleted, now_score(timezone.now()))
        except QueueUnavailable as error:
            # The rows are gone either way; only the figures the metrics and the admin show are late.
            logger.warning("prune could not record its figures in Redis (%s)", error)


def prune(**options: Any) -> PruneResult:
    """Run the prune once; see ``Prune`` for the options."""
    return Prune(**options).run()
