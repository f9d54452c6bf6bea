"""Delete rows by key, locking those rows and nothing else.

On MariaDB and MySQL a ``DELETE ... WHERE id IN (...)`` is planned like any other statement: on a
small table the optimizer scans it whole, locking every row it passes and waiting on any another
transaction holds (a consumer's batch inserting its records, a checkout writing its notice), and
in REPEATABLE READ the gaps between them too. One ``DELETE ... WHERE id = %s`` per key, in one
transaction, is always a lookup of that row alone. PostgreSQL locks only the rows a DELETE
removes, whatever its plan: one statement does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import connections, transaction


def delete_keys(model: Any, using: str, keys: Sequence[Any]) -> int:
    """Delete ``model``'s rows with these primary keys on ``using``, in one transaction; how many went."""
    if not keys:
        return 0
    connection = connections[using]
    table = connection.ops.quote_name(model._meta.db_table)
    column = connection.ops.quote_name(model._meta.pk.column)
    with transaction.atomic(using=using, savepoint=False), connection.cursor() as cursor:
        if connection.vendor != "mysql":
            cursor.execute(f"DELETE FROM {table} WHERE {column} IN ({', '.join(['%s'] * len(keys))})", list(keys))
            return int(cursor.rowcount)
        deleted = 0
        for key in keys:
            cursor.execute(f"DELETE FROM {table} WHERE {column} = %s", [key])
            deleted += cursor.rowcount
        return deleted
