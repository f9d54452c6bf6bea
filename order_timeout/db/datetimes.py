"""A faster DATETIME decoder for the consumer's MySQL/MariaDB connections (mysqlclient).

mysqlclient decodes each DATETIME value in Python (``MySQLdb.times.
DateTime_or_None``, string slicing and seven ``int()`` calls): on the
consumer's burst path, two columns of every locked row, it was an eighth of
the close's time. ``datetime.fromisoformat`` does the same in C. It decodes
only the two shapes MariaDB and MySQL send for a DATETIME column
(``YYYY-MM-DD HH:MM:SS`` and the same with six fractional digits); anything
else (a zero date, fewer digits) goes to mysqlclient's own decoder, so every
value decodes exactly as before.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.backends.signals import connection_created

_SHAPES = (19, 26)


def install() -> None:
    """Decode DATETIME with ``decode`` on this process's MySQL connections, open and future."""
    try:
        from MySQLdb.constants import FIELD_TYPE
    except ImportError:  # no mysqlclient: nothing to speed up
        return
    from django.db import connections

    connection_created.connect(_on_connection_created, dispatch_uid="order_timeout.fast_datetimes")
    for connection in connections.all(initialized_only=True):
        if connection.vendor == "mysql" and connection.connection is not None:
            _use(connection.connection, FIELD_TYPE.DATETIME)


def decode(value: str) -> datetime | None:
    if len(value) in _SHAPES:
        try:
            return datetime.fromisoformat(value)
        except ValueError:
            pass  # a zero date and the like: mysqlclient's own answer (None)
    from MySQLdb.times import DateTime_or_None

    result: datetime | None = DateTime_or_None(value)
    return result


def _on_connection_created(sender: Any, connection: Any, **kwargs: Any) -> None:
    if connection.vendor == "mysql":
        from MySQLdb.constants import FIELD_TYPE

        _use(connection.connection, FIELD_TYPE.DATETIME)


def _use(raw: Any, field_type: int) -> None:
    # The driver's connection reads its decoders from this dict when a result arrives.
    converter = getattr(raw, "converter", None)
    if isinstance(converter, dict) and converter.get(field_type) is not decode:
        converter[field_type] = decode
