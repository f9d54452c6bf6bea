"""Orders in, and payments: how the harness plays the shop.

Orders are created as the app expects: ``bulk_create`` then
``order_timeout.schedule()`` in the same transaction (the mass path), or
``objects.create()`` one at a time (the per-save path, whose ZADD a hung
Redis must not hold up). Each order gets a ``Role`` in the same
transaction, so its receiver knows how to behave before it can be claimed,
and, where a scenario asks, a payment in flight (the test shop's payment of
that order model, ``pending``), committed with it as docs/payments.md asks.

Payments come through ``mark_paid()`` (``pay_at``), or as the gateway's
webhook settles a payment in flight (``settle_at``): the payment's new state
and, when it succeeded, ``mark_paid()`` in one transaction.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.core.exceptions import FieldDoesNotExist, ImproperlyConfigured
from django.db import OperationalError, connection, transaction
from django.db.models import Model
from django.utils import timezone

import order_timeout
from order_timeout import get_order_model
from order_timeout.db.errors import is_lock_conflict
from order_timeout.exceptions import OrderClosed
from testproject.shop.models import PaymentState

from .models import DatabaseUtcNow, Payment, Role, Settlement

CHUNK = 2000


@dataclass(frozen=True)
class Created:
    ids: list[int]
    first_deadline: datetime
    last_deadline: datetime


def deadlines(count: int, lead: float, spread: float) -> list[datetime]:
    """``count`` deadlines spread evenly over ``spread`` seconds from ``lead`` seconds on, shuffled.

    Shuffled, so the order of the rows is not the order of the deadlines.
    """
    start = timezone.now() + timedelta(seconds=lead)
    step = spread / max(1, count)
    spread_out = [start + timedelta(seconds=i * step) for i in range(count)]
    random.shuffle(spread_out)
    return spread_out


def at_random(count: int, misbehaving: Mapping[str, int]) -> dict[int, str]:
    """Which of ``count`` orders misbehave, and how: ``misbehaving[kind]`` of each, at random."""
    chosen = random.sample(range(count), sum(misbehaving.values()))
    behaviours: dict[int, str] = {}
    for kind, how_many in misbehaving.items():
        behaviours.update(dict.fromkeys(chosen[:how_many], kind))
        chosen = chosen[how_many:]
    return behaviours


def spaced(due: Sequence[datetime], kinds: Sequence[str], every: float) -> dict[int, str]:
    """One order per kind in turn, their deadlines ``every`` seconds apart, from the first deadline.

    So the faults they cause do not pile up on the same moment.
    """
    by_deadline = sorted(range(len(due)), key=lambda index: due[index])
    first = due[by_deadline[0]]
    behaviours: dict[int, str] = {}
    position = 0
    for turn, kind in enumerate(kinds):
        moment = first + timedelta(seconds=0.5 + turn * every)
        while position < len(by_deadline) - 1 and due[by_deadline[position]] < moment:
            position += 1
        behaviours[by_deadline[position]] = kind
    return behaviours


def payment_model() -> type[Model]:
    """The test shop's payment of the order model: its ``payments`` (``OrderPayment``, ``Payment``)."""
    model = get_order_model()
    try:
        related = model._meta.get_field("payments").related_model
    except FieldDoesNotExist as exc:
        raise ImproperlyConfigured(f"{model._meta.label} has no payments: the payment scenarios need "
                                   f"order_timeout.Order or shop.ShopOrder") from exc
    assert isinstance(related, type)
    return related


def create_orders(due: Sequence[datetime], cohort: str, behaviours: dict[int, str] | None = None,
                  in_flight: dict[int, str] | None = None) -> Created:
    """Bulk-create orders due at ``due``; ``behaviours`` maps an index in ``due`` to a behaviour.

    A misbehaving order's cohort is named after its behaviour; its role
    commits with it, before its member reaches Redis. ``in_flight`` maps an
    index to a cohort: that order gets a pending payment in the same transaction.
    """
    model = get_order_model()
    behaviour_at = behaviours or {}
    paying = in_flight or {}
    payments = payment_model() if paying else None
    ids: list[int] = []
    for start in range(0, len(due), CHUNK):
        with transaction.atomic():
            orders = model.objects.bulk_create(
                [model(expires_at=deadline) for deadline in due[start:start + CHUNK]])
            Role.objects.bulk_create([
                Role(order_id=order.pk, cohort=paying.get(start + i, behaviour_at.get(start + i, cohort)),
                     behaviour=behaviour_at.get(start + i, ""))
                for i, order in enumerate(orders)])
            if payments is not None:
                payments._default_manager.bulk_create([
                    payments(order_id=order.pk, state=PaymentState.PENDING)
                    for i, order in enumerate(orders) if start + i in paying])
            order_timeout.schedule(orders)
        ids += [order.pk for order in orders]
    return Created(ids, min(due), max(due))


def create_one(deadline: datetime, cohort: str) -> int:
    """One order through ``objects.create()``: post_save schedules it after the commit."""
    with transaction.atomic():
        order = get_order_model().objects.create(expires_at=deadline)
        Role.objects.create(order_id=order.pk, cohort=cohort)
    return int(order.pk)


def assign(ids: Sequence[int], cohort: str) -> None:
    """Count these orders in another cohort (decided once the scenario knows what befell them)."""
    for start in range(0, len(ids), CHUNK):
        Role.objects.filter(order_id__in=ids[start:start + CHUNK]).update(cohort=cohort)


def pay(order: Any) -> str:
    """Pay as a payment callback does, and say what ``mark_paid()`` answered."""
    try:
        return Payment.Outcome.PAID if order.mark_paid() else Payment.Outcome.SETTLED
    except OrderClosed:
        return Payment.Outcome.REFUND


# A settlement that met a lock conflict (a deadlock with a closing transaction) is tried again.
SETTLE_ATTEMPTS = 5


def settle(order: Any, state: str) -> str | None:
    """The gateway's webhook: the order's pending payment takes ``state`` and, when it succeeded,
    the order is paid, in one transaction (docs/payments.md); what ``mark_paid()`` answered.

    The ``Settlement`` row is the transaction's last statement, so its time is
    the database's clock just before the commit. A lock conflict (the closing
    transaction holds the order's row and reads the payment) is tried again.
    """
    payments = payment_model()._default_manager
    for attempt in range(1, SETTLE_ATTEMPTS + 1):
        try:
            with transaction.atomic():
                payments.filter(order_id=order.pk, state=PaymentState.PENDING).update(state=state)
                answer = pay(order) if state == PaymentState.SUCCEEDED else None
                Settlement.objects.create(order_id=order.pk, state=state, settled_at=DatabaseUtcNow())
            return answer
        except OperationalError as exc:
            if not is_lock_conflict(exc) or attempt == SETTLE_ATTEMPTS:
                raise
            order = type(order)._base_manager.get(pk=order.pk)
    return None


def pay_at(plan: dict[int, datetime], threads: int) -> None:
    """Pay each order at its planned moment, from ``threads`` threads; record every answer.

    The orders are loaded first, so each payment is one conditional UPDATE
    at its moment, as close to the deadline as the plan says.
    """
    _at_moments(plan, pay, threads)


def settle_at(plan: dict[int, tuple[datetime, str]], threads: int) -> None:
    """Settle each order's payment in flight at its planned moment (succeeded or failed), from
    ``threads`` threads; record what ``mark_paid()`` answered for each that succeeded."""
    _at_moments({pk: moment for pk, (moment, _state) in plan.items()},
                lambda order: settle(order, plan[order.pk][1]), threads)


def _at_moments(plan: dict[int, datetime], act: Callable[[Any], str | None], threads: int) -> None:
    """``act(order)`` at each order's moment, from ``threads`` threads; each answer recorded.

    An act that raises is the harness's failure, not an answer: the others go
    on, and the first error is raised once every answer is recorded.
    """
    model = get_order_model()
    loaded = model._base_manager.in_bulk(list(plan))
    timeline = sorted(plan.items(), key=lambda item: item[1])
    answers: list[Payment] = []
    errors: list[str] = []
    lock = threading.Lock()

    def payer(share: list[tuple[int, datetime]]) -> None:
        try:
            for pk, moment in share:
                wait = (moment - timezone.now()).total_seconds()
                if wait > 0:
                    time.sleep(wait)
                try:
                    outcome = act(loaded[pk])
                except Exception as exc:
                    with lock:
                        errors.append(f"order {pk}: {type(exc).__name__}: {exc}")
                    continue
                if outcome is not None:
                    with lock:
                        answers.append(Payment(order_id=pk, outcome=outcome, answered_at=timezone.now()))
        finally:
            connection.close()

    workers = [threading.Thread(target=payer, args=(timeline[i::threads],)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    Payment.objects.bulk_create(answers, batch_size=CHUNK)
    if errors:
        raise RuntimeError(f"{len(errors)} payments failed in the harness; the first: {errors[0]}")


@dataclass(frozen=True)
class Save:
    """One ``objects.create()``: when it began, how long it took, and what it raised."""

    pk: int | None
    began: datetime
    seconds: float
    error: str = ""

    @property
    def ended(self) -> datetime:
        return self.began + timedelta(seconds=self.seconds)


class OneByOne:
    """Threads creating orders through ``objects.create()`` at a steady rate, every create timed."""

    def __init__(self, threads: int, per_second: float, lead: float, spread: float,
                 cohort: str) -> None:
        self.pause = threads / per_second
        self.lead, self.spread, self.cohort = lead, spread, cohort
        self.saves: list[Save] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._create, daemon=True) for _ in range(threads)]

    def __enter__(self) -> OneByOne:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()

    def _create(self) -> None:
        try:
            while not self._stop.wait(self.pause * random.uniform(0.5, 1.5)):
                began = timezone.now()
                deadline = began + timedelta(seconds=self.lead + random.uniform(0, self.spread))
                clock = time.perf_counter()
                try:
                    pk: int | None = create_one(deadline, self.cohort)
                    error = ""
                except Exception as exc:  # the invariant is that nothing is raised
                    pk, error = None, f"{type(exc).__name__}: {exc}"
                self.saves.append(Save(pk, began, time.perf_counter() - clock, error))
        finally:
            connection.close()
