"""How large a table is on disk, as the database's own statistics say: cheap to ask at any size.

Rows are the server's estimate (InnoDB's ``TABLE_ROWS``, PostgreSQL's ``reltuples`` after its
last ANALYZE), bytes its data and indexes together. Neither counts a row: ``COUNT(*)`` over a
table of a year's rows is exactly the cost a status command must not pay. SQLite (the demo)
counts its rows and has no byte figure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db import connections


@dataclass(frozen=True)
class TableSize:
    # Estimated rows (None: the server has no estimate yet, a table never analysed).
    rows: int | None
    # Data and indexes, in bytes (None: the server cannot say).
    bytes: int | None


def table_sizes(using: str, models: Sequence[Any]) -> dict[str, TableSize]:
    """Each model's table size on ``using``, by table name."""
    connection = connections[using]
    tables = [model._meta.db_table for model in models]
    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            cursor.execute(
                "SELECT TABLE_NAME, TABLE_ROWS, DATA_LENGTH + INDEX_LENGTH FROM information_schema.TABLES "
                f"WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME IN ({', '.join(['%s'] * len(tables))})", tables)
            found = {name: TableSize(_int(rows), _int(size)) for name, rows, size in cursor.fetchall()}
        elif connection.vendor == "postgresql":
            cursor.execute(
                "SELECT c.relname, c.reltuples, pg_total_relation_size(c.oid) FROM pg_class c "
                "WHERE c.oid = ANY(ARRAY[" + ", ".join(["to_regclass(%s)"] * len(tables)) + "])", tables)
            found = {name: TableSize(None if rows < 0 else round(rows), _int(size))
                     for name, rows, size in cursor.fetchall()}
        else:
            found = {}
            for table in tables:
                cursor.execute(f"SELECT COUNT(*) FROM {connection.ops.quote_name(table)}")
                found[table] = TableSize(int(cursor.fetchone()[0]), None)
    return {table: found.get(table, TableSize(None, None)) for table in tables}


def _int(value: Any) -> int | None:
    return None if value is None else int(value)
