"""The database side of a timeout: lock the rows, re-check them, close, fire ``order_expired``.

Knows nothing of Redis. Takes primary keys and one ``now`` (the consumer's
clock, the same one that judged the members due) and reports what happened
to each key, so the caller can ack, reschedule or retry.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import router, transaction

from .models import TIMEOUT_REASON, AbstractTimeoutOrder, Status
from .signals import order_expired


@dataclass
class CloseOutcome:
    """What became of each primary key handed to ``close_expired``."""

    closed: list[Any] = field(default_factory=list)
    # Paid or already closed: nothing to do.
    settled: list[Any] = field(default_factory=list)
    # No such row (deleted, or a member from another database).
    missing: list[Any] = field(default_factory=list)
    # Still unpaid, deadline in the future (extended): pk -> the row's deadline.
    not_due: dict[Any, datetime] = field(default_factory=dict)
    # Closing raised (a receiver, usually): pk -> the exception; the order stays open.
    failed: dict[Any, BaseException] = field(default_factory=dict)


def close_expired(
    model: type[AbstractTimeoutOrder], pks: Sequence[Any], now: datetime
) -> CloseOutcome:
    """Close the orders among ``pks`` that are still unpaid and due at ``now``.

    One transaction locks all rows (``select_for_update``), so a payment
    racing this close waits for it and then finds the order closed, or won
    first and is seen here as paid. Each close and its ``order_expired``
    receivers run in a savepoint: a receiver that raises undoes that order
    alone. The status condition under the lock makes closing twice impossible.
    """
    outcome = CloseOutcome()
    if not pks:
        return outcome
    using = router.db_for_write(model)
    manager = model._default_manager.db_manager(using)
    with transaction.atomic(using=using):
        rows = {order.pk: order for order in manager.select_for_update().filter(pk__in=pks)}
        for pk in pks:
            order = rows.get(pk)
            if order is None:
                outcome.missing.append(pk)
            elif order.status != Status.UNPAID:
                outcome.settled.append(pk)
            elif order.expires_at > now:
                outcome.not_due[pk] = order.expires_at
            else:
                try:
                    with transaction.atomic(using=using):
                        _close(manager, order, now)
                except Exception as exc:
                    if transaction.get_connection(using).needs_rollback:
                        # The savepoint could not be rolled back: the connection
                        # is gone. Abort the batch; its members stay leased.
                        raise
                    outcome.failed[pk] = exc
                else:
                    outcome.closed.append(pk)
    return outcome


def _close(manager: Any, order: AbstractTimeoutOrder, now: datetime) -> None:
    values = {"status": Status.CLOSED, "closed_at": now, "close_reason": TIMEOUT_REASON}
    manager.filter(pk=order.pk).update(**values)
    for name, value in values.items():
        setattr(order, name, value)
    order_expired.send(sender=type(order), order=order)
