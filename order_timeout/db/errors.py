"""What a database error means for a close: a passing lock conflict, or a real failure.

A deadlock or a lock wait timeout says nothing about the order: another
transaction (a checkout locking the same stock rows in the other order) was
in the way at that instant. Such errors are retried at once, not counted as
failed closes.
"""

from __future__ import annotations

from django.db import Error as DjangoDatabaseError

# MySQL/MariaDB: ER_LOCK_DEADLOCK, ER_LOCK_WAIT_TIMEOUT.
MYSQL_LOCK_CONFLICTS = frozenset({1213, 1205})
# PostgreSQL SQLSTATEs: deadlock_detected, serialization_failure, lock_not_available.
POSTGRES_LOCK_CONFLICTS = frozenset({"40P01", "40001", "55P03"})


def _chain(error: BaseException) -> list[BaseException]:
    """The error and every error it was raised from (Django wraps the driver's)."""
    seen: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def is_lock_conflict(error: BaseException) -> bool:
    """True for a deadlock, a lock wait timeout or a serialization failure, however wrapped."""
    for link in _chain(error):
        code = link.args[0] if link.args else None
        if isinstance(code, int) and code in MYSQL_LOCK_CONFLICTS and _from_a_driver(link):
            return True
        state = getattr(link, "sqlstate", None) or getattr(link, "pgcode", None)
        if state in POSTGRES_LOCK_CONFLICTS:
            return True
    return False


def _from_a_driver(error: BaseException) -> bool:
    """Only database errors carry MySQL's numeric codes in ``args[0]``."""
    module = type(error).__module__ or ""
    return isinstance(error, DjangoDatabaseError) or module.startswith(("MySQLdb", "pymysql"))
