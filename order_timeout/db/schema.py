"""Which of the app's migrations a database has not applied yet.

In a rolling upgrade a new consumer may start before ``manage.py migrate`` has run: it asks this
first and waits for the answer to be empty, rather than failing on a missing table each loop.
"""

from __future__ import annotations

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.migrations.loader import MigrationLoader

APP_LABEL = "order_timeout"


def unapplied_migrations(using: str = DEFAULT_DB_ALIAS, app_label: str = APP_LABEL) -> list[str]:
    """The names of ``app_label``'s migrations not applied to ``using``, in the order ``migrate``
    applies them; empty when the database is up to date.

    Read as ``migrate`` reads them (the files on disk, squashes resolved, and the
    ``django_migrations`` table): a few milliseconds once the files are imported. Raises the
    database's error when it cannot be asked.
    """
    loader = MigrationLoader(connections[using], ignore_no_migrations=True)
    wanted = [node for leaf in loader.graph.leaf_nodes(app_label) for node in loader.graph.forwards_plan(leaf)]
    return [name for app, name in dict.fromkeys(wanted)
            if app == app_label and (app, name) not in loader.applied_migrations]


def named(migrations: list[str], app_label: str = APP_LABEL) -> str:
    """``order_timeout.0007_queue_epoch, order_timeout.0008_...``: for a log line."""
    return ", ".join(f"{app_label}.{name}" for name in migrations)
