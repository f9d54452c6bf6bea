"""Adopting it in a Django shop of its own whose writers do not lock: a model shaped like a ticket shop's.

Tried on a ticket shop: its payment confirmation reads the order, captures the money and then
writes "paid" from what it read, without a row lock. Of 40 payments racing their deadlines,
13-14 ended paid with the expiry's effects already applied (the expiry logged, the invoice
cancelled, the seats given back): the app never closed a paid row, the shop's stale write undid
its close. With ``guard_saves`` the stale write is refused and the payment, run again, takes the
shop's own path for an expired order (``testproject/tickets``).

Its other payment path commits the payment's own row before it saves the order (``confirm()``,
called outside a transaction by its PayPal webhook, staff's button and its REST API): there the
refused order save left a confirmed payment on an expired order, 10-17 of 40 in three runs, and a
webhook run again could not take it back. Each such refusal is now a ``RefusedWrite`` for staff;
the payment's row and the order's save in one transaction, the order locked, leave none.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connection, transaction
from django.db.models import Q, Sum
from django.utils import timezone

from order_timeout import timers
from order_timeout.exceptions import StaleOrderStatus
from order_timeout.models import Deadline, RefusedWrite
from order_timeout.timers.registry import registry
from testproject.tickets import payments
from testproject.tickets.closer import connect_own_closer, disconnect_own_closer, tick
from testproject.tickets.effects import book
from testproject.tickets.expiry import SeatHoldLapses, TicketOrderExpires
from testproject.tickets.models import (
    ExpiryLog,
    Invoice,
    InvoiceState,
    LedgerEntry,
    Payment,
    PaymentState,
    SeatHold,
    TicketOrder,
    TicketOrderStatus,
)
from testproject.tickets.payments import confirm, confirm_payment, confirm_with_the_order_locked, pay

from .conftest import finish, running, wait_for
from .helpers import score_of
from .test_refused_writes import recording_database_unreachable

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def ticket_timers(redis_client):
    """The shop's declarations, registered as its app's timers.py would at start-up; its own
    closer switched off (the switch-over's last step)."""
    disconnect_own_closer()
    registry.register(TicketOrder, TicketOrderExpires)
    registry.register(SeatHold, SeatHoldLapses)
    try:
        yield registry.get(TicketOrderExpires.name)
    finally:
        registry.unregister(TicketOrderExpires.name)
        registry.unregister(SeatHoldLapses.name)
        connect_own_closer()


@pytest.fixture
def expiring(ticket_timers, consumer):
    """A consumer of the shop's timers (on the database's clock: these deadlines are real times)."""
    kinds = [ticket_timers, registry.get(SeatHoldLapses.name)]
    return lambda: consumer(kinds=kinds, follow_database_clock=True, now=None).run(once=True)


def checkout(in_seconds: float) -> TicketOrder:
    order = TicketOrder.objects.create(pay_by=timezone.now() + timedelta(seconds=in_seconds))
    book(order)
    return order


def books_of(order: TicketOrder) -> tuple[str, str, Decimal, int]:
    """The order as its books tell it: status, invoice, seats booked, expiries logged."""
    row = TicketOrder.objects.get(pk=order.pk)
    booked = row.ledger.aggregate(total=Sum("amount"))["total"] or Decimal(0)
    return row.status, Invoice.objects.get(order=row).state, booked, ExpiryLog.objects.filter(order=row).count()


def lost_update(order: TicketOrder) -> bool:
    """Paid, yet with the expiry's effects standing: the shop's stale write undid the close."""
    status, invoice, booked, _expiries = books_of(order)
    return status == TicketOrderStatus.PAID and (invoice != InvoiceState.PAID or booked != order.amount)


def test_a_stale_payment_write_is_refused_instead_of_undoing_the_expiry(expiring):
    order = checkout(in_seconds=-1)

    with pytest.raises(StaleOrderStatus, match="acted on by its timer 'ticket-order-expiry'"):
        # The expiry commits while the money is at the provider: the write comes from a read before it.
        confirm_payment(order.pk, capture=lambda order: expiring())

    assert books_of(order) == (TicketOrderStatus.EXPIRED, InvoiceState.CANCELLED, Decimal(0), 1)


def test_the_payment_run_again_takes_the_shops_own_path_for_an_expired_order(expiring):
    order = checkout(in_seconds=-1)

    assert pay(order.pk, capture=lambda order: expiring()) == "paid late"

    assert books_of(order) == (TicketOrderStatus.PAID, InvoiceState.PAID, order.amount, 1)
    assert not lost_update(order)


def test_without_the_guard_the_same_stale_write_undoes_the_expiry(redis_client, consumer):
    """What the guard is for: the same race on the same model, its timer declared without it."""

    class Unguarded(TicketOrderExpires):
        guard_saves = False

    disconnect_own_closer()
    registry.register(TicketOrder, Unguarded)
    try:
        order = checkout(in_seconds=-1)
        run = consumer(kinds=[registry.get(Unguarded.name)], follow_database_clock=True, now=None)
        assert confirm_payment(order.pk, capture=lambda order: run.run(once=True)) == "paid"
    finally:
        registry.unregister(Unguarded.name)
        connect_own_closer()

    assert lost_update(order) and books_of(order)[3] == 1


def test_a_row_read_again_after_the_expiry_saves_as_the_shop_means_it(expiring):
    """The guard refuses writes from reads older than the act, not the shop's own later moves."""
    order = TicketOrder.objects.get(pk=checkout(in_seconds=-1).pk)
    expiring()

    order.refresh_from_db()  # the same instance, read again: it sees the expiry
    order.status = TicketOrderStatus.PAID
    order.save()

    assert TicketOrder.objects.get(pk=order.pk).status == TicketOrderStatus.PAID


def test_a_save_that_writes_nothing_the_expiry_wrote_is_not_refused(expiring):
    order = TicketOrder.objects.get(pk=checkout(in_seconds=-1).pk)
    expiring()

    order.amount = Decimal("12.00")
    order.save(update_fields=["amount"])

    assert (TicketOrder.objects.get(pk=order.pk).status, TicketOrder.objects.get(pk=order.pk).amount) == (
        TicketOrderStatus.EXPIRED, Decimal("12.00"))


def test_the_expiry_moves_the_models_auto_now_column(expiring):
    order = checkout(in_seconds=-1)
    before = TicketOrder.objects.get(pk=order.pk).last_modified

    expiring()

    row = TicketOrder.objects.get(pk=order.pk)
    assert row.status == TicketOrderStatus.EXPIRED and row.last_modified > before


Capture = Callable[[TicketOrder], None]


def racing_the_deadline(ticket_timers: Any, consumer: Any, deadline: float,
                        payments: list[Callable[[Capture], Any]]) -> list[BaseException]:
    """Each payment in a thread of its own, its capture at the provider until around ``deadline``
    (some writes land before the expiry, some after), while a consumer expires what is still
    pending; once nothing is pending, what the payments raised. Every fourth payment's capture
    lasts until its order has expired, so some land after it however late a busy machine runs
    the consumer."""
    errors: list[BaseException] = []

    def capture(order: TicketOrder) -> None:
        if order.pk % 4 == 0:
            wait_for(lambda: TicketOrder.objects.filter(pk=order.pk, status=TicketOrderStatus.EXPIRED).exists())
        else:
            time.sleep(max(deadline + random.uniform(-0.3, 0.4) - time.monotonic(), 0))

    def payment(paying: Callable[[Capture], Any]) -> None:
        try:
            paying(capture)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)
        finally:
            connection.close()

    worker = consumer(kinds=[ticket_timers], follow_database_clock=True, now=None)
    with running(worker):
        threads = [threading.Thread(target=payment, args=(paying,)) for paying in payments]
        for thread in threads:
            thread.start()
        for thread in threads:
            finish(thread)
        wait_for(lambda: not TicketOrder.objects.filter(status=TicketOrderStatus.PENDING).exists())
    return errors


def test_forty_payments_racing_their_deadlines_lose_no_update(ticket_timers, consumer):
    """Each payment reads its order before the deadline and writes around it; the consumer expires
    what is still pending. Every order ends paid with its books, or expired with its effects."""
    orders = [checkout(in_seconds=1.0) for _ in range(40)]
    deadline = time.monotonic() + 1.0
    results: dict[int, str] = {}

    def paying(pk: int) -> Callable[[Capture], None]:
        return lambda capture: results.__setitem__(pk, pay(pk, capture))

    errors = racing_the_deadline(ticket_timers, consumer, deadline, [paying(order.pk) for order in orders])

    assert not errors, errors
    assert [order.pk for order in orders if lost_update(order)] == []
    for order in orders:
        status, invoice, booked, expiries = books_of(order)
        assert expiries <= 1, (order.pk, expiries)
        assert (status, invoice, booked) in ((TicketOrderStatus.PAID, InvoiceState.PAID, order.amount),
                                             (TicketOrderStatus.EXPIRED, InvoiceState.CANCELLED, Decimal(0))), \
            (order.pk, status, invoice, booked, results.get(order.pk))
    assert set(results.values()) <= {"paid", "paid late"}


# -- every refused write is kept for staff ----------------------------------------------------------


@pytest.fixture(autouse=True)
def no_refused_writes_before() -> None:
    """Each test counts its own: a test outside a transaction of its own may have left one."""
    RefusedWrite.objects.all().delete()


def refused_writes(order: TicketOrder) -> list[tuple[str, str, dict[str, str]]]:
    return list(RefusedWrite.objects.open().filter(model="tickets.TicketOrder", object_id=str(order.pk))
                .values_list("timer", "refusal", "values"))


def test_a_stale_save_the_shop_rolls_back_still_leaves_its_refused_write(expiring):
    order = checkout(in_seconds=-1)
    stale = TicketOrder.objects.get(pk=order.pk)
    expiring()

    with pytest.raises(StaleOrderStatus), transaction.atomic():
        LedgerEntry.objects.create(order=stale, amount=stale.amount, reason="paid")  # the shop's own, rolled back
        stale.status = TicketOrderStatus.PAID
        stale.save()

    assert not LedgerEntry.objects.filter(order=order, reason="paid").exists()
    assert refused_writes(order) == [("ticket-order-expiry", "stale_save", {"status": "paid"})]


def test_a_stale_save_whose_record_cannot_be_written_is_refused_as_before(expiring, caplog):
    order = checkout(in_seconds=-1)

    def expired_then_unreachable(order: TicketOrder) -> None:
        expiring()  # the consumer's own connections come and go: unreachable only after it
        stack.enter_context(recording_database_unreachable())

    with ExitStack() as stack, pytest.raises(StaleOrderStatus, match="acted on by its timer"):
        confirm_payment(order.pk, capture=expired_then_unreachable)  # its save runs in its own atomic block

    assert books_of(order) == (TicketOrderStatus.EXPIRED, InvoiceState.CANCELLED, Decimal(0), 1)
    assert not RefusedWrite.objects.exists()
    assert "refused write not recorded (tickets.TicketOrder" in caplog.text


def paid_apart(in_seconds: float = -1) -> tuple[TicketOrder, Payment]:
    order = checkout(in_seconds)
    return order, Payment.objects.create(order=order)


def test_a_payment_committed_before_its_refused_order_save_is_recorded_for_staff(expiring):
    order, payment = paid_apart()

    with pytest.raises(StaleOrderStatus):
        confirm(payment.pk, capture=lambda order: expiring())  # the expiry commits while the money is captured

    assert Payment.objects.get(pk=payment.pk).state == PaymentState.CONFIRMED  # committed before the refusal
    assert books_of(order) == (TicketOrderStatus.EXPIRED, InvoiceState.CANCELLED, Decimal(0), 1)
    assert refused_writes(order) == [("ticket-order-expiry", "stale_save", {"status": "paid"})]


@pytest.mark.parametrize("entry", [payments.paypal_webhook, payments.staff_payment_received],
                         ids=["paypal-webhook", "staff-button"])
def test_run_again_the_payment_that_committed_first_cannot_take_the_late_payment(expiring, monkeypatch, entry):
    """Why the record is needed: the retry finds the payment confirmed and leaves the order expired."""
    order, payment = paid_apart()
    monkeypatch.setattr(payments, "capture_at_the_provider", lambda order: expiring())
    with pytest.raises(StaleOrderStatus):
        entry(payment.pk)

    assert entry(payment.pk) == "already confirmed"

    assert books_of(order)[0] == TicketOrderStatus.EXPIRED
    assert len(refused_writes(order)) == 1


def test_a_payment_and_its_order_saved_in_one_transaction_with_the_order_locked_take_the_shops_own_path(
        expiring):
    order, payment = paid_apart()

    assert confirm_with_the_order_locked(payment.pk, capture=lambda order: expiring()) == "paid late"

    assert books_of(order) == (TicketOrderStatus.PAID, InvoiceState.PAID, order.amount, 1)
    assert not RefusedWrite.objects.exists()


@pytest.mark.parametrize("confirming", [confirm, confirm_with_the_order_locked], ids=["apart", "locked"])
def test_forty_payments_confirmed_racing_their_deadlines_leave_no_confirmed_payment_unseen(
        ticket_timers, consumer, confirming):
    """Apart: every confirmed payment left on an expired order has its open RefusedWrite. In one
    transaction with the order locked: there is none to record."""
    paid = [paid_apart(in_seconds=1.0) for _ in range(40)]
    deadline = time.monotonic() + 1.0

    def confirmed(payment_id: int) -> Callable[[Capture], None]:
        def run(capture: Capture) -> None:
            try:
                confirming(payment_id, capture)
            except StaleOrderStatus:
                pass  # the shop's API answers it (409); its payment stays confirmed
        return run

    errors = racing_the_deadline(ticket_timers, consumer, deadline, [confirmed(row.pk) for _order, row in paid])

    assert not errors, errors
    left = [order.pk for order, row in paid if books_of(order)[0] == TicketOrderStatus.EXPIRED
            and Payment.objects.get(pk=row.pk).state == PaymentState.CONFIRMED]
    recorded = sorted(int(pk) for pk in RefusedWrite.objects.open().values_list("object_id", flat=True))
    assert recorded == sorted(left)
    if confirming is confirm:
        assert left, "no payment raced its expiry: the race this test is about did not happen"
    else:
        assert left == []


def test_the_shops_own_closer_is_a_tick_receiver_and_switches_off(db):
    order = checkout(in_seconds=-1)
    disconnect_own_closer()
    try:
        tick.send(sender=None)
        assert books_of(order)[0] == TicketOrderStatus.PENDING
    finally:
        connect_own_closer()

    tick.send(sender=None)

    assert books_of(order) == (TicketOrderStatus.EXPIRED, InvoiceState.CANCELLED, Decimal(0), 1)


def hold_deadline(hold: SeatHold):
    return Deadline.objects.filter(timer=SeatHoldLapses.name, object_id=str(hold.pk)).values_list(
        "expires_at", flat=True).first()


def test_an_extended_hold_moves_its_deadline_in_the_apps_table(ticket_timers, queue):
    hold = SeatHold.objects.create(seat="A1", hold_until=timezone.now() + timedelta(minutes=5))
    assert hold_deadline(hold) == hold.hold_until

    hold.hold_until += timedelta(minutes=10)
    hold.save()

    assert hold_deadline(hold) == hold.hold_until


def test_a_hold_shortened_into_the_past_lapses_at_once(ticket_timers, expiring, queue):
    hold = SeatHold.objects.create(seat="A2", hold_until=timezone.now() + timedelta(minutes=5))
    hold = SeatHold.objects.get(pk=hold.pk)  # read back, as the shop's checkout would

    hold.hold_until = timezone.now() - timedelta(seconds=1)
    hold.save()
    expiring()

    assert SeatHold.objects.get(pk=hold.pk).state == "released" and hold_deadline(hold) is None
    assert score_of(queue.of_kind(SeatHoldLapses.name), str(hold.pk)) is None


def test_a_hold_with_no_time_left_loses_its_deadline(ticket_timers):
    hold = SeatHold.objects.create(seat="A3", hold_until=timezone.now() + timedelta(minutes=5))

    hold.hold_until = None
    hold.save()

    assert hold_deadline(hold) is None


def test_a_timer_with_a_deadline_mirror_is_not_warned_about_an_index(ticket_timers):
    from order_timeout.checks import check_timers

    assert [m.id for m in check_timers() if m.obj is SeatHold] == []


@pytest.mark.parametrize(("attributes", "problem"), [
    ({"guard_saves": True, "values": {"status": timers.NOW}}, "guard_saves needs values"),
    ({"deadline_follows": ("pay_by",)}, "deadline_follows is for a timer whose deadline is None"),
    ({"deadline": None, "deadline_follows": ("nope",), "deadline_for": lambda self, row: None},
     "deadline_follows names 'nope'"),
])
def test_a_guard_or_a_mirror_that_cannot_work_is_refused_at_registration(attributes, problem):
    declaration = type("Broken", (timers.Timer,), {"name": "broken", "pending": Q(status="pending"),
                                                    "deadline": "pay_by", "values": {"status": "expired"},
                                                    **attributes})

    with pytest.raises(ImproperlyConfigured, match=problem):
        registry.register(TicketOrder, declaration)
