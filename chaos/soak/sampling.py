"""One sample of everything the soak watches, taken every ``Plan.sample_every`` seconds.

A sample is plain data (it goes to results.json as it is): the moment, the orders created so
far (the x of every fit), each app table, each Redis key pattern, each consumer's memory and open
files, the harness's own memory, the connections, and the orders open past the scan's bound.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any

from django.db.models import F
from django.utils import timezone
from django_redis import get_redis_connection

from order_timeout import get_order_model
from order_timeout.conf import settings
from order_timeout.models import DeadLetter, Reminder

from . import keyspace, memory, tables


@dataclass
class Sample:
    at: float
    orders: int
    # "stream" while orders come (the fits use these), "settle" after.
    phase: str
    tables: dict[str, dict[str, int]]
    keys: dict[str, dict[str, int]]
    redis: dict[str, int]
    # Per consumer slot: its pid now, RSS (kB) and open files (None: restarting at that moment).
    consumers: list[dict[str, Any]]
    harness_rss_kb: int | None
    database_connections: int
    # Unpaid orders past their deadline by more than the scan's bound with no open dead letter.
    open_past_bound: int
    # Reminders the app recorded as sent at or after their deadline (its own clock: the database's).
    late_reminders: int
    # The machine's 1-minute load average: other work on it shows here.
    load: float = 0.0
    took: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def open_past_bound(bound: float) -> int:
    """Unpaid orders whose deadline passed more than ``bound`` seconds ago, and that no open dead
    letter holds: what the scan should have closed by now. Few rows in any healthy run (the
    ``(status, expires_at)`` index), so read whole."""
    model = get_order_model()
    overdue = set(model._base_manager.filter(model.unpaid_q(), expires_at__lt=timezone.now() - timedelta(seconds=bound))
                  .values_list("pk", flat=True))
    if not overdue:
        return 0
    held = {int(pk) for pk in DeadLetter.objects.filter(resolved_at__isnull=True, timer="",
                                                       order_model=model._meta.label)
            .values_list("order_id", flat=True)}
    return len(overdue - held)


def late_reminders() -> int:
    """The app's reminder records that say sent at or after the deadline. Read at every sample: the
    prune deletes a record ``REMINDER_RETENTION`` after its deadline, and a reminder comes a lead
    before it, so with a retention and a lead longer together than the time between two samples
    (33 s against 20 s by default) every record is read at least once."""
    return Reminder.objects.filter(outcome=Reminder.Outcome.SENT, at__gte=F("deadline")).count()


def take(at: float, orders: int, phase: str, pids: list[int], bound: float) -> Sample:
    """Read everything once, now (a few hundred milliseconds: it is not on the consumers' path)."""
    began = time.monotonic()
    client = get_redis_connection(settings.REDIS_ALIAS)
    consumers = [{"slot": slot, "pid": pid, "rss_kb": memory.rss_kb(pid), "open_files": memory.open_files(pid)}
                 for slot, pid in enumerate(pids)]
    sample = Sample(
        at=round(at, 2), orders=orders, phase=phase,
        tables={name: asdict(figure) for name, figure in tables.table_figures().items()},
        keys={pattern: asdict(figure) for pattern, figure in keyspace.key_figures(client, settings.KEY_PREFIX).items()},
        redis=keyspace.server_figures(client), consumers=consumers, harness_rss_kb=memory.rss_kb(os.getpid()),
        database_connections=tables.connections(), open_past_bound=open_past_bound(bound),
        late_reminders=late_reminders(), load=round(os.getloadavg()[0], 2))
    sample.took = round(time.monotonic() - began, 3)
    return sample
