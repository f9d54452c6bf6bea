"""The test database as a shop's is before ``manage.py migrate``: some of the app's migrations
not applied yet. Real DDL on the test database, undone (migrated forward) whatever the test did."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.core.management import call_command

APP = "order_timeout"


def migrate(*args: str) -> None:
    """``manage.py migrate`` in this process, quietly."""
    call_command("migrate", *args, interactive=False, verbosity=0)


@contextmanager
def app_migrated_to(target: str) -> Iterator[None]:
    """The app's migrations after ``target`` unapplied for the block (with any of another app
    that depend on them); every migration applied again at its end, as the next test expects."""
    migrate(APP, target)
    try:
        yield
    finally:
        migrate()
