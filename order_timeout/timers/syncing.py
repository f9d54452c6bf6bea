"""Redis follows rows after commit: what one commit tells each kind's queue, sent once it committed.

The one path by which a save, a ``schedule()`` or a batch of new notices
reaches Redis, for every kind of timer: each kind says what Redis must hold
for a row (its ``follow``); the changes are gathered per database and sent
with ``transaction.on_commit``, so a rolled-back row never reaches Redis. A
Redis failure is logged, never raised: the row is committed already and the
compensation scan catches up with it. Below ``scheduling`` (the order model's
bridge) and beside the kinds, which import it: nothing here imports either.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

from django.db import router, transaction

from ..conf import settings
from ..queue import TimeoutQueue
from ..queue.keys import kind_name
from ..redaction import masked, one_line


class Follows(Protocol):
    """What a kind says Redis must hold for a row: its members and scores, or members to drop."""

    @property
    def key_space(self) -> str: ...

    def follow(self, row: Any) -> tuple[dict[str, int], list[str]]: ...


logger = logging.getLogger("order_timeout")


def _database(row: Any) -> str:
    return row._state.db or router.db_for_write(type(row), instance=row)


@dataclass
class _Change:
    """What one commit tells the queue, per kind of timer, and the copies to mark as told once it has."""

    deadlines: dict[str, dict[str, int]] = field(default_factory=lambda: defaultdict(dict))
    gone: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    told: list[tuple[Any, Any]] = field(default_factory=list)

    def add(self, kind: Follows, row: Any) -> None:
        wanted, unwanted = kind.follow(row)
        self.deadlines[kind.key_space].update(wanted)
        self.gone[kind.key_space] += unwanted

    def forget(self, kind: Follows, row: Any) -> None:
        wanted, unwanted = kind.follow(row)
        self.gone[kind.key_space] += [*wanted, *unwanted]

    @property
    def size(self) -> int:
        return sum(map(len, self.deadlines.values())) + sum(map(len, self.gone.values()))

    def members(self) -> list[str]:
        return [member for part in (*self.deadlines.values(), *self.gone.values()) for member in part]


def _sync(change: _Change) -> None:
    try:
        # Bounded: this runs in the request that saved the row.
        queue = TimeoutQueue.for_saves()
        for space in {*change.deadlines, *change.gone}:
            if change.deadlines.get(space) or change.gone.get(space):
                queue.of_kind(space).sync(change.deadlines.get(space, {}), change.gone.get(space, []))
    except Exception as exc:  # noqa: BLE001 - the rows committed: no Redis trouble may fail the save
        # QueueUnavailable above all, but also a LOCATION the cluster factory refuses
        # (ImproperlyConfigured, which manage.py check reports as E014).
        logger.warning(
            "Could not update the queue %s for %d member(s) (%s: %s); the compensation scan "
            "will act on them if they expire: %s",
            ", ".join(sorted(kind_name(space) for space in {*change.deadlines, *change.gone})), change.size,
            type(exc).__name__, one_line(masked(exc)), ", ".join(change.members()[:20]),
        )
        return
    for row, state in change.told:
        # Remembered only now: a rolled-back save told Redis nothing.
        row._queue_state = state


def tells_redis(callback: Any) -> bool:
    """Whether an on-commit ``callback`` is one of this module's: what a commit tells Redis (the
    testing kit tells it inside a test's transaction, which never commits)."""
    return isinstance(callback, partial) and callback.func is _sync


def follow(kinds: Sequence[Follows], rows: Iterable[Any], *, remember: bool = False) -> None:
    """Make each kind's queue follow these rows once the transaction commits.

    ``remember``: the rows are orders whose copies note what Redis was told
    (``TimeoutOrderMixin``), so a save that changes nothing leaves Redis alone.
    """
    if settings.TESTING_WITHOUT_REDIS:
        return  # a test suite with no Redis: the testing runner reads the rows
    by_database: dict[str, _Change] = defaultdict(_Change)
    for row in rows:
        change = by_database[_database(row)]
        for kind in kinds:
            change.add(kind, row)
        if remember:
            change.told.append((row, row._timeout_state()))
    for using, change in by_database.items():
        transaction.on_commit(partial(_sync, change), using=using)


def follow_members(kind: Follows, using: str, deadlines: dict[str, int]) -> None:
    """``follow`` for members whose scores the caller already has (a batch of new notices): the
    same after-commit sync, without a look at each row."""
    if settings.TESTING_WITHOUT_REDIS:
        return
    change = _Change()
    change.deadlines[kind.key_space].update(deadlines)
    transaction.on_commit(partial(_sync, change), using=using)


def forget(kinds: Sequence[Follows], rows: Iterable[Any]) -> None:
    """Take these rows off each kind's queue once the transaction commits."""
    if settings.TESTING_WITHOUT_REDIS:
        return
    by_database: dict[str, _Change] = defaultdict(_Change)
    for row in rows:
        for kind in kinds:
            by_database[_database(row)].forget(kind, row)
    for using, change in by_database.items():
        transaction.on_commit(partial(_sync, change), using=using)
