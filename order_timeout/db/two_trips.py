"""A batch's transaction in two round trips: BEGIN sent with its reads, its writes with COMMIT.

Under Django's ``atomic`` a plain close costs five round trips on MySQL and
MariaDB (``SET autocommit=0``, the locking ``SELECT``, the ``UPDATE``,
``COMMIT``, ``SET autocommit=1``) and four on PostgreSQL (psycopg waits for
its ``BEGIN``). The statements are what the close needs; the trips between
them are waits, and on a busy machine each wait is a sleep and a wake-up
behind the other processes. A batch that runs no code of the shop's (no
receiver, no savepoint, nothing that may ask Django about its transaction)
needs none of ``atomic``'s bookkeeping, so it takes two:

1. ``BEGIN`` (``START TRANSACTION``) with the locking ``SELECT`` and the
   conditions read after it, in one query (``together.read_together``);
2. the writes with ``COMMIT``, in one query (``commit_with``).

Each statement still runs after the one before it has finished, in the same
transaction, with the same isolation: a condition read after the lock sees
every commit made before the rows were locked. A failure anywhere rolls the
transaction back (``ROLLBACK``, or the session is closed when even that
fails) and is raised as it would be under ``atomic``.

Only where the connection takes several statements in one query: mysqlclient
with multi-statements on (its default), psycopg 3 binding parameters on the
client (Django's default); the connection in autocommit, outside any
``atomic`` (a test's transaction keeps ``atomic``); and with no limits to set
per transaction (transaction pooling sets them first thing in each).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from django.db import connections
from django.db.models.fields import AutoFieldMixin
from django.db.models.sql import InsertQuery, UpdateQuery

logger = logging.getLogger("order_timeout")


@dataclass
class _Trips:
    """The transaction two_trips keeps: whether its BEGIN went, and the writes kept for its COMMIT."""

    using: str
    opened: bool = False
    writes: list[tuple[str, tuple[Any, ...]]] = field(default_factory=list)


_open: ContextVar[_Trips | None] = ContextVar("order_timeout_two_trips", default=None)


def takes_two_trips(using: str) -> bool:
    """Whether a transaction on ``using`` may be sent as two queries (see the module's docstring)."""
    from .session import pooled_by_transaction

    connection = connections[using]
    if connection.in_atomic_block or pooled_by_transaction():
        return False
    connection.ensure_connection()
    if not connection.get_autocommit():
        return False
    if connection.vendor == "mysql":
        from MySQLdb.constants import CLIENT

        return bool(getattr(connection.connection, "client_flag", 0) & CLIENT.MULTI_STATEMENTS)
    if connection.vendor == "postgresql":
        try:
            import psycopg
        except ImportError:  # psycopg2
            return False
        with connection.cursor() as cursor:
            return isinstance(cursor.cursor, psycopg.ClientCursor)
    return False


@contextmanager
def two_trips(using: str) -> Iterator[None]:
    """A transaction on ``using`` the next read opens (``opening``) and the end commits with the kept
    writes (``update``); rolled back on any error. Only where ``takes_two_trips(using)``."""
    trips = _Trips(using)
    token = _open.set(trips)
    try:
        yield
    except BaseException:
        _open.reset(token)
        if trips.opened:
            _roll_back(using)
        raise
    _open.reset(token)
    if trips.opened:
        _commit_with(trips)
    elif trips.writes:
        raise RuntimeError("writes kept for a COMMIT, but no read began the transaction")


def opening(using: str) -> str | None:
    """The statement that begins the transaction the next read on ``using`` opens (None: none to
    open, or opened already); the caller sends it first, with its read."""
    trips = _open.get()
    if trips is None or trips.using != using or trips.opened:
        return None
    trips.opened = True
    return "START TRANSACTION" if connections[using].vendor == "mysql" else "BEGIN"


def update(queryset: Any, values: dict[str, Any]) -> None:
    """``queryset.update(**values)``: sent with the COMMIT in a two-trip transaction on its database,
    at once otherwise."""
    trips = _open.get()
    if trips is None or trips.using != queryset.db or not trips.opened:
        queryset.update(**values)
        return
    query = queryset.query.chain(UpdateQuery)
    query.add_update_values(values)
    query.annotations = {}
    compiler = query.get_compiler(queryset.db)
    compiler.pre_sql_setup()
    sql, params = compiler.as_sql()
    if sql:
        trips.writes.append((sql, tuple(params)))


def insert(model: Any, using: str, rows: list[Any]) -> None:
    """``bulk_create(rows)`` of ``model``'s new rows (their keys the database's to give): sent with the
    COMMIT in a two-trip transaction on ``using``, at once otherwise."""
    trips = _open.get()
    if trips is None or trips.using != using or not trips.opened or not isinstance(model._meta.pk, AutoFieldMixin):
        model._base_manager.using(using).bulk_create(rows)
        return
    if not rows:
        return
    fields = [field for field in model._meta.concrete_fields if field is not model._meta.pk]
    query = InsertQuery(model)
    query.insert_values(fields, rows, raw=False)
    trips.writes.extend((sql, tuple(params)) for sql, params in query.get_compiler(using).as_sql())


def _commit_with(trips: _Trips) -> None:
    """The kept writes and the COMMIT in one query; every result read (the server stops at the first
    that fails: the transaction is then rolled back)."""
    connection = connections[trips.using]
    statements = [sql for sql, _params in trips.writes] + ["COMMIT"]
    params = tuple(param for _sql, statement_params in trips.writes for param in statement_params)
    try:
        with connection.cursor() as cursor:
            cursor.execute("; ".join(statements), params)
            while cursor.nextset():
                pass
    except BaseException:
        _roll_back(trips.using)
        raise


def _roll_back(using: str) -> None:
    """End the transaction a failure left open; a session that cannot even do that is closed (the
    server rolls back what it held), so the next use opens a fresh one."""
    connection = connections[using]
    try:
        with connection.cursor() as cursor:
            cursor.execute("ROLLBACK")
    except Exception as exc:
        logger.warning("Could not roll back a batch's transaction (%s); closing its connection.", exc)
        connection.close()
