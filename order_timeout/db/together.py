"""Statements sent to the database in one round trip, run one after the other, each read apart.

A batch asks its rows' lock and then a condition of the locked rows (a payment
in flight): two statements, where the second must run after the first has
locked, so that it sees every commit made before the lock. The server runs
them in order either way; what costs is the wait between them, a sleep and a
wake-up of the consumer that queues behind the other processes on a busy
machine. So they go together:

- MySQL and MariaDB: one multi-statement query, each result read in turn
  (``nextset``); mysqlclient connects with multi-statements on unless the
  project's ``OPTIONS`` turn them off (then one trip each, as before).
- PostgreSQL with psycopg 3: pipeline mode, the transaction's ``BEGIN`` queued
  with them; the libpq must support it (14 or later).

Anything else (psycopg2, another backend): ``None``, and the caller asks one
statement at a time. In a transaction ``two_trips`` keeps, the first read sends
its ``BEGIN`` too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from .two_trips import opening

Rows = list[tuple[Any, ...]]


class Compiled(Protocol):
    """A statement ready to send (templates.Compiled): its SQL, its parameters, its connection."""

    @property
    def sql(self) -> str: ...

    @property
    def params(self) -> tuple[Any, ...]: ...

    @property
    def connection(self) -> Any: ...


def read_together(statements: Sequence[Compiled], prepare: Callable[[Any], None]) -> list[Rows] | None:
    """Each statement's rows, as the driver returned them, the statements sent in one round trip on
    their (common) connection; None when that connection cannot. ``prepare(cursor)`` before each."""
    connection = statements[0].connection
    begin = opening(connection.alias)
    if begin is not None:
        # A two-trip transaction (two_trips.py) opens here: its BEGIN goes first, in the same query.
        return _in_one_query(connection, statements, prepare, begin=begin)
    if connection.vendor == "mysql" and _takes_many_statements(connection):
        return _in_one_query(connection, statements, prepare)
    if connection.vendor == "postgresql" and _pipelines(connection):
        return _in_a_pipeline(connection, statements, prepare)
    return None


def _takes_many_statements(connection: Any) -> bool:
    from MySQLdb.constants import CLIENT

    connection.ensure_connection()
    return bool(getattr(connection.connection, "client_flag", 0) & CLIENT.MULTI_STATEMENTS)


def _in_one_query(connection: Any, statements: Sequence[Compiled], prepare: Callable[[Any], None], *,
                  begin: str | None = None) -> list[Rows]:
    """One query of every statement, ``;`` between them (after ``begin``, whose result is passed
    over); each result read before the next (the server stops at the first that fails, which
    raises here as it would alone)."""
    with connection.cursor() as cursor:
        prepare(cursor)
        cursor.execute("; ".join([*([begin] if begin else []), *(statement.sql for statement in statements)]),
                       tuple(param for statement in statements for param in statement.params))
        if begin and not cursor.nextset():
            raise RuntimeError(f"{begin} and {len(statements)} statement(s) sent in one query, one result came back")
        fetched = [list(cursor.fetchall())]
        while len(fetched) < len(statements):
            if not cursor.nextset():
                raise RuntimeError(f"{len(statements)} statements sent in one query, "
                                   f"{len(fetched)} result(s) came back")
            fetched.append(list(cursor.fetchall()))
    return fetched


def _pipelines(connection: Any) -> bool:
    try:
        import psycopg
    except ImportError:  # psycopg2
        return False
    connection.ensure_connection()
    return isinstance(connection.connection, psycopg.Connection) and psycopg.Pipeline.is_supported()


def _in_a_pipeline(connection: Any, statements: Sequence[Compiled], prepare: Callable[[Any], None]) -> list[Rows]:
    """Every statement queued in one pipeline (after the transaction's ``BEGIN``, when it opens one),
    sent with one sync; each cursor read once the pipeline is done."""
    cursors = []
    try:
        with connection.wrap_database_errors, connection.connection.pipeline():
            for statement in statements:
                cursor = connection.cursor()
                cursors.append(cursor)
                prepare(cursor)
                cursor.execute(statement.sql, statement.params)
        return [list(cursor.fetchall()) for cursor in cursors]
    finally:
        for cursor in cursors:
            cursor.close()
