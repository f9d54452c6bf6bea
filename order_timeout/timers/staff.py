"""What staff do with dead letters: requeue them, or act on their rows now; for every kind.

``requeue`` and ``close_now`` are what the admin's actions call. A dead
letter names its kind (``DeadLetter.timer``: "" for the order close), and
``close_now`` goes through ``acting.act_on``, the consumer's own path, so the
row lock, the re-check and the kind's receivers all still apply. Both work in
chunks of ``STAFF_CHUNK`` letters, a transaction each.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from typing import Any

from django.db import transaction

from ..conf import settings
from ..db.locks import LockedOrders
from ..db.session import limited_session
from ..exceptions import QueueUnavailable
from ..models import DeadLetter
from ..queue import TimeoutQueue
from .acting import act_on
from .giving_up import describe, letters_database
from .kind import Kind
from .members import deadline_score
from .registry import registry

# Dead letters one staff action locks and resolves per transaction: "select all" over
# thousands must not hold every row locked in one transaction of a web request.
STAFF_CHUNK = 100


def _open_by_kind(letters: Iterable[DeadLetter]) -> Iterator[tuple[Kind, list[DeadLetter]]]:
    """The open letters, by kind, in chunks of at most ``STAFF_CHUNK``."""
    grouped: dict[tuple[str, str], list[DeadLetter]] = defaultdict(list)
    for letter in letters:
        if not letter.is_resolved:
            grouped[(letter.timer, letter.order_model)].append(letter)
    for (name, label), group in grouped.items():
        kind = registry.get(name)
        if kind.model._meta.label != label:
            # The order close of a model that is no longer ORDER_MODEL: that model's own close.
            from django.apps import apps

            from .closes import OrderTimeout

            kind = OrderTimeout(apps.get_model(label))
        for start in range(0, len(group), STAFF_CHUNK):
            yield kind, group[start:start + STAFF_CHUNK]


def _resolve(letter: DeadLetter, resolution: str, user: Any, now: datetime) -> bool:
    """Resolve an open letter; False if someone resolved it first (two staff, one click each)."""
    resolved = DeadLetter.objects.filter(pk=letter.pk, resolved_at__isnull=True).update(
        resolution=resolution, resolved_by=user, resolved_at=now)
    if resolved:
        letter.resolution, letter.resolved_by, letter.resolved_at = resolution, user, now
    return bool(resolved)


def resolve_settled(kind: Kind, acted: Sequence[Any], settled: Sequence[Any], now: datetime) -> None:
    """Resolve the open letters of rows acted on or settled outside the admin (by the scan)."""
    for pks, resolution in ((acted, DeadLetter.Resolution.CLOSED), (settled, DeadLetter.Resolution.SETTLED)):
        if pks:
            DeadLetter.objects.filter(
                order_model=kind.model._meta.label, timer=kind.name, order_id__in=[str(pk) for pk in pks],
                resolved_at__isnull=True,
            ).update(resolution=resolution, resolved_at=now)


def _key(kind: Kind, letter: DeadLetter) -> Any:
    return kind.model._meta.pk.to_python(letter.order_id)


def requeue(letters: Iterable[DeadLetter], user: Any, now: datetime,
            queue: TimeoutQueue | None = None) -> Counter[str]:
    """Put the rows back on their kind's queue at their deadlines (due now, if past).

    Rows no longer pending are only marked settled. Redis is written before
    the commit, so if it is down the dead letters stay open and the error
    reaches the caller.
    """
    queue = queue or TimeoutQueue.from_settings()
    counts: Counter[str] = Counter()
    for kind, group in _open_by_kind(letters):
        using = kind.using
        manager = kind.model._base_manager.db_manager(using)
        with transaction.atomic(using=using), transaction.atomic(using=letters_database()):
            # Locked, so a payment racing the requeue waits, and then the
            # consumer's own check sees it settled.
            keys = {_key(kind, letter): letter for letter in group}
            rows = manager.select_for_update().in_bulk(list(keys))
            pending = set(manager.filter(kind.pending, pk__in=list(rows)).values_list("pk", flat=True))
            deadlines = kind.deadlines.read(manager, LockedOrders(rows=rows))
            scores: dict[str, int] = {}
            for key, letter in keys.items():
                if key not in rows:
                    counts["missing"] += 1
                elif key not in pending or (deadline := deadlines.get(key)) is None:
                    if _resolve(letter, DeadLetter.Resolution.SETTLED, user, now):
                        counts["settled"] += 1
                elif _resolve(letter, DeadLetter.Resolution.REQUEUED, user, now):
                    scores[kind.member(key)] = deadline_score(deadline)
                    counts["requeued"] += 1
            queue.of_kind(kind.key_space).schedule(scores)
    return counts


def drop(letters: Iterable[DeadLetter], user: Any, now: datetime) -> Counter[str]:
    """Deliver these notices no more: each still pending is dropped, its letter resolved so.

    Only a notice can be dropped: what the outside world no longer needs to hear. A dead letter
    of an order, or of a timer's row, is left open (counted ``not_droppable``): its row must
    still be closed or acted on, by a requeue or a close now.
    """
    from ..models import Notice

    counts: Counter[str] = Counter()
    for kind, group in _open_by_kind(letters):
        if kind.model is not Notice:
            counts["not_droppable"] += len(group)
            continue
        using = kind.using
        with transaction.atomic(using=using), transaction.atomic(using=letters_database()):
            keys = {_key(kind, letter): letter for letter in group}
            dropped = set(Notice.objects.using(using).select_for_update().filter(
                pk__in=list(keys), state=Notice.State.PENDING).values_list("pk", flat=True))
            Notice.objects.using(using).filter(pk__in=dropped).update(state=Notice.State.DROPPED)
            for key, letter in keys.items():
                resolution = DeadLetter.Resolution.DROPPED if key in dropped else DeadLetter.Resolution.SETTLED
                if _resolve(letter, resolution, user, now):
                    counts["dropped" if key in dropped else "settled"] += 1
        queue = TimeoutQueue.from_settings().of_kind(kind.key_space)
        try:
            queue.unschedule([kind.member(key) for key in keys])
        except QueueUnavailable:
            pass  # no member left behind matters: a consumer finds a dropped notice settled
    return counts


def close_now(letters: Iterable[DeadLetter], user: Any, now: datetime,
              queue: TimeoutQueue | None = None) -> Counter[str]:
    """Run the consumer's act on these rows once more, now."""
    counts: Counter[str] = Counter()
    for kind, group in _open_by_kind(letters):
        by_key = {_key(kind, letter): letter for letter in group}
        # Bounded like a consumer's act: a hung receiver cannot keep the rows locked.
        with limited_session(kind.using, settings.batch_time_limit()):
            outcome = act_on(kind, list(by_key))
        with transaction.atomic(using=letters_database()):
            for key in outcome.acted:
                # Unconditional in effect: the act happened, whoever resolved the letter.
                _resolve(by_key[key], DeadLetter.Resolution.CLOSED, user, now)
            for key in outcome.settled:
                _resolve(by_key[key], DeadLetter.Resolution.SETTLED, user, now)
            for key, error in outcome.failed.items():
                letter = by_key[key]
                letter.error_type, letter.last_error = describe(error)
                letter.attempts += 1
                letter.last_failed_at = now
                letter.save(update_fields=["error_type", "last_error", "attempts", "last_failed_at"])
        counts.update(closed=len(outcome.acted), settled=len(outcome.settled), failed=len(outcome.failed),
                      missing=len(outcome.missing), busy=len(outcome.busy))
        later = [*outcome.not_due, *outcome.kept]
        if later:
            # The deadline was extended meanwhile, or the settled condition settles the row: it is
            # not ours to act on now; back on the queue, where the consumers look again.
            try:
                counts.update(requeue([by_key[key] for key in later], user, now, queue))
            except QueueUnavailable:
                # The acts above committed; these stay open dead letters for another try.
                counts.update(unrequeued=len(later))
    return counts
