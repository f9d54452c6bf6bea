"""The database side of the consumer's own session: its clock, its time limits, and ending it.

The database's clock decides whether an order is due, so a consumer whose
host clock is wrong can be late but never early. The session limits keep a
closing transaction from holding row locks much longer than a lease, even
when its consumer is frozen (SIGSTOP, a paused VM) or a receiver hangs.
"""

from __future__ import annotations

import logging
import math
from datetime import UTC, datetime
from typing import Any

from django.db import Error as DatabaseError, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models.functions import Now
from django.utils import timezone

logger = logging.getLogger("order_timeout")


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


def limit_session(connection: BaseDatabaseWrapper, seconds: float) -> None:
    """Let the server end this session's transactions idle, or statements running, over ``seconds``.

    Server-side, so it holds while this process cannot act: frozen, or stuck
    in a receiver. Only the consumer's own sessions get it.
    """
    whole = max(1, math.ceil(seconds))
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(f"SET idle_in_transaction_session_timeout = '{whole}s'")
            cursor.execute(f"SET statement_timeout = '{whole}s'")
        elif connection.vendor == "mysql" and getattr(connection, "mysql_is_mariadb", False):
            cursor.execute(f"SET SESSION idle_transaction_timeout = {whole}, "
                           f"max_statement_time = {whole}")
        elif connection.vendor == "mysql":
            # MySQL has no idle-transaction limit (docs/design.md says what that costs).
            cursor.execute(f"SET SESSION max_execution_time = {whole * 1000}")


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
    """End another session of ours (its transaction rolls back, its row locks go); True if done.

    Runs on this thread's own connection to ``using``.
    """
    connection = connections[using]
    try:
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute("SELECT pg_terminate_backend(%s)", [sid])
            elif connection.vendor == "mysql":
                cursor.execute(f"KILL {int(sid)}")
            else:
                return False
        return True
    except DatabaseError as exc:
        logger.warning("Could not end database session %s: %s", sid, exc)
        return False
    finally:
        connection.close()
