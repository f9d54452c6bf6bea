"""The shop's receivers of ``order_expired``, run in the closing transaction.

``record_expiry`` records each delivery (every order model), and
``record_expiry_keys`` each key ``order_keys_expired`` names. For tests that
drive a consumer in another process, environment variables change its
behaviour: SHOP_EXIT_AFTER_COMMIT ends the process right after the close's
COMMIT, SHOP_STALL_FILE makes the first delivery create that file and hang
(so the test can kill the consumer mid-batch), SHOP_DELAY_SECONDS slows every
delivery (so a batch is still in hand when a signal arrives), SHOP_EXIT_ON_ORDER
ends the process when that order's turn comes, SHOP_HANG_ON_ORDER hangs there
for an hour.

``write_status_change`` and ``release_stock`` are the shop's own close, for
``ShopOrder``: its status history and its stock allocations follow the
timeout in the same commit.
"""

import logging
import os
import time
from pathlib import Path
from typing import Any

from django.db.models import F

from .models import Expiry, OrderStatusChange, StockRecord

logger = logging.getLogger("shop")


def record_expiry(sender: Any, order: Any, **kwargs: Any) -> None:
    _record_expiries(sender, [order.pk])


def record_expiry_keys(sender: Any, keys: list[Any], **kwargs: Any) -> None:
    """The same record from ``order_keys_expired``: a shop that needs no instance (the close then
    builds none), one row per closed order all the same."""
    _record_expiries(sender, keys)


def _record_expiries(sender: Any, pks: list[Any]) -> None:
    if os.environ.get("SHOP_EXIT_AFTER_COMMIT") == "1":
        # The process dies right after the close's COMMIT, before any after-commit work (the
        # ack, an on_commit e-mail): a deploy's SIGKILL, the OOM killer.
        from django.db import transaction

        transaction.on_commit(lambda: os._exit(9))
    for pk in pks:
        if os.environ.get("SHOP_EXIT_ON_ORDER") == str(pk):
            os._exit(3)  # a receiver that takes its process down (out of memory, a C crash)
        if os.environ.get("SHOP_HANG_ON_ORDER") == str(pk):
            time.sleep(3600)  # a receiver stuck outside the database (a call with no timeout)
    for pk in pks:
        Expiry.objects.create(order_id=str(pk), model=sender._meta.label)
    logger.info("shop: released the stock of order(s) %s", ", ".join(str(pk) for pk in pks))
    stall_file = os.environ.get("SHOP_STALL_FILE")
    if stall_file:
        Path(stall_file).touch()
        time.sleep(3600)
    delay = float(os.environ.get("SHOP_DELAY_SECONDS", "0"))
    if delay:
        time.sleep(delay)


def write_status_change(sender: Any, order: Any, previous_status: str, **kwargs: Any) -> None:
    OrderStatusChange.objects.create(order=order, old_status=previous_status, new_status=order.status)


def release_stock(sender: Any, order: Any, **kwargs: Any) -> None:
    for line in order.lines.all():
        StockRecord.objects.filter(pk=line.stockrecord_id).update(
            num_allocated=F("num_allocated") - line.quantity)


def cancel_plain_order(sender: Any, order: Any, **kwargs: Any) -> None:
    """The deadline row closed: the order it guards follows, in the same commit."""
    from .models import PlainOrder

    PlainOrder.objects.filter(pk=order.order_id, status="pending").update(status="cancelled")


def record_reminder(sender: Any, order: Any, seconds_left: float, **kwargs: Any) -> None:
    """``deadline_approaching``: what the shop would e-mail ("N minutes left to pay"), as a row
    written in the reminder's transaction. The e-mail itself would go from on_commit().

    SHOP_REMINDER_STALL_FILE makes the first delivery create that file and hang (so a test can
    kill the consumer mid-batch); SHOP_REMINDER_FAIL_ON_ORDER raises for that order.
    """
    from .models import ReminderEmail

    if os.environ.get("SHOP_REMINDER_FAIL_ON_ORDER") == str(order.pk):
        raise RuntimeError(f"the mail service refused order {order.pk}'s reminder")
    ReminderEmail.objects.create(model=sender._meta.label, order_id=str(order.pk), seconds_left=seconds_left,
                                 deadline=order.expires_at)
    stall_file = os.environ.get("SHOP_REMINDER_STALL_FILE")
    if stall_file:
        Path(stall_file).touch()
        time.sleep(3600)


# -- what the shop tells the outside world: notices, written in the same transaction -----------


def notify_expired(sender: Any, orders: list[Any], **kwargs: Any) -> None:
    """``orders_expired``: the customer's e-mail (and the ERP's webhook, where one is configured),
    one notice each, one INSERT per batch: delivered at least once after the close commits."""
    from order_timeout import notify_many
    from order_timeout.notices import handlers

    label = sender._meta.label_lower
    wanted = ("order-expired-email", "order-expired-webhook") if os.environ.get("SHOP_EMAIL_NOTICES", "1") == "1" \
        else ("order-expired-webhook",)
    for handler in wanted:
        if handler in handlers.names():
            notify_many(handler, orders, key=lambda order, handler=handler: f"{handler}:{label}:{order.pk}")


def notify_reminder(sender: Any, order: Any, seconds_left: float, **kwargs: Any) -> None:
    """``deadline_approaching``: the "N minutes left to pay" e-mail, as a notice of the reminder's
    transaction (a reminder recorded is a reminder told)."""
    from order_timeout import notify

    notify("payment-reminder-email", order,
           key=f"payment-reminder:{sender._meta.label_lower}:{order.pk}:{seconds_left:g}:{order.expires_at:%s}")


# -- the same close, a batch at a time (orders_expired): one statement each per batch ----------


def write_status_changes(sender: Any, orders: list[Any], previous_statuses: dict[Any, str],
                         **kwargs: Any) -> None:
    """The batch's status-change rows in one INSERT."""
    OrderStatusChange.objects.bulk_create([
        OrderStatusChange(order_id=order.pk, old_status=previous_statuses[order.pk], new_status=order.status)
        for order in orders])


def release_stock_of(sender: Any, orders: list[Any], **kwargs: Any) -> None:
    """The batch's stock allocations released in one UPDATE."""
    from django.db.models import OuterRef, Subquery, Sum
    from django.db.models.functions import Coalesce

    from .models import Line

    lines = Line.objects.filter(order__in=orders)
    released = (lines.filter(stockrecord=OuterRef("pk")).values("stockrecord")
                .annotate(total=Sum("quantity")).values("total"))
    StockRecord.objects.filter(pk__in=lines.values("stockrecord")).update(
        num_allocated=F("num_allocated") - Coalesce(Subquery(released), 0))
