"""What became of the members of one claim (or one scan chunk): one vocabulary for every kind.

The database side (``acting``) fills an ``Outcome`` per key; the lifecycle
(``lifecycle``) turns it into acks, reschedules and retries and a ``Report``.
Each kind's wording (reporting/wording.py) names the categories where people
read them (log lines, metric labels: a close is "closed", a reminder "sent").
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime
from typing import Any

# What one key of a kind is: an order's primary key, (pk, lead) for a reminder.
Key = Any
# One key with its locked row (or what its act reads of it), due now.
Due = tuple[Key, Any]


@dataclass
class Outcome:
    """What became of each key handed to ``acting.act_on``."""

    # Acted on: closed, sent, released, completed.
    acted: list[Key] = field(default_factory=list)
    # Nothing to do now or ever: settled (paid), done before, no deadline any more.
    settled: list[Key] = field(default_factory=list)
    # Due and pending by its own columns, but the settled condition settles it (paid by another
    # column): key -> its deadline. Not acted on, and its deadline stays: looked at again every
    # HOLD_RECHECK, so a row that stops being settled (a refund) is acted on at the next look.
    kept: dict[Key, datetime] = field(default_factory=dict)
    # Passed over at its moment and recorded so (a reminder whose order was held): done.
    passed: list[Key] = field(default_factory=list)
    # No such row (deleted, or a member from another database).
    missing: list[Key] = field(default_factory=list)
    # Row locked by another transaction, or lock conflicts on every immediate retry:
    # skipped rather than waited for, so it cannot stall the batch; not a failure.
    busy: list[Key] = field(default_factory=list)
    # Its moment is still ahead (the deadline moved): key -> that moment.
    not_due: dict[Key, datetime] = field(default_factory=dict)
    # Due, but the hold condition holds it (a payment in flight), within its longest hold:
    # key -> the row's deadline. Left as it is, to be looked at again.
    held: dict[Key, datetime] = field(default_factory=dict)
    # Acting raised (a receiver, usually): key -> the exception; the row is left as it was.
    failed: dict[Key, BaseException] = field(default_factory=dict)
    # Not looked at: the caller asked to stop (its batch ran out of time).
    abandoned: list[Key] = field(default_factory=list)
    # The database's clock when it locked the rows (None if no row was locked).
    db_now: datetime | None = None
    # The moments of the keys acted on (deadline, or deadline minus a reminder's lead): their lateness.
    moments: dict[Key, datetime] = field(default_factory=dict)

    def merge(self, other: Outcome) -> None:
        for item in fields(self):
            mine, theirs = getattr(self, item.name), getattr(other, item.name)
            if isinstance(mine, list):
                mine += theirs
            elif isinstance(mine, dict):
                mine.update(theirs)
        self.db_now = other.db_now or self.db_now


@dataclass(frozen=True)
class Timing:
    """How a watched batch went: seconds from its watch's start to its settling, whether it was given
    up for time, and how many keys' receivers had run by then (the consumer sizes its claims by it)."""

    seconds: float
    given_up: bool
    done: int


@dataclass(frozen=True)
class Moments:
    """A batch by the database-corrected clock: seconds from its claim to its settling, and when its
    acts committed against the moment each was due (its lateness, counted only when asked for)."""

    seconds: float
    acted_at: datetime
    due: Mapping[Key, datetime]

    def lateness(self) -> Iterator[float]:
        return ((self.acted_at - moment).total_seconds() for moment in self.due.values())


@dataclass
class Report:
    """What one batch did, in the lifecycle's words; a kind's wording names them for people."""

    claimed: int = 0
    acted: int = 0
    settled: int = 0
    passed: int = 0
    rescheduled: int = 0
    busy: int = 0
    held: int = 0
    failed: int = 0
    given_up: int = 0
    dropped: int = 0
    abandoned: int = 0
    # The batch's timing (None when no guard watched it: outside ``run()``); not a count, not added.
    timing: Timing | None = None
    # The batch by the database-corrected clock (None until it is settled); not a count, not added.
    moments: Moments | None = None

    def count(self, outcome: Outcome) -> None:
        """Add what became of each key of ``outcome`` (its rows missing count as dropped)."""
        self.acted += len(outcome.acted)
        self.passed += len(outcome.passed)
        self.settled += len(outcome.settled) + len(outcome.kept)
        self.rescheduled += len(outcome.not_due)
        self.busy += len(outcome.busy)
        self.held += len(outcome.held)
        self.failed += len(outcome.failed)
        self.abandoned += len(outcome.abandoned)
        self.dropped += len(outcome.missing)

    def add(self, other: Report) -> None:
        for item in fields(self):
            if item.name not in ("timing", "moments"):
                setattr(self, item.name, getattr(self, item.name) + getattr(other, item.name))

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
