"""The database side of a sample: every app table's rows and bytes, and the server's connections.

Rows are exact (``COUNT(*)``). Bytes are what the database says the table takes, index included:
on MariaDB, ``data_length + index_length`` from ``information_schema.TABLES`` right after ``ANALYZE
TABLE`` (InnoDB's figures are its statistics', refreshed only now and then otherwise): the pages
its B-trees hold, free ones within them included, not the file's size; on PostgreSQL,
``pg_total_relation_size``: the table's files on disk (heap, indexes, TOAST, free space map),
dead rows not yet vacuumed included.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.apps import apps
from django.db import connection
from django.db.models import Model

from order_timeout import get_order_model
from order_timeout.models import DeadLetter

from .plan import OPEN_LETTERS


@dataclass(frozen=True)
class TableFigure:
    rows: int
    bytes: int


def app_models() -> list[type[Model]]:
    """The app's models that have a table (``TimeoutOverview`` has none), its order model among
    them when it is the app's own ``Order``."""
    return [model for model in apps.get_app_config("order_timeout").get_models()
            if model._meta.managed and not model._meta.proxy]


def orders_table() -> str:
    """The order model's table: the shop's orders, which grow with the shop by design."""
    return get_order_model()._meta.db_table


def table_figures() -> dict[str, TableFigure]:
    """Rows and bytes of every app table, and the open dead letters (rows only)."""
    models = app_models()
    tables = [model._meta.db_table for model in models]
    sizes = _bytes(tables)
    figures = {model._meta.db_table: TableFigure(model._base_manager.count(), sizes.get(model._meta.db_table, 0))
               for model in models}
    figures[OPEN_LETTERS] = TableFigure(DeadLetter.objects.filter(resolved_at__isnull=True).count(), 0)
    return figures


def _bytes(tables: list[str]) -> dict[str, int]:
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_class c "
                           "JOIN pg_namespace n ON n.oid = c.relnamespace "
                           "WHERE n.nspname = current_schema() AND c.relkind = 'r' AND c.relname = ANY(%s)",
                           [tables])
            return {name: int(size) for name, size in cursor.fetchall()}
        cursor.execute("ANALYZE TABLE " + ", ".join(connection.ops.quote_name(table) for table in tables))
        cursor.fetchall()
        placeholders = ", ".join(["%s"] * len(tables))
        cursor.execute("SELECT table_name, data_length + index_length FROM information_schema.TABLES "
                       f"WHERE table_schema = DATABASE() AND table_name IN ({placeholders})", tables)
        return {name: int(size or 0) for name, size in cursor.fetchall()}


def connections() -> int:
    """Client connections the database server holds now (every client: the server is the soak's)."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT COUNT(*) FROM pg_stat_activity WHERE backend_type = 'client backend'")
            return int(cursor.fetchone()[0])
        cursor.execute("SHOW GLOBAL STATUS LIKE 'Threads_connected'")
        return int(cursor.fetchone()[1])
