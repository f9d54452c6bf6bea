"""The database side of a timeout: lock the rows, re-check them, close, fire ``order_expired``.

Knows nothing of Redis. Takes primary keys and reports what happened to each,
so the caller can ack, reschedule or retry. Whether an order is due is
decided by the database server's clock, in the statements that lock and
close it: a caller whose own clock runs fast can be late, never early.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import Error as DatabaseError, OperationalError, connections, router, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.transaction import TransactionManagementError

from .conf import settings
from .dberrors import is_lock_conflict
from .dbsession import limit_transaction
from .exceptions import ImmediateShutdown
from .models import HOLD_EXPIRED_REASON, TIMEOUT_REASON, TimeoutOrderMixin
from .rowlock import StillConflicting, Stopped, lock_orders, retrying_lock_conflicts
from .signals import order_expired, orders_expired

logger = logging.getLogger("order_timeout")


@dataclass
class CloseOutcome:
    """What became of each primary key handed to ``close_expired``."""

    closed: list[Any] = field(default_factory=list)
    # Paid or already closed: nothing to do.
    settled: list[Any] = field(default_factory=list)
    # No such row (deleted, or a member from another database).
    missing: list[Any] = field(default_factory=list)
    # Row locked by another transaction (a payment in flight, a long shop
    # transaction), or lock conflicts on every immediate retry: skipped rather
    # than waited for, so it cannot stall the batch; not a failure.
    busy: list[Any] = field(default_factory=list)
    # Still unpaid, deadline in the future (extended): pk -> the row's deadline.
    not_due: dict[Any, datetime] = field(default_factory=dict)
    # Closing raised (a receiver, usually): pk -> the exception; the order stays open.
    failed: dict[Any, BaseException] = field(default_factory=dict)
    # Not looked at: the caller asked to stop (its batch ran out of time).
    abandoned: list[Any] = field(default_factory=list)
    # Due and unpaid, but HOLD_CONDITION holds (a payment in flight), within MAX_HOLD:
    # pk -> the row's deadline. Left open, to be looked at again.
    held: dict[Any, datetime] = field(default_factory=dict)
    # The database's clock when it locked the rows (None if no row was locked).
    db_now: datetime | None = None
    # The deadlines of the orders closed (for their lateness).
    deadlines: dict[Any, datetime] = field(default_factory=dict)

    def merge(self, other: CloseOutcome) -> None:
        self.closed += other.closed
        self.settled += other.settled
        self.missing += other.missing
        self.busy += other.busy
        self.not_due.update(other.not_due)
        self.failed.update(other.failed)
        self.abandoned += other.abandoned
        self.held.update(other.held)
        self.db_now = other.db_now or self.db_now
        self.deadlines.update(other.deadlines)


def close_expired(
    model: type[TimeoutOrderMixin], pks: Sequence[Any], *,
    should_stop: Callable[[], bool] | None = None,
    progress: Callable[[], None] | None = None,
) -> CloseOutcome:
    """Close the orders among ``pks`` that are still unpaid and due by the database's clock.

    ``should_stop`` is asked before every transaction after the first; once
    it says yes, the orders not yet looked at are reported abandoned.
    ``progress`` is called each time an order's receivers have run (a watchdog
    tells a slow batch from a stuck one by it).

    A lock conflict (deadlock, lock wait timeout) is tried again at once, a
    few times with jitter; if it persists the orders are reported busy, to be
    looked at again shortly, never counted as failed. If the batch's
    transaction fails as a whole for another reason while the database still
    answers, each order is tried again in a transaction of its own, so one bad
    order cannot hold back the rest of its batch for ever; the orders that
    fail then are reported failed. Only when the database does not answer is
    a database error raised: nothing was closed, the caller retries later.
    """
    using = router.db_for_write(model)
    connection = connections[using]
    stopping = should_stop or (lambda: False)

    def attempt(pks: Sequence[Any]) -> CloseOutcome:
        """The fast path; if a receiver refused, the whole batch again, each order in a savepoint."""
        try:
            return retrying_lock_conflicts(
                using, lambda: _close_batch(model, pks, using, progress=progress), stopping)
        except _CloseCarefully as refusal:
            if stopping():
                raise Stopped from refusal
            refused = refusal.refused
        return retrying_lock_conflicts(
            using, lambda: _close_batch(model, pks, using, refused=refused, progress=progress),
            stopping)

    try:
        return attempt(pks)
    except StillConflicting:
        return CloseOutcome(busy=list(pks))
    except Stopped:
        return CloseOutcome(abandoned=list(pks))
    except Exception as exc:
        batch_error = exc
    if connection.in_atomic_block:
        # The caller's transaction is broken too; only the caller can roll it back.
        raise batch_error
    if not _database_answers(connection):
        raise _unreachable(batch_error)
    outcome = CloseOutcome()
    if stopping():
        outcome.abandoned = list(pks)
        return outcome
    if len(pks) == 1:
        outcome.failed[pks[0]] = batch_error
        return outcome
    logger.warning("Closing a batch of %d failed as a whole (%s: %s); closing its orders one by one.",
                   len(pks), type(batch_error).__name__, batch_error)
    for index, pk in enumerate(pks):
        if stopping():
            outcome.abandoned += pks[index:]
            break
        try:
            outcome.merge(attempt([pk]))
        except StillConflicting:
            outcome.busy.append(pk)
        except Stopped:
            outcome.abandoned += pks[index:]
            break
        except Exception as exc:
            if not _database_answers(connection):
                raise _unreachable(exc)  # noqa: B904 (_unreachable chains the cause itself)
            outcome.failed[pk] = exc
    return outcome


class _CloseCarefully(Exception):
    """A receiver refused in the fast path: the batch is rolled back, to be closed with savepoints."""

    def __init__(self, refused: dict[Any, BaseException]) -> None:
        super().__init__(refused)
        self.refused = refused


def _unreachable(error: Exception) -> DatabaseError:
    """The error to raise when the database stopped answering: always a database error."""
    if isinstance(error, DatabaseError):
        return error
    wrapped = OperationalError(f"the database stopped answering while closing orders: {error}")
    wrapped.__cause__ = error
    return wrapped


def _database_answers(connection: BaseDatabaseWrapper) -> bool:
    """Reconnect if needed; False when the database cannot be reached."""
    try:
        connection.close_if_unusable_or_obsolete()
        connection.ensure_connection()
        return connection.is_usable()
    except DatabaseError:
        return False


def _close_batch(model: type[TimeoutOrderMixin], pks: Sequence[Any], using: str,
                 refused: dict[Any, BaseException] | None = None,
                 progress: Callable[[], None] | None = None) -> CloseOutcome:
    """One transaction: lock, re-check and close ``pks``.

    One transaction locks all rows (``select_for_update``), so a payment
    racing this close waits for it and then finds the order closed, or won
    first and is seen here as paid. The status condition under the lock makes
    closing twice impossible.

    The due orders are closed with one UPDATE and their ``order_expired``
    receivers run in the same transaction, with no savepoint: five
    statements for the batch (autocommit off, the locking SELECT, the UPDATE,
    COMMIT, autocommit on). If a receiver refuses, the whole transaction is
    rolled back and run again with ``refused``: the order that refused fails
    (its receivers are not run again), the others close in a savepoint and,
    if another refuses too, one savepoint per order, so an order whose
    receiver refuses stays open alone. A lock conflict is raised instead: the
    whole transaction is tried again.
    """
    outcome = CloseOutcome()
    if not pks:
        return outcome
    # The base manager: a shop's default manager may hide rows (soft delete, tenants).
    manager = model._base_manager.db_manager(using)
    with transaction.atomic(using=using):
        limit_transaction(using)  # under transaction pooling only: the limits, for this transaction
        due = _due_and_unpaid(manager, pks, outcome)
        # Due orders have a deadline (it passed): the lateness of their closes counts from it.
        due_deadlines = [(order, order.expires_at) for order in due if order.expires_at is not None]
        if not due:
            return outcome
        now = outcome.db_now
        assert now is not None  # a row was locked, so the database's clock was read
        if refused is None:
            try:
                _close(manager, due, now, progress)
            except _ReceiverFailed as failure:
                if _connection_broken(using) or is_lock_conflict(failure.error) or \
                        _connection_lost(using, failure.error):
                    raise failure.error from failure.error.__cause__  # keep the driver's error: it says why
                raise _CloseCarefully({failure.order.pk: failure.error}) from failure.error
            outcome.closed.extend(order.pk for order in due)
            outcome.deadlines.update((order.pk, deadline) for order, deadline in due_deadlines)
            return outcome
        if refused:
            outcome.failed.update({order.pk: refused[order.pk] for order in due if order.pk in refused})
            due = [order for order in due if order.pk not in refused]
        if due:
            try:
                with transaction.atomic(using=using):
                    _close(manager, due, now, progress)
            except _ReceiverFailed as failure:
                if _connection_broken(using) or is_lock_conflict(failure.error):
                    raise failure.error from failure.error.__cause__
                # This order's try has failed; the rest of the batch goes on.
                outcome.failed[failure.order.pk] = failure.error
                rest = [order for order in due if order is not failure.order]
                _close_one_by_one(manager, rest, now, outcome, using, progress)
            except Exception as exc:
                if _connection_broken(using) or is_lock_conflict(exc):
                    raise
                _close_one_by_one(manager, due, now, outcome, using, progress)
            else:
                outcome.closed.extend(order.pk for order in due)
        closed = set(outcome.closed)
        outcome.deadlines.update((order.pk, deadline) for order, deadline in due_deadlines
                                 if order.pk in closed)
    return outcome


def _due_and_unpaid(manager: Any, pks: Sequence[Any], outcome: CloseOutcome) -> list[TimeoutOrderMixin]:
    """Lock the rows and sort them: the orders to close now, and what became of the others.

    A held order (``HOLD_CONDITION``) is left open until ``MAX_HOLD`` past its
    deadline; after that it is closed all the same, with ``HOLD_EXPIRED_REASON``.
    """
    locked = lock_orders(manager, pks)
    now = outcome.db_now = locked.db_now
    max_hold = None if settings.MAX_HOLD is None else timedelta(seconds=settings.MAX_HOLD)
    due: list[TimeoutOrderMixin] = []
    for pk in pks:
        order = locked.rows.get(pk)
        if pk in locked.busy:
            outcome.busy.append(pk)
        elif order is None:
            outcome.missing.append(pk)
        elif not order.awaits_payment or order.expires_at is None:
            # Settled, or its deadline was taken away: nothing to close.
            outcome.settled.append(pk)
        elif now is None or order.expires_at > now:
            outcome.not_due[pk] = order.expires_at
        elif pk in locked.held and (max_hold is None or now < order.expires_at + max_hold):
            outcome.held[pk] = order.expires_at
        else:
            order._timeout_close_reason = HOLD_EXPIRED_REASON if pk in locked.held else TIMEOUT_REASON
            due.append(order)
    return due


class _ReceiverFailed(Exception):
    """A receiver of ``order_expired`` raised ``error`` for ``order``."""

    def __init__(self, order: TimeoutOrderMixin, error: BaseException) -> None:
        super().__init__(order.pk, error)
        self.order, self.error = order, error


def _connection_broken(using: str) -> bool:
    """True when a savepoint could not be rolled back: the connection is gone.

    The caller then re-raises, the whole batch rolls back and its members stay leased.
    """
    return transaction.get_connection(using).needs_rollback


def _connection_lost(using: str, error: BaseException) -> bool:
    """A database error after which the connection is gone (the server ended the session):
    the database failed, not the order."""
    return isinstance(error, DatabaseError) and not connections[using].is_usable()


def _close_one_by_one(manager: Any, due: list[TimeoutOrderMixin], now: datetime,
                      outcome: CloseOutcome, using: str,
                      progress: Callable[[], None] | None = None) -> None:
    """Close each order in a savepoint of its own, so a failing one fails alone."""
    for order in due:
        try:
            with transaction.atomic(using=using):
                _close(manager, [order], now, progress)
        except Exception as exc:
            error = exc.error if isinstance(exc, _ReceiverFailed) else exc
            if _connection_broken(using) or is_lock_conflict(error):
                raise error from error.__cause__
            outcome.failed[order.pk] = error
        else:
            outcome.closed.append(order.pk)


def _close(manager: Any, orders: list[TimeoutOrderMixin], now: datetime,
           progress: Callable[[], None] | None = None) -> None:
    """UPDATE ``orders`` to closed and send their signals; a receiver's failure names its order.

    Anything a receiver raises fails its order, ``SystemExit`` and
    ``KeyboardInterrupt`` included: only the consumer's own immediate
    shutdown goes through.
    """
    model = type(orders[0])
    by_reason: dict[str, list[TimeoutOrderMixin]] = {}
    for order in orders:
        by_reason.setdefault(getattr(order, "_timeout_close_reason", TIMEOUT_REASON), []).append(order)
    values = {reason: model.closing_values(now, reason) for reason in by_reason}
    # Locked and judged due by the database's clock: neither status nor deadline can move now.
    # One UPDATE per reason: a timeout, or a hold that ran past MAX_HOLD.
    for reason, group in by_reason.items():
        manager.filter(model.unpaid_q(), pk__in=[order.pk for order in group]).update(**values[reason])
    previous_statuses = {}
    for order in orders:
        previous = previous_statuses[order.pk] = order.timeout_status
        order._apply_close(values[getattr(order, "_timeout_close_reason", TIMEOUT_REASON)])
        try:
            order_expired.send(sender=model, order=order, previous_status=previous)
            if transaction.get_rollback(using=manager.db):
                # set_rollback(True) would undo the close silently, yet we would ack it.
                raise TransactionManagementError("a receiver marked the close for rollback")
        except ImmediateShutdown:
            raise
        except BaseException as exc:
            raise _ReceiverFailed(order, exc) from exc
        if progress is not None:
            progress()
    # A batch receiver that raises fails the whole batch; the one-by-one
    # fallback then gives each order a batch of its own.
    orders_expired.send(sender=model, orders=orders, previous_statuses=previous_statuses)
