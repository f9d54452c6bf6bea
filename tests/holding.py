"""Holding a close, or a row, in another thread while a test does something else."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from django.db import connection, transaction


@dataclass(eq=False)
class HeldReceiver:
    """An ``order_expired`` receiver that holds its close inside the transaction until released."""

    inside: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)

    def __call__(self, sender: Any, order: Any, **kwargs: Any) -> None:
        from .conftest import time_left

        self.inside.set()
        self.release.wait(time_left())


@contextmanager
def row_locked_elsewhere(model: Any, pk: Any) -> Iterator[None]:
    """Another connection holds ``pk``'s row lock (a payment in flight, a long transaction)."""
    from .conftest import finish, time_left, wait_for

    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic():
                model.objects.select_for_update().get(pk=pk)
                locked.set()
                release.wait(time_left())
        finally:
            connection.close()

    holder = threading.Thread(target=hold, name="a transaction holding the row")
    holder.start()
    try:
        wait_for(lambda: locked.is_set() or not holder.is_alive())
        assert locked.is_set(), "the row could not be locked"
        yield
    finally:
        release.set()
        finish(holder)
