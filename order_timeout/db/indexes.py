"""A migration operation that adds an index without blocking writes to its table.

A shop migrates while the previous release's consumers and its own web processes write
(docs/upgrading.md). PostgreSQL's plain ``CREATE INDEX`` blocks every INSERT, UPDATE and
DELETE on the table until it is built, which on a table of a year's rows is minutes:
``CONCURRENTLY`` does not (and cannot run in a transaction, so a migration using this is
``atomic = False``). MariaDB and MySQL build an InnoDB index online by default.
"""

from __future__ import annotations

from typing import Any

from django.db.migrations.operations import AddIndex


class AddIndexOnline(AddIndex):
    """``AddIndex``, concurrently on PostgreSQL; as ``AddIndex`` elsewhere."""

    def database_forwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        model = to_state.apps.get_model(app_label, self.model_name)
        if not self.allow_migrate_model(schema_editor.connection.alias, model):
            return
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.add_index(model, self.index, concurrently=True)
        else:
            schema_editor.add_index(model, self.index)

    def database_backwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        model = from_state.apps.get_model(app_label, self.model_name)
        if not self.allow_migrate_model(schema_editor.connection.alias, model):
            return
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.remove_index(model, self.index, concurrently=True)
        else:
            schema_editor.remove_index(model, self.index)

    def describe(self) -> str:
        return f"{super().describe()} (without blocking writes)"


