"""The shop's notices: what it tells its customers (and its ERP) when the app acts, at least once.

Found at start-up, as ``admin.py`` is. The e-mails go through the app's ready
``email`` handler with the shop's templates (``templates/shop/emails/``), to an
address made up from the order (the test shop keeps no customer); the webhook,
to ``SHOP_WEBHOOK_URL`` when the environment names one (the fault runs and the
benchmark start a local server for it). The receivers that write them are
``receivers.notify_expired`` and ``receivers.notify_reminder``. SHOP_HANG_IN_NOTICE=1 makes
the e-mails' handler hang (a test's stuck handler).
"""

from __future__ import annotations

import os
import time
from typing import Any

from django.conf import settings

from order_timeout import notices
from order_timeout.notices.ready import email, webhook

# Half a lease at most (check W012): the tests run consumers with leases of a second or two.
TIMEOUT = min(10.0, settings.ORDER_TIMEOUT.get("LEASE_SECONDS", 30) / 2)


def customer_of(delivery: Any) -> list[str]:
    if os.environ.get("SHOP_HANG_IN_NOTICE") == "1":
        time.sleep(3600)  # a handler stuck outside the database (a mail server that never answers)
    order = delivery.object
    return [f"customer-{order.pk}@example.com"] if order is not None else []


notices.handlers.declare("order-expired-email", email(
    subject_template="shop/emails/order_expired_subject.txt", body_template="shop/emails/order_expired_body.txt",
    to=customer_of), timeout=TIMEOUT)
notices.handlers.declare("payment-reminder-email", email(
    subject_template="shop/emails/payment_reminder_subject.txt",
    body_template="shop/emails/payment_reminder_body.txt", to=customer_of), timeout=TIMEOUT)

if os.environ.get("SHOP_WEBHOOK_URL"):
    notices.handlers.declare("order-expired-webhook", webhook(
        os.environ["SHOP_WEBHOOK_URL"], secret=os.environ.get("SHOP_WEBHOOK_SECRET") or None),
        timeout=min(5.0, TIMEOUT))
