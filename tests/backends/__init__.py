"""The test run's database backends: Django's own, with a flush that suits a test's teardown.

A transactional test (``django_db(transaction=True)``) ends with Django's ``flush``: on
PostgreSQL one TRUNCATE of every table, about 250 ms for the test project's 54 on the 2-core CI
machine, where deleting their few rows takes 10 to 40 ms; and on either database it deletes the
content types and permissions that every migrated database holds, so that ``post_migrate`` must
write them all again (about 110 ms). Here a test's flush deletes the rows of every other table
and keeps those two; and once the test databases are migrated, the ``post_migrate`` receivers
that write them sit out (reading them whole again cost about 170 ms a test on a busy machine).
What the tests exercise (the app's statements, its transactions and locks) is the stock
backend's.

Only the pytest process uses them (tests/conftest.py); processes a test starts read
DATABASE_URL, with the stock backend.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

# What every migrated database holds, and no test changes: kept across tests.
KEPT_TABLES = {"django_content_type", "auth_permission"}

STOCK = {
    "django.db.backends.postgresql": "tests.backends.postgresql",
    "django.db.backends.mysql": "tests.backends.mysql",
}


def use_test_backends(databases: dict[str, dict[str, Any]]) -> None:
    """Point each database of the stock PostgreSQL or MySQL backend at its test twin."""
    from django.db import connections

    for alias, database in databases.items():
        twin = STOCK.get(database["ENGINE"])
        if twin is None:
            continue
        database["ENGINE"] = twin
        try:
            del connections[alias]  # a wrapper made before now was made with the stock backend
        except AttributeError:
            pass


def as_a_shop_configures_it(database: dict[str, Any]) -> dict[str, Any]:
    """A database's settings with the stock backend, for a project of a test's own to use."""
    stock = {twin: engine for engine, twin in STOCK.items()}
    return {**database, "ENGINE": stock.get(database["ENGINE"], database["ENGINE"])}


def flushed(tables: list[str]) -> list[str]:
    return [table for table in tables if table not in KEPT_TABLES]


@contextmanager
def content_types_and_permissions_kept() -> Iterator[None]:
    """For the block, ``post_migrate`` (sent after each test's flush) leaves the content types and
    permissions as the test databases' migrate wrote them, and as the flush keeps them."""
    from django.contrib.auth.management import create_permissions
    from django.contrib.contenttypes.management import create_contenttypes
    from django.db.models.signals import post_migrate

    permissions_uid = "django.contrib.auth.management.create_permissions"
    post_migrate.disconnect(create_permissions, dispatch_uid=permissions_uid)
    post_migrate.disconnect(create_contenttypes)
    try:
        yield
    finally:
        post_migrate.connect(create_contenttypes)
        post_migrate.connect(create_permissions, dispatch_uid=permissions_uid)
