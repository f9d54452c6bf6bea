"""Notices: what a close (or any change) tells the outside world, written with it, delivered after.

A shop declares its handlers in a ``notices.py`` (or ``timers.py``) of one of
its apps, found at start-up as ``admin.py`` is, and writes notices inside the
transaction of the change they tell of (docs/notices.md)::

    from order_timeout import notices, notify

    @notices.handler("order-expired-email", timeout=10)
    def order_expired_email(delivery):
        send_mail(..., headers={"Message-ID": ...delivery.key...})

    @receiver(order_expired)
    def tell_the_customer(sender, order, **kwargs):
        notify("order-expired-email", order, key=f"order-expired:{order.pk}")

Each notice is delivered at least once, by the one lifecycle (``timers/notices.py``):
retried after each of ``NOTICE_RETRY_DELAYS``, then a dead letter for staff.
"""

from .delivery import Delivery, Rejected
from .registry import AlreadyDeclared, Handler, handler, handlers
from .writing import MAX_PAYLOAD_BYTES, NoticeRefused, notify, notify_many

__all__ = ["MAX_PAYLOAD_BYTES", "AlreadyDeclared", "Delivery", "Handler", "NoticeRefused", "Rejected", "handler",
           "handlers", "notify", "notify_many"]
