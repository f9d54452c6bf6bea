"""The ticket shop's timers, tested in its own style: Django ``TestCase`` (each test in a transaction
rolled back), the kit's plain functions in place of fixtures."""

from datetime import timedelta
from decimal import Decimal

from django.db.models import Sum
from django.test import TestCase
from django.utils import timezone

from order_timeout.exceptions import StaleOrderStatus
from order_timeout.testing import empty_queues, refused_writes, run_due, travel
from testproject.tickets.effects import book
from testproject.tickets.models import InvoiceState, SeatHold, TicketOrder, TicketOrderStatus
from testproject.tickets.payments import confirm_payment, pay


def checkout(minutes_to_pay=15):
    order = TicketOrder.objects.create(pay_by=timezone.now() + timedelta(minutes=minutes_to_pay))
    book(order)
    return order


def seats_booked(order):
    return order.ledger.aggregate(total=Sum("amount"))["total"]


class TicketTimersTest(TestCase):
    def setUp(self):
        empty_queues()
        self.addCleanup(empty_queues)

    def test_an_unpaid_order_expires_at_pay_by_and_gives_its_seats_back(self):
        order = checkout(minutes_to_pay=15)

        with travel(minutes=16):
            ran = run_due("ticket-order-expiry")

        order.refresh_from_db()
        self.assertEqual((order.status, ran.acted), (TicketOrderStatus.EXPIRED, 1))
        self.assertEqual(order.invoice.state, InvoiceState.CANCELLED)
        self.assertEqual(seats_booked(order), Decimal(0))

    def test_a_paid_order_is_left_alone(self):
        order = checkout(minutes_to_pay=15)
        self.assertEqual(pay(order.pk), "paid")

        with travel(hours=1):
            run_due()

        order.refresh_from_db()
        self.assertEqual(order.status, TicketOrderStatus.PAID)

    def test_a_payment_written_from_a_read_before_the_expiry_is_refused_and_recorded(self):
        order = checkout(minutes_to_pay=15)

        def expire_while_the_provider_captures(order):
            with travel(minutes=16):
                run_due("ticket-order-expiry")

        with self.assertRaises(StaleOrderStatus):
            confirm_payment(order.pk, capture=expire_while_the_provider_captures)

        order.refresh_from_db()
        self.assertEqual(order.status, TicketOrderStatus.EXPIRED)
        self.assertEqual([write.refusal for write in refused_writes(order)], ["stale_save"])

    def test_a_seat_hold_lapses_at_hold_until(self):
        hold = SeatHold.objects.create(seat="A12", hold_until=timezone.now() + timedelta(minutes=5))

        with travel(minutes=6):
            run_due("seat-hold-lapses")

        hold.refresh_from_db()
        self.assertEqual(hold.state, "released")
