"""Giving up on a key whose act kept failing: a dead letter for staff, written under the row's lock.

The lifecycle's one give-up, for every kind that keeps dead letters (the
order close and the timers a shop declares; the reminders record theirs as
failed instead). Written only while the row is still pending: a row settled
meanwhile (paid, or acted on by a holder that overran its lease) needs
nobody, and two consumers burying the same key write one letter.
"""

from __future__ import annotations

import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from django.db import router, transaction

from ..conf import settings
from ..models import DeadLetter
from .members import datetime_of_score
from .outcome import Key
from .owning import OwnsRows


class Buries(OwnsRows, Protocol):
    """What writing a kind's dead letters needs of it: whose rows, which are still pending."""

    @property
    def pending(self) -> Any: ...

    def row_of(self, key: Key) -> Any: ...


@dataclass(frozen=True)
class Failure:
    """One key whose last try failed (or whose consumers kept dying with it)."""

    key: Key
    attempts: int
    first_failure_ms: int
    error: BaseException


@dataclass
class Burial:
    """What ``bury`` did with each failure's key."""

    buried: list[Key] = field(default_factory=list)
    # Settled by the time its letter would be written: nobody needs to look at it.
    settled: list[Key] = field(default_factory=list)
    # No such row any more.
    missing: list[Key] = field(default_factory=list)


def letters_database() -> str:
    return router.db_for_write(DeadLetter)




def describe(error: BaseException) -> tuple[str, str]:
    """The error's type and what a dead letter keeps of it: ``"Type: message"``.

    Staff who act on dead letters read ``last_error``, and a traceback shows
    code paths and values; it is kept only with ``DEAD_LETTER_TRACEBACKS``
    (the consumer's log line always has it).
    """
    kind = type(error)
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    if settings.DEAD_LETTER_TRACEBACKS:
        return name[:255], "".join(traceback.format_exception(error)).strip()
    try:
        message = str(error)
    except Exception:  # a broken __str__ must not keep the key from its dead letter
        message = "<exception str() failed>"
    return name[:255], f"{name}: {message}" if message else name


def bury(kind: Buries, failures: Sequence[Failure], now: datetime) -> Burial:
    """Write (or update) one open dead letter per failed key whose row is still pending."""
    model = kind.model
    label = model._meta.label
    using = kind.using
    burial = Burial()
    manager = model._base_manager.db_manager(using)
    pk_of = {failure.key: model._meta.pk.to_python(kind.row_of(failure.key)) for failure in failures}
    with transaction.atomic(using=using), transaction.atomic(using=letters_database()):
        # Locked (waiting for a holder, not skipping it): the answer must be the row's latest.
        existing = set(manager.select_for_update().filter(pk__in=list(pk_of.values()))
                       .values_list("pk", flat=True))
        pending = set(manager.filter(kind.pending, pk__in=existing).values_list("pk", flat=True))
        for failure in failures:
            pk = pk_of[failure.key]
            if pk not in existing:
                burial.missing.append(failure.key)
                continue
            if pk not in pending:
                burial.settled.append(failure.key)
                continue
            burial.buried.append(failure.key)
            error_type, last_error = describe(failure.error)
            values = {"attempts": failure.attempts, "error_type": error_type,
                      "last_error": last_error, "last_failed_at": now}
            updated = DeadLetter.objects.filter(
                order_model=label, order_id=str(pk), timer=kind.name, resolved_at__isnull=True,
            ).update(**values)
            if not updated:
                DeadLetter.objects.create(order_model=label, order_id=str(pk), timer=kind.name,
                                          first_failed_at=datetime_of_score(failure.first_failure_ms), **values)
    return burial
