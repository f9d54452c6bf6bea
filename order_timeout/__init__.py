"""Close unpaid Django orders the moment their payment deadline passes."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async

if TYPE_CHECKING:
    from .models import TimeoutOrderMixin

__all__ = ["aschedule", "aunschedule", "get_order_model", "notify", "notify_many", "schedule", "unschedule"]


def get_order_model() -> type[TimeoutOrderMixin]:
    """The order model named by ``ORDER_TIMEOUT['ORDER_MODEL']`` (after ``get_user_model``)."""
    from .ordermodel import get_order_model as _get_order_model

    return _get_order_model()


def notify(handler: str, obj_or_payload: Any, *, key: str | None = None, at: datetime | None = None) -> Any:
    """Write a notice in the current transaction, delivered at least once after it commits; see
    ``order_timeout.notices.notify``."""
    from .notices.writing import notify as _notify

    return _notify(handler, obj_or_payload, key=key, at=at)


def notify_many(handler: str, objs_or_payloads: Iterable[Any], *, key: Any = None,
                at: datetime | None = None) -> Sequence[Any]:
    """``notify()`` for a batch, one INSERT; see ``order_timeout.notices.notify_many``."""
    from .notices.writing import notify_many as _notify_many

    return _notify_many(handler, objs_or_payloads, key=key, at=at)


def schedule(orders: Iterable[TimeoutOrderMixin]) -> None:
    """Make the queue follow these rows after commit; see ``order_timeout.scheduling.schedule``."""
    from .scheduling import schedule as _schedule

    _schedule(orders)


def unschedule(orders: Iterable[TimeoutOrderMixin]) -> None:
    """Take these orders off the queue after commit; see ``order_timeout.scheduling.unschedule``."""
    from .scheduling import unschedule as _unschedule

    _unschedule(orders)


# For async views and webhooks: the sync path through sync_to_async, as Django's asave() does, so
# a QuerySet is read and the on-commit hook registered on the thread that holds the connection.


async def aschedule(orders: Iterable[TimeoutOrderMixin]) -> None:
    """``schedule()`` for async code (after ``abulk_create()`` or ``aupdate()``): the same on-commit effect."""
    await sync_to_async(schedule)(orders)


async def aunschedule(orders: Iterable[TimeoutOrderMixin]) -> None:
    """``unschedule()`` for async code: the same on-commit effect."""
    await sync_to_async(unschedule)(orders)
