"""The database side of a reminder: lock the row, re-check it, record the reminder, send it.

Knows nothing of Redis. Takes ``(pk, lead_ms)`` pairs (one reminder each:
``lead_ms`` before the order's deadline) and reports what became of each, so
the caller can ack, reschedule or retry. A reminder is sent inside the
transaction that locks its order and records it (``models.Reminder``), so it
reaches receivers once: a retried, taken-over or raced reminder finds its
record. The database's clock decides whether its moment has come and whether
the deadline is still ahead.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import router, transaction
from django.db.transaction import TransactionManagementError

from .dbsession import limit_transaction
from .exceptions import ImmediateShutdown
from .models import Reminder, TimeoutOrderMixin
from .rowlock import StillConflicting, Stopped, lock_orders, retrying_lock_conflicts
from .signals import deadline_approaching

logger = logging.getLogger("order_timeout")

# One reminder: the order's primary key, and how many milliseconds before its deadline.
Key = tuple[Any, int]


@dataclass
class ReminderOutcome:
    """What became of each reminder handed to ``send_reminders``."""

    sent: list[Key] = field(default_factory=list)
    # Nothing more to do: done before (a retry, a takeover, a race), the order paid or
    # closed or without a deadline, or its deadline passed first (never sent after it).
    done: list[Key] = field(default_factory=list)
    # Passed over: the order was held at its moment (a payment in flight). Recorded.
    held: list[Key] = field(default_factory=list)
    # Its moment is still ahead (the deadline moved): key -> that moment.
    not_yet: dict[Key, datetime] = field(default_factory=dict)
    busy: list[Key] = field(default_factory=list)
    missing: list[Key] = field(default_factory=list)
    # A receiver raised: key -> the exception; not recorded, to be tried again.
    failed: dict[Key, BaseException] = field(default_factory=dict)
    abandoned: list[Key] = field(default_factory=list)
    db_now: datetime | None = None
    # The moments of the reminders sent (for their lateness).
    moments: dict[Key, datetime] = field(default_factory=dict)


def send_reminders(model: type[TimeoutOrderMixin], keys: Sequence[Key], *,
                   should_stop: Callable[[], bool] | None = None) -> ReminderOutcome:
    """Send the reminders among ``keys`` whose moment has come, once each, under their orders' locks.

    A lock conflict is tried again at once (then the reminders are reported
    busy). When a receiver raises, the transaction is rolled back and run
    again without that reminder (reported failed), the others each in a
    savepoint of its own. A database that stops answering raises.
    """
    using = router.db_for_write(model)
    stopping = should_stop or (lambda: False)
    try:
        try:
            return retrying_lock_conflicts(using, lambda: _send(model, keys, using), stopping,
                                           "sending reminders")
        except _SendCarefully as refusal:
            if stopping():
                raise Stopped from refusal
            refused = refusal.refused
        return retrying_lock_conflicts(
            using, lambda: _send(model, keys, using, refused=refused), stopping, "sending reminders")
    except StillConflicting:
        return ReminderOutcome(busy=list(keys))
    except Stopped:
        return ReminderOutcome(abandoned=list(keys))


class _SendCarefully(Exception):
    """A receiver refused: roll back, then send the others one savepoint each."""

    def __init__(self, refused: dict[Key, BaseException]) -> None:
        super().__init__(refused)
        self.refused = refused


def _send(model: type[TimeoutOrderMixin], keys: Sequence[Key], using: str,
          refused: dict[Key, BaseException] | None = None) -> ReminderOutcome:
    outcome = ReminderOutcome()
    manager = model._base_manager.db_manager(using)
    with transaction.atomic(using=using):
        limit_transaction(using)  # under transaction pooling only: the limits, for this transaction
        due, held = _due(model, manager, keys, outcome)
        now = outcome.db_now
        if not due and not held:
            return outcome
        assert now is not None  # a row was locked, so the database's clock was read
        if held:
            _record(model, using, held, Reminder.Outcome.HELD, now)
        if not due:
            return outcome
        if refused is None:
            _record(model, using, [(key, order.expires_at) for key, order in due], Reminder.Outcome.SENT, now)
            for key, order in due:
                try:
                    _remind(order, key, using)
                except _ReceiverFailed as failure:
                    raise _SendCarefully({key: failure.error}) from failure.error
                outcome.sent.append(key)
                outcome.moments[key] = order.expires_at - timedelta(milliseconds=key[1])
            return outcome
        for key, order in due:
            if key in refused:
                outcome.failed[key] = refused[key]
                continue
            try:
                with transaction.atomic(using=using):
                    _record(model, using, [(key, order.expires_at)], Reminder.Outcome.SENT, now)
                    _remind(order, key, using)
            except _ReceiverFailed as failure:
                outcome.failed[key] = failure.error
            else:
                outcome.sent.append(key)
                outcome.moments[key] = order.expires_at - timedelta(milliseconds=key[1])
    return outcome


def _due(model: type[TimeoutOrderMixin], manager: Any, keys: Sequence[Key],
         outcome: ReminderOutcome) -> tuple[list[tuple[Key, Any]], list[tuple[Key, datetime]]]:
    """Lock the orders and sort the reminders: those to send now (with their orders), those
    passed over because their order is held (with its deadline), and what became of the others.

    Due: the order is unpaid, has a deadline still ahead, is not held, the
    reminder's moment (deadline minus its lead) has come, and it is not
    recorded for this deadline yet.
    """
    pks = list(dict.fromkeys(pk for pk, _lead in keys))
    locked = lock_orders(manager, pks)
    now = outcome.db_now = locked.db_now
    label = model._meta.label
    recorded = set(Reminder.objects.using(manager.db).filter(
        order_model=label, order_id__in=[str(pk) for pk in locked.rows],
        lead_ms__in={lead for _pk, lead in keys}).values_list("order_id", "lead_ms", "deadline"))
    due: list[tuple[Key, Any]] = []
    held: list[tuple[Key, datetime]] = []
    for key in keys:
        pk, lead = key
        order = locked.rows.get(pk)
        if pk in locked.busy:
            outcome.busy.append(key)
        elif order is None:
            outcome.missing.append(key)
        elif now is None or not order.awaits_payment or order.expires_at <= now:
            outcome.done.append(key)  # paid, closed, no deadline, or too late: never after it
        elif (str(pk), lead, order.expires_at) in recorded:
            outcome.done.append(key)
        elif order.expires_at - timedelta(milliseconds=lead) > now:
            outcome.not_yet[key] = order.expires_at - timedelta(milliseconds=lead)
        elif pk in locked.held:
            outcome.held.append(key)
            held.append((key, order.expires_at))
        else:
            due.append((key, order))
    return due, held


def _record(model: type[TimeoutOrderMixin], using: str, reminders: list[tuple[Key, datetime]],
            done: str, now: datetime) -> None:
    """One INSERT for these reminders: done for their deadline, whoever looks again."""
    Reminder.objects.using(using).bulk_create([
        Reminder(order_model=model._meta.label, order_id=str(pk), lead_ms=lead, deadline=deadline,
                 outcome=done, at=now)
        for (pk, lead), deadline in reminders])


def record_failed(model: type[TimeoutOrderMixin], reminders: list[tuple[Key, datetime]], now: datetime) -> None:
    """A reminder whose receivers raised on every retry: recorded failed, so it is not sent later."""
    using = router.db_for_write(model)
    with transaction.atomic(using=using):
        existing = set(Reminder.objects.using(using).filter(
            order_model=model._meta.label, order_id__in=[str(pk) for (pk, _lead), _ in reminders],
        ).values_list("order_id", "lead_ms", "deadline"))
        _record(model, using, [(key, deadline) for key, deadline in reminders
                               if (str(key[0]), key[1], deadline) not in existing],
                Reminder.Outcome.FAILED, now)


class _ReceiverFailed(Exception):
    def __init__(self, error: BaseException) -> None:
        super().__init__(error)
        self.error = error


def _remind(order: Any, key: Key, using: str) -> None:
    """Send ``deadline_approaching``; anything a receiver raises fails this reminder alone."""
    try:
        deadline_approaching.send(sender=type(order), order=order, seconds_left=key[1] / 1000)
        if transaction.get_rollback(using=using):
            raise TransactionManagementError("a receiver marked the reminder for rollback")
    except ImmediateShutdown:
        raise
    except BaseException as exc:
        raise _ReceiverFailed(exc) from exc
