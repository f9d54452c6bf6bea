"""Seeing, in a test, what the app did and would do: the deadline the queue holds for a row, the
notices written and those delivered to a local outbox, the writes refused.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from django.db.models import QuerySet

from ..conf import settings
from ..models import Notice, RefusedWrite
from ..notices.delivery import Delivery
from ..notices.registry import handlers
from ..queue import TimeoutQueue
from ..timers.kind import Kind
from ..timers.members import datetime_of_score
from ..timers.registry import ORDER_TIMEOUT, REMINDERS, registry
from .runner import run_due, tell_redis_now


def queued_deadline(row: Any, timer: str | None = None) -> datetime | None:
    """When the queue will hand ``row`` to a consumer: its member's moment in Redis (pending, or the
    end of its lease while a consumer holds it); with ``TESTING_WITHOUT_REDIS``, the moment the app
    would give it there. None when it holds none: the row is settled, or has no deadline. For
    reminders, the earliest reminder still owed. ``timer``: which of the row's timers (by label or
    name); the order close, or the only timer of the row's model, by default."""
    kind = _kind_of(row, timer)
    wanted, _gone = kind.follow(row)
    if settings.TESTING_WITHOUT_REDIS or not wanted:
        return datetime_of_score(min(wanted.values())) if wanted else None
    tell_redis_now()
    positions = TimeoutQueue.from_settings().of_kind(kind.key_space).positions(list(wanted))
    moments = [ms for position in positions.values() for ms in (position.pending_ms, position.lease_ms)
               if ms is not None]
    return datetime_of_score(min(moments)) if moments else None


def _kind_of(row: Any, timer: str | None) -> Kind:
    model = type(row)._meta.concrete_model
    mine = [kind for kind in (*registry.kinds(), ORDER_TIMEOUT, REMINDERS)
            if getattr(kind, "model", None) is not None and kind.model._meta.concrete_model is model]
    if timer is not None:
        named = [kind for kind in mine if timer in (kind.label, kind.name)]
        if not named:
            raise LookupError(f"{model._meta.label} has no timer {timer!r}; it has "
                              f"{', '.join(dict.fromkeys(kind.label for kind in mine)) or 'none'}")
        return named[0]
    if not mine:
        raise LookupError(f"{model._meta.label} has no timer")
    return mine[0]


def refused_writes(obj: Any = None) -> QuerySet[RefusedWrite]:
    """The writes the app refused (a payment saved on an order it had closed), oldest first; of
    ``obj`` only, when given."""
    writes = RefusedWrite.objects.order_by("pk")
    if obj is not None:
        writes = writes.filter(model=obj._meta.label, object_id=str(obj.pk))
    return writes


class Outbox:
    """The notices written and not delivered yet (``pending``), and those delivered here, to this
    local outbox (``delivered``), as ``django.core.mail.outbox`` holds the e-mails a test sent.

    Inside ``capture_notices()`` (the ``timeout_outbox`` fixture), every declared handler sends to
    ``delivered`` instead of its target; the notices go through the same lifecycle (marked
    delivered, retried when the outbox is told to fail)."""

    def __init__(self) -> None:
        self.delivered: list[Delivery] = []

    def pending(self, handler: str | None = None) -> list[Notice]:
        """The notices written and not delivered yet, oldest first (of ``handler`` only, when given)."""
        notices = Notice.objects.filter(state=Notice.State.PENDING).order_by("pk")
        return list(notices if handler is None else notices.filter(handler=handler))

    def deliver(self) -> int:
        """Deliver the notices due now, as a consumer would; how many were delivered."""
        return run_due("notices").acted

    def _send(self, delivery: Delivery) -> None:
        self.delivered.append(delivery)

    def keys(self) -> list[str]:
        """The idempotency keys of the notices delivered here, in order."""
        return [delivery.key for delivery in self.delivered]


@contextmanager
def capture_notices() -> Iterator[Outbox]:
    """Every declared handler delivers to the returned ``Outbox`` for the block's time."""
    outbox = Outbox()
    with handlers.sending_to(outbox._send):
        yield outbox
