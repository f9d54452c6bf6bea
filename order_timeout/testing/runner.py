"""Acting on what is due, in a test's own process, connection and transaction, as a consumer would.

``run_due()`` is the kit's runner. With a Redis (the default), it takes the consumer's own path:
what the test's transaction would tell Redis when it commits is told now, then every batch due is
claimed, leased, locked, judged, acted on (receivers, notices written) and acked, by the one
lifecycle (``Consumer.drain``), until nothing is due. With ``TESTING_WITHOUT_REDIS``, it finds
what is due from the rows themselves, as the compensation scan reads them, and acts on it through
the same database side of the lifecycle (``acting.act_on``: lock, judge, act). Either way the
database's clock decides, moved by ``travel`` when the test says so (testing/time_travel.py), and the
notices are delivered on the test's thread, where its transaction is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial
from itertools import chain

from django.db import connections

from ..conf import settings
from ..db.session import database_now
from ..scans import walks
from ..timers.acting import act_on
from ..timers.kind import Kind
from ..timers.members import now_score
from ..timers.outcome import Report
from ..timers.pausing import paused_names
from ..timers.registry import NOTICES, registry
from ..timers.syncing import tells_redis

# Passes at most: each acts on what the one before made due (a close's notices); a held order is
# due at every pass and acted on at none, so a pass that acts on nothing ends the run.
MOST_PASSES = 10


@dataclass
class Ran:
    """What ``run_due`` did, per timer (by its label: "close", "reminders", "notices", a declared
    timer's name), in the lifecycle's words; read as one: ``ran.acted``, ``ran.held``."""

    reports: dict[str, Report] = field(default_factory=dict)

    def of(self, timer: str) -> Report:
        """The report of one timer (an empty one if it had nothing due)."""
        return self.reports.get(timer, Report())

    def __getattr__(self, name: str) -> int:
        if name.startswith("_") or name not in Report.__dataclass_fields__ or name in ("timing", "moments"):
            raise AttributeError(name)
        return sum(getattr(report, name) for report in self.reports.values())

    def add(self, label: str, report: Report) -> None:
        self.reports.setdefault(label, Report()).add(report)


def run_due(*timers: str) -> Ran:
    """Act on everything due now (by the database's clock, as ``travel`` moved it), in this process
    and on this connection, as a consumer would; every timer, or the ones named (by label or
    name: ``"close"``, ``"reminders"``, ``"notices"``, a declared timer's). Works inside a test's
    transaction (``TestCase``, pytest-django's default ``django_db``) and outside one."""
    kinds = _kinds(timers)
    ran = Ran()
    with NOTICES.delivering_here():  # on this thread, where the test's transaction is
        for _ in range(MOST_PASSES):
            acted = _pass_without_redis(kinds, ran) if settings.TESTING_WITHOUT_REDIS else _pass(kinds, ran)
            if not acted:
                break
    return ran


def _kinds(timers: Sequence[str]) -> list[Kind]:
    every = [*registry.kinds(), *([] if NOTICES in registry.kinds() else [NOTICES])]
    if not timers:
        return every
    chosen = [kind for kind in every if kind.label in timers or (kind.name and kind.name in timers)]
    unknown = set(timers) - {kind.label for kind in chosen} - {kind.name for kind in chosen}
    if unknown:
        raise LookupError(f"no timer named {', '.join(sorted(unknown))}; there are "
                          f"{', '.join(kind.label for kind in every)}")
    return chosen


# -- with Redis: the consumer's own path ----------------------------------------------------------


def _pass(kinds: list[Kind], ran: Ran) -> int:
    """Tell Redis what the test's transaction would on commit, then drain every kind's due batches."""
    from ..consumer import Consumer

    tell_redis_now()
    using = kinds[0].using if kinds else "default"
    consumer = Consumer(kinds=kinds, now=partial(database_now, using), follow_database_clock=False)
    consumer.drain(partial(database_now, using))
    acted = 0
    for totals in consumer.stats.kinds.values():
        ran.add(totals.kind.label, totals.report)
        acted += totals.report.acted + totals.report.passed
    tell_redis_now()  # what the acts wrote (a close's notices) reaches Redis for the next pass
    return acted


def tell_redis_now() -> int:
    """What the open transactions of this thread would tell Redis when they commit (the members of
    rows saved, notices written), told now; how many such commits. A test's transaction never
    commits, so the consumer's path would see none of its rows."""
    told = 0
    for connection in connections.all(initialized_only=True):
        if not connection.in_atomic_block:
            continue
        ours = [entry for entry in connection.run_on_commit if tells_redis(entry[1])]
        if not ours:
            continue
        connection.run_on_commit = [entry for entry in connection.run_on_commit if not tells_redis(entry[1])]
        for entry in ours:
            entry[1]()
            told += 1
    return told


# -- without Redis: what is due, from the rows ----------------------------------------------------


def _pass_without_redis(kinds: list[Kind], ran: Ran) -> int:
    """Each kind's due members, found from its rows, acted on through the lifecycle's database side."""
    paused = paused_names()
    acted = 0
    for kind in kinds:
        if kind.label in paused:
            continue
        now = database_now(kind.using)
        members = due_members(kind, now)
        for start in range(0, len(members), settings.BATCH_SIZE):
            by_key, malformed = kind.keys_of(members[start:start + settings.BATCH_SIZE])
            outcome = act_on(kind, list(by_key))
            report = Report(claimed=len(by_key) + len(malformed), dropped=len(malformed))
            report.count(outcome)
            ran.add(kind.label, report)
            acted += report.acted + report.passed
    return acted


def due_members(kind: Kind, now: datetime) -> list[str]:
    """The members of ``kind`` due by ``now``, as Redis would hold them, read from the rows: those
    pending with a deadline past, and those falling due before their deadline (a reminder's lead)."""
    chunk = settings.COMPENSATION_CHUNK
    rows = chain(chain.from_iterable(walks.overdue(kind, now + timedelta(microseconds=1), chunk)),
                 chain.from_iterable(walks.upcoming(kind, now, now, chunk)))
    due_ms = now_score(now)
    scores = kind.scores(list(rows))
    return sorted((member for member, score in scores.items() if score <= due_ms), key=scores.__getitem__)
