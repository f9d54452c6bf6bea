"""Bridge from rows to the queue: schedule after commit, never before.

Holds the receivers that mirror order rows into Redis (connected in
``apps.py`` for the configured order model), and ``schedule``/``unschedule``
for you to call after ``QuerySet.update()`` or ``bulk_create()``, which send
no signals. Each kind of timer says what Redis must hold for a row
(``Timer.follow``); the order close and its reminders follow the order
model's rows here, a declared timer follows its own (``timers.following``).
Work is deferred with ``transaction.on_commit``, so a rolled-back row never
reaches Redis; a Redis failure is logged, never raised, because the row is
already committed and the compensation scan will catch up with it.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from django.db import router, transaction
from django.db.models.signals import post_delete, post_save

from .queue import TimeoutQueue
from .redaction import masked
from .signals import timeout_state_changed

if TYPE_CHECKING:
    from .models import TimeoutOrderMixin
    from .timers.kind import Timer

logger = logging.getLogger("order_timeout")


def _database(row: Any) -> str:
    return row._state.db or router.db_for_write(type(row), instance=row)


@dataclass
class _Change:
    """What one commit tells the queue, per kind of timer, and the copies to mark as told once it has."""

    deadlines: dict[str, dict[str, int]] = field(default_factory=lambda: defaultdict(dict))
    gone: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    told: list[tuple[Any, Any]] = field(default_factory=list)

    def add(self, kind: Timer, row: Any) -> None:
        wanted, unwanted = kind.follow(row)
        self.deadlines[kind.key_space].update(wanted)
        self.gone[kind.key_space] += unwanted

    def forget(self, kind: Timer, row: Any) -> None:
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
            "Could not update the timeout queue for %d member(s) (%s: %s); the compensation scan "
            "will close them if they expire: %s",
            change.size, type(exc).__name__, masked(exc), ", ".join(change.members()[:20]),
        )
        return
    for row, state in change.told:
        # Remembered only now: a rolled-back save told Redis nothing.
        row._queue_state = state


def follow(kinds: Sequence[Timer], rows: Iterable[Any], *, remember: bool = False) -> None:
    """Make each kind's queue follow these rows once the transaction commits.

    ``remember``: the rows are orders whose copies note what Redis was told
    (``TimeoutOrderMixin``), so a save that changes nothing leaves Redis alone.
    """
    by_database: dict[str, _Change] = defaultdict(_Change)
    for row in rows:
        change = by_database[_database(row)]
        for kind in kinds:
            change.add(kind, row)
        if remember:
            change.told.append((row, row._timeout_state()))
    for using, change in by_database.items():
        transaction.on_commit(partial(_sync, change), using=using)


def follow_members(kind: Timer, using: str, deadlines: dict[str, int]) -> None:
    """``follow`` for members whose scores the caller already has (a batch of new notices): the
    same after-commit sync, without a look at each row."""
    change = _Change()
    change.deadlines[kind.key_space].update(deadlines)
    transaction.on_commit(partial(_sync, change), using=using)


def forget(kinds: Sequence[Timer], rows: Iterable[Any]) -> None:
    """Take these rows off each kind's queue once the transaction commits."""
    by_database: dict[str, _Change] = defaultdict(_Change)
    for row in rows:
        for kind in kinds:
            by_database[_database(row)].forget(kind, row)
    for using, change in by_database.items():
        transaction.on_commit(partial(_sync, change), using=using)


def order_kinds() -> list[Timer]:
    """The kinds that follow the order model's rows: the close, and the reminders if any are asked for."""
    from .timers.registry import order_kinds as kinds

    return kinds()


def schedule(orders: Iterable[TimeoutOrderMixin]) -> None:
    """Make the queue follow these orders once the transaction commits.

    Orders in an unpaid status with a deadline are (re)scheduled at their
    ``expires_at`` (and their reminders before it); any other order is taken
    off the queue.
    """
    follow(order_kinds(), orders, remember=True)


def unschedule(orders: Iterable[TimeoutOrderMixin]) -> None:
    """Take these orders off the queue once the transaction commits."""
    forget(order_kinds(), orders)


# -- the receivers ------------------------------------------------------------


def order_saved(sender: Any, instance: TimeoutOrderMixin, raw: bool = False,
                update_fields: frozenset[str] | None = None, **kwargs: Any) -> None:
    """post_save: mirror the row's status and deadline into the queue after commit."""
    if raw:
        return
    if update_fields is not None and not {instance.TIMEOUT_STATUS_FIELD, "expires_at"} & set(update_fields):
        return
    # Unchanged status and deadline: leave Redis alone, so that a save during
    # a retry's backoff does not pull the retry forward to the old deadline.
    if not kwargs.get("created") and not instance.queue_state_changed():
        return
    schedule([instance])


def order_deleted(sender: Any, instance: TimeoutOrderMixin, **kwargs: Any) -> None:
    """post_delete: take the order off the queue after commit."""
    unschedule([instance])


def state_changed(sender: Any, orders: list[TimeoutOrderMixin], **kwargs: Any) -> None:
    """timeout_state_changed (mark_paid, extend_deadline): mirror the rows after commit."""
    schedule(orders)


def connect_receivers(model: type[TimeoutOrderMixin]) -> None:
    """Keep the queue in step with ``model``'s rows (done for ``ORDER_MODEL`` when Django starts)."""
    uid = f"order_timeout.{model._meta.label_lower}"
    post_save.connect(order_saved, sender=model, dispatch_uid=f"{uid}.saved")
    post_delete.connect(order_deleted, sender=model, dispatch_uid=f"{uid}.deleted")
    timeout_state_changed.connect(state_changed, sender=model, dispatch_uid=f"{uid}.changed")


def disconnect_receivers(model: type[TimeoutOrderMixin]) -> None:
    """Undo ``connect_receivers``."""
    uid = f"order_timeout.{model._meta.label_lower}"
    post_save.disconnect(sender=model, dispatch_uid=f"{uid}.saved")
    post_delete.disconnect(sender=model, dispatch_uid=f"{uid}.deleted")
    timeout_state_changed.disconnect(sender=model, dispatch_uid=f"{uid}.changed")
