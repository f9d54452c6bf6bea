"""The database side of the consumer's own session: its clock, its time limits, and ending it.

The database's clock decides whether an order is due, so a consumer whose
host clock is wrong can be late but never early. The session limits keep a
closing transaction from holding row locks much longer than a lease, even
when its consumer is frozen (SIGSTOP, a paused VM) or a receiver hangs.

Behind a transaction pooler (``DATABASE_POOLING = "transaction"``, PgBouncer's
``pool_mode = transaction``) a session is not ours between two transactions:
the limits then go on each transaction that locks orders, with ``SET LOCAL``
(``limit_transaction``), and no session is named by its id to be ended.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any
from weakref import WeakKeyDictionary

from django.core.exceptions import ImproperlyConfigured
from django.db import Error as DatabaseError, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models.functions import Now
from django.utils import timezone
from django.utils.connection import ConnectionProxy

from ..conf import settings
from ..redaction import one_line

logger = logging.getLogger("order_timeout")

# MySQL/MariaDB's "Unknown thread id" from KILL: the session is gone already.
MYSQL_UNKNOWN_THREAD = 1094

# Under transaction pooling: the seconds each connection's order-locking transactions are
# limited to, set by ``limit_session``/``limited_session`` and applied by
# ``limit_transaction``. Keyed by the connection wrapper, which is per thread (and goes
# with it); never filled under session pooling, so there ``limit_transaction`` sends nothing.
_transaction_limits: WeakKeyDictionary[BaseDatabaseWrapper, float] = WeakKeyDictionary()

# How far ahead of the database's clock the app judges what is due: zero, except while a test
# moves time (order_timeout.testing.travel). Every read of the database's clock by the app goes
# through ``database_now`` or ``as_read``, so a deadline, a reminder's lead, a hold's longest
# and a pause are all judged by the same moved clock, and the server's clock is left alone.
_ahead = timedelta(0)


def judge_ahead(by: timedelta) -> None:
    """Judge what is due ``by`` ahead of the database's clock from now on (``timedelta(0)``: as it
    is); for tests only (order_timeout.testing)."""
    global _ahead
    _ahead = by


def judged_ahead() -> timedelta:
    return _ahead


class DatabaseNow(Now):
    """The database server's time now, in UTC.

    Django's ``Now()`` is ``CURRENT_TIMESTAMP(6)`` on MySQL/MariaDB, which
    follows the session's time zone; datetimes are stored in UTC.
    """

    def as_mysql(self, compiler: Any, connection: Any, **extra_context: Any) -> Any:
        return self.as_sql(compiler, connection, template="UTC_TIMESTAMP(6)", **extra_context)


def as_read(clock: datetime | None, connection: Any) -> datetime | None:
    """The clock a statement read with ``DatabaseNow``, as Django's converter handed it back.

    On MySQL that is ``UTC_TIMESTAMP(6)``'s wall time, which the converter labels in the
    connection's time zone: right while it is UTC, hours off with ``DATABASES[...]["TIME_ZONE"]``
    set (a database that stores local times), where a deadline an hour ahead read as due.
    Labelled UTC again; another database's clock comes with its zone and stays as it is.
    """
    if clock is None:
        return None
    if connection.vendor == "mysql" and not timezone.is_naive(clock):
        clock = clock.replace(tzinfo=UTC)
    return clock + _ahead if _ahead else clock


def database_now(using: str) -> datetime:
    """The database server's clock, read with one query (this host's for SQLite, the demo's)."""
    connection = connections[using]
    sql = {"mysql": "SELECT UTC_TIMESTAMP(6)", "postgresql": "SELECT STATEMENT_TIMESTAMP()"}.get(
        connection.vendor)
    if sql is None:
        return timezone.now() + _ahead
    with connection.cursor() as cursor:
        cursor.execute(sql)
        value = cursor.fetchone()[0]
    return (timezone.make_aware(value, UTC) if timezone.is_naive(value) else value) + _ahead


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


def _set(connection: BaseDatabaseWrapper, values: dict[str, Any], *, local: bool = False) -> None:
    """Set ``values`` in one statement: for the session, or (``local``, PostgreSQL only) for the
    transaction in progress, as ``SET LOCAL`` does."""
    if not values:
        return
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            scope = "true" if local else "false"
            cursor.execute("SELECT " + ", ".join([f"set_config(%s, %s, {scope})"] * len(values)),
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


def pooled_by_transaction() -> bool:
    """Whether a pooler may give this app's server connection to another client after each
    transaction (``DATABASE_POOLING`` is "transaction")."""
    return bool(settings.DATABASE_POOLING == "transaction")


def _transaction_scoped(connection: BaseDatabaseWrapper) -> None:
    """Refuse transaction pooling where the limits cannot be scoped to a transaction.

    MySQL and MariaDB have no ``SET LOCAL``: the limits would be session-wide
    (leaking to the pool's next client) or missing (row locks unbounded).
    Check ``order_timeout.E016`` says so at start-up; this is for the
    processes that run no checks (a Celery worker), before any row is locked.
    """
    if connection.vendor == "mysql":
        raise ImproperlyConfigured(
            "ORDER_TIMEOUT['DATABASE_POOLING'] is 'transaction', which needs PostgreSQL: MySQL "
            "and MariaDB cannot scope a time limit to a transaction. Use 'session' (check "
            "order_timeout.E016).")


def limit_session(connection: BaseDatabaseWrapper, seconds: float) -> None:
    """Let the server end this session's transactions idle, or statements running, over ``seconds``.

    Server-side, so it holds while this process cannot act: frozen, or stuck
    in a receiver. For the consumer's own sessions, for good. Under
    transaction pooling nothing is sent: a session-level limit would stay on
    a server connection that serves other clients next, so the limits go on
    each transaction that locks orders instead (``limit_transaction``).
    """
    if pooled_by_transaction():
        _transaction_scoped(connection)
        # The wrapper itself: django.db.connection is a proxy of this thread's, and no key.
        own = connections[connection.alias] if isinstance(connection, ConnectionProxy) else connection
        _transaction_limits[own] = seconds
        return
    _set(connection, _limits(connection, seconds))


def limit_transaction(using: str) -> None:
    """Give the transaction just begun on ``using`` the limits its session was given.

    Called first thing inside each transaction that holds order row locks
    (closing, reminding). Under transaction pooling, and on a connection
    limited by ``limit_session`` or ``limited_session``, one statement sets
    them for this transaction only (``SET LOCAL``: the pool's next client
    never sees them). Otherwise it sends nothing: the session carries them.
    """
    connection = connections[using]
    seconds = _transaction_limits.get(connection)
    # Asked again each time: a setting changed since (a test's override) is followed.
    if seconds is not None and pooled_by_transaction():
        _set(connection, _limits(connection, seconds), local=True)


@contextmanager
def limited_session(using: str, seconds: float) -> Iterator[None]:
    """``limit_session`` for a while, on a connection that is not ours (a Celery worker's, a request's).

    The values it found are put back after; if the server ended the session
    meanwhile, the connection is closed instead, and the next use opens a
    fresh one. Under transaction pooling it sends nothing: the transactions
    that lock orders meanwhile carry the limits (``limit_transaction``).
    """
    connection = connections[using]
    if pooled_by_transaction():
        with _limited_transactions(connection, seconds):
            yield
        return
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


@contextmanager
def _limited_transactions(connection: BaseDatabaseWrapper, seconds: float) -> Iterator[None]:
    """``limited_session`` under transaction pooling: the connection's transactions get the
    limits for the block, then whatever they had before it (a consumer's, or none)."""
    _transaction_scoped(connection)
    outer = _transaction_limits.get(connection)
    _transaction_limits[connection] = seconds
    try:
        yield
    finally:
        if outer is None:
            _transaction_limits.pop(connection, None)
        else:
            _transaction_limits[connection] = outer


def session_id(connection: BaseDatabaseWrapper) -> Any:
    """The server's id for this session (MySQL thread id, PostgreSQL backend pid), or None.

    None under transaction pooling: the pid the driver reports there is the
    pooler's (PgBouncer's cancel key), and the backends this client's
    statements ran on serve other clients next, so no pid names a session of
    ours to end (ending one would roll back someone else's transaction).
    """
    raw = connection.connection
    if raw is None or pooled_by_transaction():
        return None
    if connection.vendor == "mysql":
        return raw.thread_id()
    if connection.vendor == "postgresql":
        info = getattr(raw, "info", None)
        return info.backend_pid if info is not None else raw.get_backend_pid()
    return None


def session_identity(connection: BaseDatabaseWrapper) -> str | None:
    """A name another process can end this session by without ending a stranger's, or None.

    MySQL/MariaDB: the thread id (never reused while the server runs, short
    of a 2**32 wrap). PostgreSQL: the backend pid and when that backend
    started, since a pid is reused as soon as its process exits. One query,
    once per connection.
    """
    sid = session_id(connection)
    if sid is None:
        return None
    if connection.vendor != "postgresql":
        return str(sid)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {_PG_STARTED_US} FROM pg_stat_activity WHERE pid = pg_backend_pid()")
        row = cursor.fetchone()
    return f"{sid}@{row[0]}" if row else None


# When a PostgreSQL backend started, in whole microseconds: compared exactly.
_PG_STARTED_US = "(extract(epoch FROM backend_start) * 1000000)::bigint"


def end_session_named(using: str, identity: str) -> bool:
    """End the session ``session_identity`` named, if it is still that session; True if this call did.

    For a consumer found dead (its heartbeat stopped): a frozen one's open
    transaction keeps its rows locked until the server's own limit ends it.
    """
    if "@" not in identity:
        return end_session(using, int(identity))
    pid, started = (int(part) for part in identity.split("@", 1))
    connection = connections[using]
    try:
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                           f"WHERE pid = %s AND {_PG_STARTED_US} = %s", [pid, started])
            row = cursor.fetchone()
    except DatabaseError as exc:
        logger.warning("Could not end database session %s: %s", pid, one_line(exc))
        return False
    finally:
        connection.close()
    return bool(row and row[0])


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
            logger.warning("Could not end database session %s: %s", sid, one_line(exc))
            return False
        ended = False
    finally:
        connection.close()
    if not ended:
        logger.debug("Database session %s had already ended.", sid)
    return ended
