"""The database side of the consumer's own session: its clock, its time limits, and ending it.

The database's clock decides whether an order is due, so a consumer whose
host clock is wrong can be late but never early. The session limits keep a
closing transaction from holding row locks much longer than a lease, even
when its consumer is frozen (SIGSTOP, a paused VM) or a receiver hangs.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from django.db import Error as DatabaseError, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models.functions import Now
from django.utils import timezone

logger = logging.getLogger("order_timeout")

# MySQL/MariaDB's "Unknown thread id" from KILL: the session is gone already.
MYSQL_UNKNOWN_THREAD = 1094


class DatabaseNow(Now):
    """The database server's time now, in UTC.

    Django's ``Now()`` is ``CURRENT_TIMESTAMP(6)`` on MySQL/MariaDB, which
    follows the session's time zone; datetimes are stored in UTC.
    """

    def as_mysql(self, compiler: Any, connection: Any, **extra_context: Any) -> Any:
        return self.as_sql(compiler, connection, template="UTC_TIMESTAMP(6)", **extra_context)


def database_now(using: str) -> datetime:
    """The database server's clock, read with one query (this host's for SQLite, the demo's)."""
    connection = connections[using]
    sql = {"mysql": "SELECT UTC_TIMESTAMP(6)", "postgresql": "SELECT STATEMENT_TIMESTAMP()"}.get(
        connection.vendor)
    if sql is None:
        return timezone.now()
    with connection.cursor() as cursor:
        cursor.execute(sql)
        value = cursor.fetchone()[0]
    return timezone.make_aware(value, UTC) if timezone.is_naive(value) else value


def _limits(connection: BaseDatabaseWrapper, seconds: float) -> dict[str, Any]:
    """The session variables that end a transaction idle, or a statement running, over ``seconds``."""
    whole = max(1, math.ceil(seconds))
    if connection.vendor == "postgresql":
        return {"idle_in_transaction_session_timeout": f"{whole}s", "statement_timeout": f"{whole}s"}
    if connection.vendor == "mysql" and getattr(connection, "mysql_is_mariadb", False):
        return {"idle_transaction_timeout": whole, "max_statement_time": whole}
    if connection.vendor == "mysql":
        # MySQL has no idle-transaction limit (docs/design.md says what that costs).
        return {"max_execution_time": whole * 1000}
    return {}


def _set(connection: BaseDatabaseWrapper, values: dict[str, Any]) -> None:
    if not values:
        return
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT " + ", ".join(["set_config(%s, %s, false)"] * len(values)),
                           [str(part) for pair in values.items() for part in pair])
        else:
            cursor.execute("SET SESSION " + ", ".join(f"{name} = %s" for name in values), list(values.values()))


def _read(connection: BaseDatabaseWrapper, names: list[str]) -> dict[str, Any]:
    if not names:
        return {}
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT " + ", ".join(["current_setting(%s)"] * len(names)), names)
        else:
            cursor.execute("SELECT " + ", ".join(f"@@SESSION.{name}" for name in names))
        return dict(zip(names, cursor.fetchone(), strict=True))


def limit_session(connection: BaseDatabaseWrapper, seconds: float) -> None:
    """Let the server end this session's transactions idle, or statements running, over ``seconds``.

    Server-side, so it holds while this process cannot act: frozen, or stuck
    in a receiver. For the consumer's own sessions, for good.
    """
    _set(connection, _limits(connection, seconds))


@contextmanager
def limited_session(using: str, seconds: float) -> Iterator[None]:
    """``limit_session`` for a while, on a connection that is not ours (a Celery worker's, a request's).

    The values it found are put back after; if the server ended the session
    meanwhile, the connection is closed instead, and the next use opens a
    fresh one.
    """
    connection = connections[using]
    limits = _limits(connection, seconds)
    previous = _read(connection, list(limits))
    _set(connection, limits)
    try:
        yield
    finally:
        try:
            _set(connection, previous)
        except DatabaseError:
            if not connection.in_atomic_block:
                connection.close()


def session_id(connection: BaseDatabaseWrapper) -> Any:
    """The server's id for this session (MySQL thread id, PostgreSQL backend pid), or None."""
    raw = connection.connection
    if raw is None:
        return None
    if connection.vendor == "mysql":
        return raw.thread_id()
    if connection.vendor == "postgresql":
        info = getattr(raw, "info", None)
        return info.backend_pid if info is not None else raw.get_backend_pid()
    return None


def end_session(using: str, sid: Any) -> bool:
    """End another session of ours (its transaction rolls back, its row locks go); True if this call did.

    False when there was no such session left to end: the server ended it
    first (its idle-transaction limit, a frozen consumer thawed), which is
    logged at DEBUG only, the same on both vendors (MySQL/MariaDB's KILL
    fails with "Unknown thread id", PostgreSQL's ``pg_terminate_backend()``
    returns false); or when it could not be ended, which is a WARNING. Its
    caller, the lease guard, needs only the session gone and does not look
    at the answer. Runs on this thread's own connection to ``using``, closed
    after.
    """
    connection = connections[using]
    try:
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute("SELECT pg_terminate_backend(%s)", [sid])
                ended = bool(cursor.fetchone()[0])
            elif connection.vendor == "mysql":
                cursor.execute(f"KILL {int(sid)}")
                ended = True
            else:
                return False
    except DatabaseError as exc:
        if not (exc.args and exc.args[0] == MYSQL_UNKNOWN_THREAD):
            logger.warning("Could not end database session %s: %s", sid, exc)
            return False
        ended = False
    finally:
        connection.close()
    if not ended:
        logger.debug("Database session %s had already ended.", sid)
    return ended
