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
        self.inside.set()
        self.release.wait(60)


@contextmanager
def row_locked_elsewhere(model: Any, pk: Any) -> Iterator[None]:
    """Another connection holds ``pk``'s row lock (a payment in flight, a long transaction)."""
    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic():
                model.objects.select_for_update().get(pk=pk)
                locked.set()
                release.wait(20)
        finally:
            connection.close()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert locked.wait(10)
        yield
    finally:
        release.set()
        holder.join(10)
