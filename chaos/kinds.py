"""The shop's three declared timers, played by the harness: their rows in, and the shop's moves on them.

``chaos.settings`` inherits the test project's apps, ``testproject.shop`` among them, so in
every chaos process the app finds ``testproject/shop/timers.py`` as it does in the test suite
(it imports each installed app's ``timers`` module): the harness runs the declarations the
tests and docs/timers.md prove, and counts their effects in the shop's own tables.

- ``reservation-lapses``: a ``StockReservation`` lapses at its deadline and its stock comes
  back (the shop's ``fire()``: ``StockRecord.num_allocated`` down by its quantity), unless its
  checkout completed; while the checkout is completing it is held. Every record starts with
  ``num_in_stock`` = ``num_allocated`` = what its reservations hold, so what was given back is
  the difference. Half the reservations have a record of their own; the others share a few
  (a best-seller's), whose UPDATEs from concurrent batches contend.
- ``complete-after-delivery``: a delivered ``ShopOrder`` completes at ``completes_at``, unless a
  return was opened; the shop's ``fire()`` writes one ``OrderStatusChange`` per order.
- ``plain-order-payment``: a ``PlainOrder`` is cancelled at its deadline (kept in the app's
  own table, ``set_deadline()``) unless it was paid; once cancelled, a save as paid raises
  ``OrderClosed``.

Each act is witnessed by a trigger in its own transaction (``models.Act``). The shop's moves
lock the row they are about first, as docs/timers.md asks, so a move and the act are
serialised by that lock; each records what came of it (``ShopMove``) as its transaction's last
statement.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection, transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from order_timeout.exceptions import OrderClosed
from order_timeout.timers.registry import registry
from testproject.shop.models import (
    Checkout,
    PlainOrder,
    Return,
    ShopOrder,
    StockRecord,
    StockReservation,
)

from .models import DatabaseUtcNow, ShopMove, TimerRole

RESERVATIONS = "reservation-lapses"
COMPLETIONS = "complete-after-delivery"
PLAIN_PAYMENT = "plain-order-payment"
TIMERS = (RESERVATIONS, COMPLETIONS, PLAIN_PAYMENT)

CHUNK = 500
# Reservations sharing a stock record: the best-sellers.
HOT_RECORDS = 10


@dataclass(frozen=True)
class Rows:
    """One kind's rows, by cohort: ``{cohort: {pk: deadline}}``."""

    timer: str
    cohorts: dict[str, dict[int, datetime]]

    def of(self, cohort: str) -> dict[int, datetime]:
        return self.cohorts.get(cohort, {})


def _deal(deadlines: Sequence[datetime], shares: dict[str, int]) -> list[tuple[str, datetime]]:
    """Each deadline with the cohort it is dealt to: ``shares[cohort]`` of them, the rest to the
    first cohort, at random."""
    names = [name for name, count in shares.items() for _ in range(count)]
    first = next(iter(shares))
    names += [first] * (len(deadlines) - len(names))
    random.shuffle(names)
    return list(zip(names, deadlines, strict=True))


def _roles(timer: str, rows: Sequence[tuple[Any, str, datetime]]) -> Rows:
    TimerRole.objects.bulk_create([TimerRole(timer=timer, object_id=pk, cohort=cohort, deadline=deadline)
                                   for pk, cohort, deadline in rows], batch_size=CHUNK)
    cohorts: dict[str, dict[int, datetime]] = {}
    for pk, cohort, deadline in rows:
        cohorts.setdefault(cohort, {})[int(pk)] = deadline
    return Rows(timer, cohorts)


def create_reservations(deadlines: Sequence[datetime], shares: dict[str, int]) -> Rows:
    """A reservation per deadline, each for an open checkout of its own, scheduled with
    ``timer.schedule()`` in the transaction that made them (``bulk_create`` sends no signal)."""
    timer = registry.get(RESERVATIONS)
    dealt = _deal(deadlines, shares)
    quantities = [random.randint(1, 3) for _ in dealt]
    own = len(dealt) // 2
    made: list[tuple[Any, str, datetime]] = []
    with transaction.atomic():
        records = StockRecord.objects.bulk_create([StockRecord(num_in_stock=quantity, num_allocated=quantity)
                                                   for quantity in quantities[:own]], batch_size=CHUNK)
        hot = StockRecord.objects.bulk_create([StockRecord() for _ in range(HOT_RECORDS)])
        records += [hot[i % HOT_RECORDS] for i in range(len(dealt) - own)]
        for index, record in enumerate(hot):
            allocated = sum(quantities[own + index::HOT_RECORDS])
            StockRecord.objects.filter(pk=record.pk).update(num_in_stock=allocated, num_allocated=allocated)
        for start in range(0, len(dealt), CHUNK):
            part = range(start, min(start + CHUNK, len(dealt)))
            checkouts = Checkout.objects.bulk_create([Checkout() for _ in part])
            reservations = StockReservation.objects.bulk_create([
                StockReservation(stockrecord=records[i], checkout=checkout, quantity=quantities[i],
                                 expires_at=dealt[i][1]) for i, checkout in zip(part, checkouts, strict=True)])
            timer.schedule(reservations)
            made += [(reservation.pk, dealt[i][0], dealt[i][1])
                     for i, reservation in zip(part, reservations, strict=True)]
    return _roles(RESERVATIONS, made)


def create_deliveries(deadlines: Sequence[datetime], shares: dict[str, int]) -> Rows:
    """A delivered ``ShopOrder`` per deadline (its return window's end, ``completes_at``)."""
    timer = registry.get(COMPLETIONS)
    dealt = _deal(deadlines, shares)
    made: list[tuple[Any, str, datetime]] = []
    for start in range(0, len(dealt), CHUNK):
        part = dealt[start:start + CHUNK]
        with transaction.atomic():
            orders = ShopOrder.objects.bulk_create([ShopOrder(status="Delivered", completes_at=deadline)
                                                    for _cohort, deadline in part])
            timer.schedule(orders)
        made += [(order.pk, cohort, deadline) for order, (cohort, deadline) in zip(orders, part, strict=True)]
    return _roles(COMPLETIONS, made)


def create_plain_orders(deadlines: Sequence[datetime], shares: dict[str, int], threads: int = 4) -> Rows:
    """A ``PlainOrder`` per deadline, each given it by ``set_deadline()`` (the app's own table),
    from ``threads`` threads: a call locks the row and writes its deadline."""
    timer = registry.get(PLAIN_PAYMENT)
    dealt = _deal(deadlines, shares)
    orders = PlainOrder.objects.bulk_create([PlainOrder() for _ in dealt], batch_size=CHUNK)
    work = list(zip(orders, dealt, strict=True))

    def give(share: list[tuple[PlainOrder, tuple[str, datetime]]]) -> None:
        try:
            for start in range(0, len(share), 100):
                with transaction.atomic():
                    for order, (_cohort, deadline) in share[start:start + 100]:
                        timer.set_deadline(order, deadline)
        finally:
            connection.close()

    _in_threads(give, [work[i::threads] for i in range(threads)])
    return _roles(PLAIN_PAYMENT, [(order.pk, cohort, deadline) for order, (cohort, deadline) in work])


def alongside(*works: Callable[[], None]) -> None:
    """Run each of ``works`` in a thread of its own, until all are done; the first error raised."""
    _in_threads(lambda work: work(), works)


def _in_threads(work: Callable[[Any], None], shares: Sequence[Any]) -> None:
    """``work(share)`` for each share in a thread of its own; the first error raised at the end."""
    errors: list[BaseException] = []

    def run(share: Any) -> None:
        try:
            work(share)
        except BaseException as exc:  # re-raised below, in the harness's thread
            errors.append(exc)

    workers = [threading.Thread(target=run, args=(share,)) for share in shares]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    if errors:
        raise errors[0]


# -- the shop's moves ------------------------------------------------------------------------


def _moved(timer: str, pk: int, move: str) -> str:
    """The move's record, as its transaction's last statement (the database's clock)."""
    ShopMove.objects.create(timer=timer, object_id=pk, move=move, at=DatabaseUtcNow())
    return move


def start_completing(pk: int) -> str:
    """The reservation's checkout starts completing (3-D Secure, say): the timer holds it."""
    with transaction.atomic():
        reservation = StockReservation.objects.select_for_update().get(pk=pk)
        if reservation.state != "held":
            return _moved(RESERVATIONS, pk, ShopMove.Move.TOO_LATE)
        Checkout.objects.filter(pk=reservation.checkout_id).update(state="completing")
        return _moved(RESERVATIONS, pk, ShopMove.Move.COMPLETING)


def complete(pk: int) -> str:
    """The checkout completed: its reservation is used, under the reservation's row lock."""
    with transaction.atomic():
        reservation = StockReservation.objects.select_for_update().get(pk=pk)
        if reservation.state != "held":
            return _moved(RESERVATIONS, pk, ShopMove.Move.TOO_LATE)
        StockReservation.objects.filter(pk=pk).update(state="used")
        Checkout.objects.filter(pk=reservation.checkout_id).update(state="completed")
        return _moved(RESERVATIONS, pk, ShopMove.Move.COMPLETED)


def abandon(pk: int) -> str:
    """The checkout gave up completing: nothing holds the reservation any more."""
    with transaction.atomic():
        reservation = StockReservation.objects.select_for_update().get(pk=pk)
        Checkout.objects.filter(pk=reservation.checkout_id).update(state="abandoned")
        return _moved(RESERVATIONS, pk, ShopMove.Move.ABANDONED)


def open_return(pk: int) -> str:
    """The customer opens a return, under the order's row lock: it must not complete now."""
    with transaction.atomic():
        order = ShopOrder.objects.select_for_update().get(pk=pk)
        if order.status != "Delivered":
            return _moved(COMPLETIONS, pk, ShopMove.Move.TOO_LATE)
        Return.objects.create(order=order, state="open")
        return _moved(COMPLETIONS, pk, ShopMove.Move.RETURNED)


def pay_plain_order(pk: int) -> str:
    """The payment callback: the order saved as paid and its deadline taken away, under its row
    lock (docs/timers.md); a cancelled one's save raises ``OrderClosed`` (refund)."""
    with transaction.atomic():
        order = PlainOrder.objects.select_for_update().get(pk=pk)
        order.status = "paid"
        try:
            order.save()
        except OrderClosed:
            return _moved(PLAIN_PAYMENT, pk, ShopMove.Move.REFUSED)
        registry.get(PLAIN_PAYMENT).set_deadline(order, None)
        return _moved(PLAIN_PAYMENT, pk, ShopMove.Move.PAID)


def pay_once_cancelled(pk: int, patience: float = 30.0) -> str:
    """The payment callback, come late: once the order is cancelled (looked at every 0.1 s, for
    ``patience`` seconds at most), so that it meets a cancelled order however late the act is."""
    give_up = time.monotonic() + patience
    while time.monotonic() < give_up and PlainOrder.objects.filter(pk=pk, status="pending").exists():
        time.sleep(0.1)
    return pay_plain_order(pk)


def at_moments(plan: Sequence[tuple[datetime, Callable[[int], str], int]], threads: int) -> None:
    """``move(pk)`` at each planned moment, from ``threads`` threads (a move's own record says
    what came of it). A move that raises is the harness's failure: the others go on, and the
    first error is raised at the end."""
    timeline = sorted(plan, key=lambda step: step[0])
    failures: list[str] = []

    def mover(share: Sequence[tuple[datetime, Callable[[int], str], int]]) -> None:
        try:
            for moment, move, pk in share:
                wait = (moment - timezone.now()).total_seconds()
                if wait > 0:
                    time.sleep(wait)
                try:
                    move(pk)
                except Exception as exc:
                    failures.append(f"{move.__name__}({pk}): {type(exc).__name__}: {exc}")
        finally:
            connection.close()

    _in_threads(mover, [timeline[i::threads] for i in range(threads)])
    if failures:
        raise RuntimeError(f"{len(failures)} of the shop's moves failed in the harness; the first: {failures[0]}")


def count_late_moves(timer: str, cohort: str, into: str) -> int:
    """Count in ``into`` the rows of ``cohort`` whose move meant for before the deadline came at or
    after it (a busy machine's harness behind its plan): the timer may then have acted first, and
    either way is right. How many moved."""
    Move = ShopMove.Move
    late = ShopMove.objects.filter(timer=timer, object_id=OuterRef("object_id")).filter(
        Q(move__in=(Move.TOO_LATE, Move.REFUSED))
        | Q(move__in=(Move.COMPLETING, Move.RETURNED, Move.PAID), at__gte=OuterRef("deadline")))
    return TimerRole.objects.filter(timer=timer, cohort=cohort).filter(Exists(late)).update(cohort=into)
