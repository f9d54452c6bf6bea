"""The shop's ``order_expired`` receiver in the rolling-upgrade test, in either release's processes.

Every tenth order (by its primary key) is doomed: its stock service refuses it on every try, so
it ends in a dead letter, written by whichever release tries it last. Every other close says so
in the log once it committed (``CLOSED``), so the test knows which process closed which order.
"""

from __future__ import annotations

import logging
from typing import Any

from django.apps import AppConfig
from django.db import transaction

logger = logging.getLogger("rolling")

DOOMED_EVERY = 10
CLOSED = "rolling: closed order %s"


class StockServiceDown(Exception):
    """What the doomed orders' receiver raises, on every try."""


def doomed(pk: Any) -> bool:
    return int(pk) % DOOMED_EVERY == 0


def release_stock(sender: Any, order: Any, **kwargs: Any) -> None:
    if doomed(order.pk):
        raise StockServiceDown(f"order {order.pk}: the stock service refuses it (always)")
    pk = order.pk
    transaction.on_commit(lambda: logger.info(CLOSED, pk))


class RollingReceivers(AppConfig):
    name = "rolling_receivers"
    label = "rolling_receivers"

    def ready(self) -> None:
        from order_timeout.signals import order_expired

        order_expired.connect(release_stock, dispatch_uid="rolling.release_stock")
