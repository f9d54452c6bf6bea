"""A row's closers, reproduced in this process: their settings, their receivers, their connection.

A row's closers are told what to be by their environment (``System.extra_env``
and what ``System.start`` sets, read at start-up by testproject/settings.py,
the shop's AppConfig and the bench app). The in-process measures (bench/parts.py,
bench/trips.py) run a consumer in the harness's process, or a test's, which
started long ago with another environment: ``reproduced`` sets the same things
for the length of a block, and refuses a row that asks for something it does
not know how to set, rather than measure another row under its name.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from django.conf import settings
from django.db import connection
from django.test import override_settings

from .systems import System

# What ``reproduced`` sets for a row's ``extra_env``; any other name is refused.
UNDERSTOOD = frozenset({"ORDER_TIMEOUT_HOLD_CONDITION", "ORDER_TIMEOUT_REMINDERS", "SHOP_NOTICES",
                        "SHOP_EMAIL_NOTICES", "BENCH_RECORD_AT_COMMIT", "SHOP_RELEASE_STOCK",
                        "SHOP_BATCH_RECEIVERS"})


class NotReproducible(Exception):
    pass


def order_timeout_settings(system: type[System]) -> dict[str, Any]:
    """What the row's closers read into ``ORDER_TIMEOUT`` from their environment (testproject/settings.py)."""
    env = system.extra_env
    values: dict[str, Any] = {"ORDER_MODEL": system.model_label}
    if env.get("ORDER_TIMEOUT_HOLD_CONDITION"):
        values["HOLD_CONDITION"] = env["ORDER_TIMEOUT_HOLD_CONDITION"]
    if env.get("ORDER_TIMEOUT_REMINDERS"):
        values["REMINDERS"] = [float(seconds) for seconds in env["ORDER_TIMEOUT_REMINDERS"].split(",")]
    return values


@contextmanager
def reproduced(system: type[System]) -> Iterator[None]:
    """Inside: ``ORDER_TIMEOUT`` and the close's receivers as the row's closers have them, and the
    database connection kept from batch to batch as theirs is (``CONN_MAX_AGE``)."""
    unknown = set(system.extra_env) - UNDERSTOOD
    if unknown:
        raise NotReproducible(f"{system.name}: its closers' {', '.join(sorted(unknown))} has no in-process "
                              "equivalent here (bench/shapes.py)")
    with ExitStack() as stack:
        stack.enter_context(override_settings(ORDER_TIMEOUT={**settings.ORDER_TIMEOUT,
                                                             **order_timeout_settings(system)}))
        stack.enter_context(_receivers(system))
        stack.enter_context(connection_kept())
        yield


@contextmanager
def connection_kept() -> Iterator[None]:
    """The database connection kept from batch to batch, as the closers keep theirs
    (``CONN_MAX_AGE=600``, bench/systems.py), not opened again for each."""
    before = connection.settings_dict["CONN_MAX_AGE"]
    connection.close()
    connection.settings_dict["CONN_MAX_AGE"] = 600
    try:
        yield
    finally:
        connection.close()
        connection.settings_dict["CONN_MAX_AGE"] = before


@contextmanager
def _receivers(system: type[System]) -> Iterator[None]:
    """The close's and the reminders' receivers as the row's closers connect them, and no other:
    this process's own (a test's shop, the harness's) are set aside for the block."""
    from order_timeout.signals import deadline_approaching, order_expired, order_keys_expired, orders_expired

    from . import recorder

    signals = (order_expired, orders_expired, order_keys_expired, deadline_approaching)
    kept = [(signal, signal.receivers[:]) for signal in signals]
    for signal in signals:
        signal.receivers.clear()
        signal.sender_receivers_cache.clear()
    env = system.extra_env
    # The bench app's recorder (bench/apps.py): one receiver per order, or (a row that records the
    # batch's keys) none: its closers stamp them from the consumer's report, a wrapper not timed here.
    if not system.records_keys:
        order_expired.connect(recorder.on_expired_at_commit if env.get("BENCH_RECORD_AT_COMMIT") == "1"
                              else recorder.on_expired, dispatch_uid="bench.recorder")
    _connect_shop(env)
    try:
        with _notices(env.get("SHOP_NOTICES") == "1", env.get("SHOP_EMAIL_NOTICES", "1")):
            yield
    finally:
        for signal, receivers in kept:
            signal.receivers[:] = receivers
            signal.sender_receivers_cache.clear()
        recorder._commits.clear()


def _connect_shop(env: dict[str, str]) -> None:
    """The shop's own close receivers (testproject/shop/apps.py), for its orders only; the row turns
    off its expiry and reminder records (SHOP_RECORD_EXPIRIES=0, SHOP_RECORD_REMINDERS=0)."""
    from order_timeout.signals import order_expired, orders_expired
    from testproject.shop import receivers
    from testproject.shop.models import PlainOrderDeadline, ShopOrder

    releases = env.get("SHOP_RELEASE_STOCK", "1") == "1"
    if env.get("SHOP_BATCH_RECEIVERS") == "1":
        orders_expired.connect(receivers.write_status_changes, sender=ShopOrder,
                               dispatch_uid="shop.write_status_changes")
        if releases:
            orders_expired.connect(receivers.release_stock_of, sender=ShopOrder, dispatch_uid="shop.release_stock_of")
    else:
        order_expired.connect(receivers.write_status_change, sender=ShopOrder, dispatch_uid="shop.write_status_change")
        if releases:
            order_expired.connect(receivers.release_stock, sender=ShopOrder, dispatch_uid="shop.release_stock")
    order_expired.connect(receivers.cancel_plain_order, sender=PlainOrderDeadline,
                          dispatch_uid="shop.cancel_plain_order")


@contextmanager
def _notices(on: bool, emails: str) -> Iterator[None]:
    """SHOP_NOTICES=1: the shop's notice receivers, its webhook handler declared for the harness's
    sink (as SHOP_WEBHOOK_URL declares it, testproject/shop/notices.py), SHOP_EMAIL_NOTICES as the row
    sets it (the receiver reads it at each call)."""
    if not on:
        yield
        return
    from order_timeout.notices import handlers
    from order_timeout.notices.ready import webhook
    from order_timeout.signals import deadline_approaching, orders_expired
    from testproject.shop.receivers import notify_expired, notify_reminder

    from .notices import HANDLER
    from .sink import shared

    declared = HANDLER not in handlers.names()
    if declared:
        handlers.declare(HANDLER, webhook(shared().url), timeout=5)
    before, os.environ["SHOP_EMAIL_NOTICES"] = os.environ.get("SHOP_EMAIL_NOTICES"), emails
    orders_expired.connect(notify_expired, dispatch_uid="shop.notify_expired")
    deadline_approaching.connect(notify_reminder, dispatch_uid="shop.notify_reminder")
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("SHOP_EMAIL_NOTICES", None)
        else:
            os.environ["SHOP_EMAIL_NOTICES"] = before
        if declared:
            handlers.forget(HANDLER)
