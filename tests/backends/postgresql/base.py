"""PostgreSQL for the pytest process: a test's flush deletes rows rather than truncating tables."""

from __future__ import annotations

from typing import Any

from django.db.backends.postgresql import base

from tests.backends import flushed


class DatabaseOperations(base.DatabaseOperations):
    def sql_flush(self, style: Any, tables: list[str], *, reset_sequences: bool = False,
                  allow_cascade: bool = False) -> list[str]:
        if reset_sequences or allow_cascade:
            return super().sql_flush(style, flushed(tables), reset_sequences=reset_sequences,
                                     allow_cascade=allow_cascade)
        # Django's foreign keys are DEFERRABLE INITIALLY DEFERRED: checked at the flush's commit,
        # when every referencing row is gone too, whatever the order.
        return ["SET CONSTRAINTS ALL DEFERRED;",
                *(f"{style.SQL_KEYWORD('DELETE FROM')} {style.SQL_FIELD(self.quote_name(table))};"
                  for table in flushed(tables))]


class DatabaseWrapper(base.DatabaseWrapper):
    ops_class = DatabaseOperations
