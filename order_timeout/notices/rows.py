"""A batch of notice rows in one INSERT, at a few microseconds a row.

``notify_many()`` runs inside a close's transaction, once per batch of
hundreds of orders, so its cost is paid on every close. ``bulk_create()``
spends most of its time preparing each of a row's twelve fields through
the field API (about 70 µs a row here, four times the close itself); the
rows of one batch differ only in their key, payload and object, so this
writes the statement directly, through the backend's own pieces (quoted
names, the bulk VALUES, RETURNING where the database has it), with the
constant columns written once as SQL and each datetime adapted once.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from datetime import datetime
from typing import Any, overload

from django.db import connections

# (key, payload as JSON text, payload as a value, object model, object id): one notice; a
# reference to an object has no payload text (None): its payload is the empty object.
Stored = tuple[str, str | None, Any, str, str]

# Written per row: the columns that differ from row to row, as parameters, in this order.
PARAMETERS = ("key", "payload", "object_model", "object_id")
# Written once a batch, as SQL: the columns every row of one notify_many() shares. A handler's
# name is letters, digits and ``_.:-`` (the registry refuses any other), a datetime as the
# backend adapts it is digits and ``-:. T+``: both are written as quoted literals, so the
# database parses them once a row instead of the driver escaping them once a row.
SHARED = ("handler", "due_at", "created_at")
# Written once, as SQL: every new notice starts so (the model's defaults; the state is
# Notice.State.PENDING, which test_a_written_notice_reads_as_its_row_does reads back).
CONSTANTS = {"state": "'pending'", "attempts": "0", "last_error": "''", "last_answer": "''"}
# What may be written as a literal without escaping; anything else goes as a parameter.
_PLAIN = re.compile(r"^[A-Za-z0-9_.:+ T-]*$")


class Written(Sequence[Any]):
    """The notices one ``notify_many()`` wrote: their keys at once, each row built only when read
    (a close's receiver reads none; building 500 instances would cost as much as the INSERT)."""

    def __init__(self, using: str, handler: str, due: datetime, created: datetime, pks: list[Any],
                 stored: Sequence[Stored]) -> None:
        self.using, self.handler, self.due, self.created = using, handler, due, created
        self.pks = pks
        self._stored = stored
        self._rows: dict[int, Any] = {}

    def __len__(self) -> int:
        return len(self.pks)

    @overload
    def __getitem__(self, index: int) -> Any: ...

    @overload
    def __getitem__(self, index: slice) -> list[Any]: ...

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        index = range(len(self))[index]
        if index not in self._rows:
            self._rows[index] = _row(self.using, self.pks[index], self.handler, self._stored[index], self.due,
                                     self.created)
        return self._rows[index]

    def __repr__(self) -> str:
        return f"<Written {len(self)} notice(s) for {self.handler!r}>"


def insert_notices(using: str, handler: str, due: datetime, stored: Sequence[Stored]) -> Written:
    """Write one pending notice per ``stored`` for ``handler``, due at ``due``; the rows, keys set."""
    from ..models import Notice

    connection = connections[using]
    opts = Notice._meta
    # created_at: when notify() wrote it, by this host's clock, as the model's default says.
    created = Notice._meta.get_field("created_at").get_default()
    shared = [handler, connection.ops.adapt_datetimefield_value(due),
              connection.ops.adapt_datetimefield_value(created)]
    literals = [_literal(value) for value in shared]
    # A value that cannot be written as a literal goes as a parameter of every row.
    shared_params = [value for value, literal in zip(shared, literals, strict=True) if literal is None]
    constants = [literal or "%s" for literal in literals] + list(CONSTANTS.values())
    # A JSON text into PostgreSQL's jsonb column says what it is; elsewhere the column takes text.
    payload = "%s::jsonb" if connection.vendor == "postgresql" else "%s"
    # A row with a payload, and a row about an object (its payload the empty object, as SQL).
    with_payload = _row_sql({"payload": payload}, constants)
    about_object = _row_sql({"payload": "'{}'"}, constants)
    column_of = {field.name: str(field.column) for field in opts.concrete_fields}
    columns = ", ".join(connection.ops.quote_name(column_of[name]) for name in (*PARAMETERS, *SHARED, *CONSTANTS))
    fields = [opts.get_field(name) for name in (*PARAMETERS, *SHARED)]
    size = max(1, connection.ops.bulk_batch_size(fields, stored) or len(stored))
    returning = connection.features.can_return_rows_from_bulk_insert
    keys: list[Any] = []
    with connection.cursor() as cursor:
        for start in range(0, len(stored), size):
            part = stored[start:start + size]
            params: list[Any] = []
            rows: list[str] = []
            for key, text, _value, object_model, object_id in part:
                if text is None:
                    params += (key, object_model, object_id, *shared_params)
                    rows.append(about_object)
                else:
                    params += (key, text, object_model, object_id, *shared_params)
                    rows.append(with_payload)
            sql = f"INSERT INTO {connection.ops.quote_name(opts.db_table)} ({columns}) VALUES " + ", ".join(rows)
            if returning:
                sql += " RETURNING " + connection.ops.quote_name(str(opts.pk.column))
            cursor.execute(sql, params)
            if returning:
                keys += [row[0] for row in cursor.fetchall()]
    if not returning:
        # A database that returns no keys from an INSERT (MySQL; MariaDB and PostgreSQL do): read
        # them back in the same transaction, by the keys just written.
        found = dict(Notice.objects.using(using).filter(
            handler=handler, key__in={row[0] for row in stored}, state=Notice.State.PENDING,
            created_at=created).values_list("key", "pk"))
        keys = [found[row[0]] for row in stored]
    return Written(using, handler, due, created, keys, stored)


def _literal(value: Any) -> str | None:
    """``value`` as a quoted SQL literal when it is plain (module comment), else None."""
    text = value.isoformat(sep=" ") if isinstance(value, datetime) else value
    return f"'{text}'" if isinstance(text, str) and _PLAIN.match(text) else None


def _row_sql(placeholders: dict[str, str], constants: list[str]) -> str:
    """One row of the VALUES: a placeholder per parameter (or the SQL given for it), then the constants."""
    return "(" + ", ".join([*(placeholders.get(name, "%s") for name in PARAMETERS), *constants]) + ")"


@functools.cache
def _attnames() -> tuple[str, ...]:
    """The notice's fields in the order of its columns, as ``from_db`` is told them."""
    from ..models import Notice

    return tuple(field.attname for field in Notice._meta.concrete_fields)


def _row(using: str, pk: Any, handler: str, stored: Stored, due: datetime, created: datetime) -> Any:
    """The written notice as an instance, built positionally (as a query's rows are: from_db)."""
    from ..models import Notice

    key, _text, value, object_model, object_id = stored
    return Notice.from_db(using, _attnames(), (pk, handler, key, value, object_model, object_id, due,
                                        Notice.State.PENDING.value, 0, created, None, "", ""))
