"""Reading order rows the same way whatever the model: its declared statuses, not raw values."""

from __future__ import annotations

from typing import Any

from order_timeout.models import TimeoutOrderMixin
from testproject.shop.models import Expiry


def state(order: TimeoutOrderMixin) -> str:
    """'unpaid', 'paid', 'closed' or the raw status, read from the database row."""
    model = type(order)
    status = model._base_manager.filter(pk=order.pk).values_list(
        model.TIMEOUT_STATUS_FIELD, flat=True).get()
    if status in model.TIMEOUT_UNPAID_STATUSES:
        return "unpaid"
    return {model.TIMEOUT_PAID_STATUS: "paid", model.TIMEOUT_CLOSED_STATUS: "closed"}.get(status, status)


def count_in(model: type[TimeoutOrderMixin], name: str) -> int:
    """How many rows of ``model`` are 'unpaid', 'paid' or 'closed'."""
    if name == "unpaid":
        return model._base_manager.filter(model.unpaid_q()).count()
    value = {"paid": model.TIMEOUT_PAID_STATUS, "closed": model.TIMEOUT_CLOSED_STATUS}[name]
    return model._base_manager.filter(**{model.TIMEOUT_STATUS_FIELD: value}).count()


def set_state(order: TimeoutOrderMixin, name: str) -> None:
    """Write 'paid' or 'closed' behind the app's back (as SQL or another process would)."""
    model = type(order)
    value = {"paid": model.TIMEOUT_PAID_STATUS, "closed": model.TIMEOUT_CLOSED_STATUS}[name]
    model._base_manager.filter(pk=order.pk).update(**{model.TIMEOUT_STATUS_FIELD: value})


def expiries(order: Any) -> int:
    """How many ``order_expired`` deliveries for this order committed."""
    return Expiry.objects.filter(order_id=str(order.pk), model=type(order)._meta.label).count()


def lock_waits() -> int:
    """Transactions of the test database waiting for a row lock right now."""
    from django.db import connection

    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT count(*) FROM pg_locks WHERE NOT granted")
        else:
            cursor.execute("SELECT COUNT(*) FROM information_schema.INNODB_TRX "
                           "WHERE trx_state = 'LOCK WAIT'")
        return int(cursor.fetchone()[0])
