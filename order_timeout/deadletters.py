"""Dead letters: record the orders whose close kept failing, and resolve them.

``requeue`` and ``close_now`` are what the admin's actions call; ``close_now``
goes through ``closing.close_expired``, the consumer's own close path, so the
row lock, the status check and ``order_expired`` all still apply. Both work in
chunks of ``STAFF_CHUNK`` letters, a transaction each.
"""

from __future__ import annotations

import traceback
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.apps import apps
from django.db import router, transaction

from .closing import close_expired
from .codec import deadline_score, order_member
from .conf import settings
from .dbsession import limited_session
from .exceptions import QueueUnavailable
from .models import DeadLetter, TimeoutOrderMixin
from .queue import TimeoutQueue


@dataclass(frozen=True)
class Failure:
    """One order whose last retry failed."""

    pk: Any
    attempts: int
    first_failure_ms: int
    error: BaseException


def _db() -> str:
    return router.db_for_write(DeadLetter)


def _from_ms(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def _describe(error: BaseException) -> tuple[str, str]:
    """The error's type and what a dead letter keeps of it: ``"Type: message"``.

    Anyone who may view dead letters reads ``last_error``, and a traceback
    shows code paths and values; it is kept only with
    ``DEAD_LETTER_TRACEBACKS`` (the consumer's log line always has it).
    """
    kind = type(error)
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    if settings.DEAD_LETTER_TRACEBACKS:
        return name[:255], "".join(traceback.format_exception(error)).strip()
    try:
        message = str(error)
    except Exception:  # a broken __str__ must not keep the order from its dead letter
        message = "<exception str() failed>"
    return name[:255], f"{name}: {message}" if message else name


@dataclass
class Burial:
    """What ``record`` did with each failure's order."""

    buried: list[Any] = field(default_factory=list)
    # Paid or closed by the time its letter would be written: nobody needs to look at it.
    settled: list[Any] = field(default_factory=list)
    # No such row any more.
    missing: list[Any] = field(default_factory=list)


def record(model: type[TimeoutOrderMixin], failures: Sequence[Failure], now: datetime) -> Burial:
    """Write (or update) one open dead letter per failed order still unpaid.

    The orders are locked and read first: two consumers burying the same order
    (a lease that ran out mid-batch) then write one letter, not two, and an
    order paid (or closed) after its last try failed gets none.
    """
    label = model._meta.label
    using = router.db_for_write(model)
    burial = Burial()
    with transaction.atomic(using=using), transaction.atomic(using=_db()):
        statuses = dict(model._base_manager.db_manager(using).select_for_update()
                        .filter(pk__in=[failure.pk for failure in failures])
                        .values_list("pk", model.TIMEOUT_STATUS_FIELD))
        for failure in failures:
            pk = model._meta.pk.to_python(failure.pk)
            if pk not in statuses:
                burial.missing.append(failure.pk)
                continue
            if statuses[pk] not in model.TIMEOUT_UNPAID_STATUSES:
                burial.settled.append(failure.pk)
                continue
            burial.buried.append(failure.pk)
            error_type, last_error = _describe(failure.error)
            values = {"attempts": failure.attempts, "error_type": error_type,
                      "last_error": last_error, "last_failed_at": now}
            updated = DeadLetter.objects.filter(
                order_model=label, order_id=str(failure.pk), resolved_at__isnull=True
            ).update(**values)
            if not updated:
                DeadLetter.objects.create(order_model=label, order_id=str(failure.pk),
                                          first_failed_at=_from_ms(failure.first_failure_ms), **values)
    return burial


# Dead letters one staff action locks and resolves per transaction: "select all" over
# thousands must not hold every row locked in one transaction of a web request.
STAFF_CHUNK = 100


def _open_by_model(
    letters: Iterable[DeadLetter],
) -> Iterator[tuple[type[TimeoutOrderMixin], list[DeadLetter]]]:
    """The open letters, by order model, in chunks of at most ``STAFF_CHUNK``."""
    grouped: dict[type[TimeoutOrderMixin], list[DeadLetter]] = defaultdict(list)
    for letter in letters:
        if not letter.is_resolved:
            grouped[apps.get_model(letter.order_model)].append(letter)
    for model, group in grouped.items():
        for start in range(0, len(group), STAFF_CHUNK):
            yield model, group[start:start + STAFF_CHUNK]


def _resolve(letter: DeadLetter, resolution: str, user: Any, now: datetime) -> bool:
    """Resolve an open letter; False if someone resolved it first (two staff, one click each)."""
    resolved = DeadLetter.objects.filter(pk=letter.pk, resolved_at__isnull=True).update(
        resolution=resolution, resolved_by=user, resolved_at=now)
    if resolved:
        letter.resolution, letter.resolved_by, letter.resolved_at = resolution, user, now
    return bool(resolved)


def resolve_settled(model: type[TimeoutOrderMixin], closed: Sequence[Any],
                    settled: Sequence[Any], now: datetime) -> None:
    """Resolve the open letters of orders closed or settled outside the admin (by the scan)."""
    for pks, resolution in ((closed, DeadLetter.Resolution.CLOSED),
                            (settled, DeadLetter.Resolution.SETTLED)):
        if pks:
            DeadLetter.objects.filter(
                order_model=model._meta.label, order_id__in=[str(pk) for pk in pks],
                resolved_at__isnull=True,
            ).update(resolution=resolution, resolved_at=now)


def requeue(letters: Iterable[DeadLetter], user: Any, now: datetime,
            queue: TimeoutQueue | None = None) -> Counter[str]:
    """Put the orders back on the queue at their deadlines (due now, if past).

    Orders no longer unpaid are only marked settled. Redis is written before
    the commit, so if it is down the dead letters stay open and the error
    reaches the caller.
    """
    queue = queue or TimeoutQueue.from_settings()
    counts: Counter[str] = Counter()
    for model, group in _open_by_model(letters):
        using = router.db_for_write(model)
        with transaction.atomic(using=using), transaction.atomic(using=_db()):
            # Locked, so a payment racing the requeue waits, and then the
            # consumer's own check sees it paid.
            rows = model._base_manager.db_manager(using).select_for_update().in_bulk(
                [letter.order_id for letter in group])
            deadlines: dict[str, int] = {}
            for letter in group:
                order = rows.get(model._meta.pk.to_python(letter.order_id))
                if order is None:
                    counts["missing"] += 1
                elif not order.awaits_payment:
                    if _resolve(letter, DeadLetter.Resolution.SETTLED, user, now):
                        counts["settled"] += 1
                elif _resolve(letter, DeadLetter.Resolution.REQUEUED, user, now):
                    assert order.expires_at is not None  # awaits_payment
                    deadlines[order_member(model, order.pk)] = deadline_score(order.expires_at)
                    counts["requeued"] += 1
            queue.schedule(deadlines)
    return counts


def close_now(letters: Iterable[DeadLetter], user: Any, now: datetime,
              queue: TimeoutQueue | None = None) -> Counter[str]:
    """Run the consumer's close path on these orders once more, now."""
    counts: Counter[str] = Counter()
    for model, group in _open_by_model(letters):
        by_pk = {model._meta.pk.to_python(letter.order_id): letter for letter in group}
        # Bounded like a consumer's close: a hung receiver cannot keep the rows locked.
        with limited_session(router.db_for_write(model), settings.LEASE_SECONDS):
            outcome = close_expired(model, list(by_pk))
        with transaction.atomic(using=_db()):
            for pk in outcome.closed:
                # Unconditional in effect: the close happened, whoever resolved the letter.
                _resolve(by_pk[pk], DeadLetter.Resolution.CLOSED, user, now)
            for pk in outcome.settled:
                _resolve(by_pk[pk], DeadLetter.Resolution.SETTLED, user, now)
            for pk, error in outcome.failed.items():
                letter = by_pk[pk]
                letter.error_type, letter.last_error = _describe(error)
                letter.attempts += 1
                letter.last_failed_at = now
                letter.save(update_fields=["error_type", "last_error", "attempts", "last_failed_at"])
        counts.update(closed=len(outcome.closed), settled=len(outcome.settled),
                      failed=len(outcome.failed), missing=len(outcome.missing),
                      busy=len(outcome.busy))
        if outcome.not_due:
            # The deadline was extended meanwhile: it is not ours to close yet.
            try:
                counts.update(requeue([by_pk[pk] for pk in outcome.not_due], user, now, queue))
            except QueueUnavailable:
                # The closes above committed; these stay open dead letters for another try.
                counts.update(unrequeued=len(outcome.not_due))
    return counts
