"""The compensation task under a shop's own Celery task class: Saleor's writer rules.

Tried on Saleor: its Celery app's ``task_cls`` (``RestrictWriterDBTask``) wraps every task in an
execute wrapper that raises ``UnsafeWriterAccessError`` (its tests) or logs a warning per query
(production) for any query on the writer outside ``allow_writer()``. ``order_timeout.tasks.compensate``
raised at its first query. ``TASK_CONTEXT`` names the context the task runs in (Saleor:
``saleor.core.db.connection.allow_writer``); every query it makes goes to the primary, never to
a replica a router names for reads (a replica's lag would show it rows the scan already closed).
"""

from __future__ import annotations

from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from celery import Celery, Task
from django.db import connections

import order_timeout.tasks  # noqa: F401 - the shared task, as the shop's autodiscover_tasks() imports it
from order_timeout.models import Order

from .helpers import state

pytestmark = pytest.mark.django_db(transaction=True)


class WriterAccess(Exception):
    """What the restricting task class raises for a query on the writer (Saleor's UnsafeWriterAccessError)."""


def restrict_writer(execute, sql, params, many, context):
    if not getattr(context["connection"], "_allow_writer", False):
        raise WriterAccess(f"a query on the writer outside allow_writer(): {sql}")
    return execute(sql, params, many, context)


@contextmanager
def allow_writer():
    connection = connections["default"]
    connection._allow_writer = True
    try:
        yield
    finally:
        connection._allow_writer = False


class WriterRestrictedTask(Task):
    """A shop's task class, shaped as Saleor's RestrictWriterDBTask."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with connections["default"].execute_wrapper(restrict_writer):
            return super().__call__(*args, **kwargs)


class ReadsFromAReplica:
    """A router that sends reads to a replica alias (there is none: asking for it fails the test)."""

    def db_for_read(self, model, **hints):
        return "replica"


@pytest.fixture
def shop_app():
    app = Celery("shop", task_cls=WriterRestrictedTask, set_as_current=False)
    app.conf.task_always_eager = True
    app.finalize()  # the shared task joins the shop's app, with the shop's task class
    return app


def overdue_order():
    from django.utils import timezone

    order = Order.objects.create(expires_at=timezone.now() - timedelta(hours=1))
    from order_timeout import unschedule

    unschedule([order])  # only the scan finds it
    return order


def test_the_task_takes_the_shops_task_class(shop_app):
    assert isinstance(shop_app.tasks["order_timeout.tasks.compensate"], WriterRestrictedTask)


def test_without_a_task_context_the_writer_rules_stop_the_scan(shop_app, settings):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "COMPENSATION_GRACE": 0}
    order = overdue_order()

    result = shop_app.tasks["order_timeout.tasks.compensate"].apply()

    assert isinstance(result.result, WriterAccess) and state(order) == "unpaid"


def test_the_task_context_lets_it_close_under_the_shops_writer_rules(shop_app, settings):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "COMPENSATION_GRACE": 0,
                              "TASK_CONTEXT": "tests.test_celery_task_class.allow_writer"}
    order = overdue_order()

    result = shop_app.tasks["order_timeout.tasks.compensate"].apply()

    assert result.successful(), result.traceback
    assert result.result["closed"] == 1 and state(order) == "closed"


def test_the_task_reads_and_writes_the_primary_only(shop_app, settings):
    settings.DATABASE_ROUTERS = ["tests.test_celery_task_class.ReadsFromAReplica"]
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "COMPENSATION_GRACE": 0,
                              "TASK_CONTEXT": "tests.test_celery_task_class.allow_writer"}
    order = overdue_order()

    result = shop_app.tasks["order_timeout.tasks.compensate"].apply()
    settings.DATABASE_ROUTERS = []  # the test's own look at the row

    assert result.successful(), result.traceback
    assert state(order) == "closed"


def test_a_task_context_that_does_not_import_names_the_key(settings):
    from django.core.exceptions import ImproperlyConfigured

    from order_timeout.conf import settings as order_settings

    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "TASK_CONTEXT": "shop.no_such.allow_writer"}

    with pytest.raises(ImproperlyConfigured, match=r"ORDER_TIMEOUT\['TASK_CONTEXT'\]"):
        order_settings.load()
