"""MySQL and MariaDB for the pytest process: a test's flush keeps the content types and
permissions (Django's already deletes rows rather than truncating)."""

from __future__ import annotations

from typing import Any

from django.db.backends.mysql import base

from tests.backends import flushed


class DatabaseOperations(base.DatabaseOperations):
    def sql_flush(self, style: Any, tables: list[str], *, reset_sequences: bool = False,
                  allow_cascade: bool = False) -> list[str]:
        return super().sql_flush(style, flushed(tables), reset_sequences=reset_sequences,
                                 allow_cascade=allow_cascade)


class DatabaseWrapper(base.DatabaseWrapper):
    ops_class = DatabaseOperations
