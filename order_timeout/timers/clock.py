"""A consumer's clock: this host's, corrected to the database's from what each batch read.

The database decides whether a row is due; the consumer claims by the
database's time (erring late), so a host whose clock runs fast does not claim
early. Tests that step time by hand pass their own ``now`` and
``follow_database=False``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from datetime import datetime, timedelta

from django.utils import timezone

from ..db.session import database_now

# The database-minus-host clock offset is the largest of this many recent readings.
CLOCK_SAMPLES = 20


class DatabaseClock:
    def __init__(self, now: Callable[[], datetime] | None = None, *, follow_database: bool = True) -> None:
        self.now = now or timezone.now
        self.follow_database = follow_database
        # Database clock minus this host's, from recent batches (each reading errs low).
        self.readings: deque[timedelta] = deque(maxlen=CLOCK_SAMPLES)

    @property
    def offset(self) -> timedelta:
        return max(self.readings, default=timedelta(0))

    def __call__(self) -> datetime:
        """This host's time, corrected to the database's.

        Each reading errs low, so the corrected clock is not ahead of the
        database's, except after this host's clock steps forward: until the
        readings taken before the step age out (``CLOCK_SAMPLES`` batches) it
        runs ahead by the step. The database still decides whether a row is
        due, so that costs a look at rows not due yet, never an early act.
        """
        return self.now() + self.offset

    def learn(self, db_now: datetime | None) -> None:
        if db_now is not None and self.follow_database:
            # Read after the statement returned: the reading is the true offset minus that delay.
            self.readings.append(db_now - self.now())

    def sync(self, using: str) -> None:
        """Read the database's clock once (at start, before the first claim)."""
        self.learn(database_now(using))
