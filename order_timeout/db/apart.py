"""Write a row in a transaction of its own, whatever the caller's transaction does.

A refusal is raised inside the caller's transaction (the shop's ``atomic()`` block, or the app's
own around a save), which the refusal then rolls back: a row written there would go with it. So
the row goes in on a connection of its own to the same database, opened for it and closed at once,
in autocommit, where it commits alone. A caller already in autocommit, in no atomic block, needs no
second connection: its own INSERT commits alone there too.

SQLite has one writer at a time, and the caller's open transaction is it: a second connection
would wait for a lock the caller releases only after this returns. There, inside a transaction,
the row cannot be written apart (``CannotWriteApart``).
"""

from __future__ import annotations

from django.db import connections, models
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models.sql import InsertQuery


class CannotWriteApart(Exception):
    """The database cannot take a row beside the caller's open transaction (SQLite)."""


def insert_apart(row: models.Model, using: str) -> None:
    """INSERT ``row`` (new, its primary key left to the database) so that it stays whatever becomes
    of the caller's transaction on ``using``. Its signals are not sent; ``row.pk`` is set."""
    own = connections[using]
    if not own.in_atomic_block and own.get_autocommit():
        _insert(row, own)
        return
    if own.vendor == "sqlite":
        raise CannotWriteApart("SQLite cannot write beside the open transaction that holds its one write lock")
    apart = connections.create_connection(using)
    try:
        # A new connection is in autocommit (Django's default): the INSERT is its own transaction.
        _insert(row, apart)
    finally:
        apart.close()


def _insert(row: models.Model, connection: BaseDatabaseWrapper) -> None:
    """The INSERT ``Model.save()`` would run, on ``connection`` rather than the alias's own."""
    meta = row._meta
    fields = [field for field in meta.local_concrete_fields
              if field is not meta.auto_field and not getattr(field, "generated", False)]
    query = InsertQuery(type(row))
    query.insert_values(fields, [row])
    returned = query.get_compiler(connection=connection).execute_sql(returning_fields=[meta.pk])
    if returned and returned[0]:
        row.pk = returned[0][0]
