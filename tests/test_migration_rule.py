"""Expand now, contract a release later: the previous release keeps working on the new schema.

In a rolling upgrade (docs/upgrading.md) ``migrate`` runs while the previous release's consumers,
scan and web processes still write, and they keep writing beside today's for a while. So every
migration of the app after the previous release's last one (``releases.toml``) may only expand
what that release uses: a column it does not know is NOT NULL only with a database default (its
INSERTs leave it out) or on a new table, and nothing it reads or writes is removed or renamed
until the release after. Read from the migrations themselves (Django's ``MigrationLoader``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.db.migrations import operations as ops
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.state import ProjectState
from django.db.models import NOT_PROVIDED
from django.utils import timezone

from order_timeout.models import DeadLetter

from .releases import previous_release

APP = "order_timeout"
# Operations that take away what the previous release reads or writes.
CONTRACTIONS = (ops.RemoveField, ops.RenameField, ops.DeleteModel, ops.RenameModel, ops.AlterModelTable)


def since_the_previous_release(loader: MigrationLoader) -> Iterator[tuple[str, Any, ProjectState]]:
    """Each operation of the app's migrations after the previous release's last one, in the order
    ``migrate`` applies them, with its migration's name and the state just before it."""
    released = set(previous_release().migrations(APP))
    (leaf,) = loader.graph.leaf_nodes(APP)
    for app, name in loader.graph.forwards_plan(leaf):
        if app != APP or name in released:
            continue
        state = loader.project_state((app, name), at_end=False)
        for operation in loader.graph.nodes[(app, name)].operations:
            yield name, operation, state
            operation.state_forwards(APP, state)


def not_null_without_default(field: Any) -> bool:
    return not field.many_to_many and not field.null and field.db_default is NOT_PROVIDED


def breaches() -> list[tuple[str, str, str, str]]:
    """(migration, model, field, what it does) for each operation that breaks the rule."""
    loader = MigrationLoader(None, ignore_no_migrations=True)
    created: set[str] = set()
    found = []
    for migration, operation, state in since_the_previous_release(loader):
        if isinstance(operation, ops.CreateModel):
            created.add(operation.name_lower)
            continue
        model = getattr(operation, "model_name_lower", None) or getattr(operation, "name_lower", "")
        if model in created:
            continue  # a table the previous release does not know: anything goes
        field = getattr(operation, "name", "")
        if isinstance(operation, ops.AddField) and not_null_without_default(operation.field):
            found.append((migration, model, field, "adds a NOT NULL column with no database default"))
        elif isinstance(operation, ops.AlterField) and not_null_without_default(operation.field) and not (
                not_null_without_default(state.models[APP, model].fields[field])):
            found.append((migration, model, field, "makes a column NOT NULL with no database default"))
        elif isinstance(operation, CONTRACTIONS):
            found.append((migration, model, field, f"{type(operation).__name__}: takes away what it uses"))
    return found


def test_every_migration_since_the_previous_release_leaves_its_writes_working():
    assert breaches() == []


@pytest.mark.django_db
def test_a_dead_letter_written_as_the_previous_release_writes_it_is_stored():
    """Its INSERT names only the columns it knows: today's ``timer`` takes its database default."""
    loader = MigrationLoader(None, ignore_no_migrations=True)
    released = loader.project_state((APP, previous_release().last_migration(APP))).apps
    now = timezone.now()
    written = released.get_model(APP, "DeadLetter").objects.create(
        order_model="order_timeout.Order", order_id="7", attempts=4, error_type="builtins.RuntimeError",
        last_error="RuntimeError: the stock service refused", first_failed_at=now, last_failed_at=now)

    assert DeadLetter.objects.get(pk=written.pk).timer == ""
