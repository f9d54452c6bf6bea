"""What the compensation scan reads, run after run: every overdue row once, then only what came
due since, and every row again on its full walk (COMPENSATION_FULL_INTERVAL).

Open dead letters stay overdue and unpaid until staff decide: a scan that read them all on
every run would grow with them for ever.
"""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.db.models import Q

from order_timeout.models import DeadLetter, Order
from order_timeout.queue import TimeoutQueue
from order_timeout.scans.compensation import compensate
from order_timeout.timers.staff import requeue

from .conftest import both_models, both_redis
from .helpers import state

pytestmark = pytest.mark.django_db(transaction=True)

FULL = 3600


def lose_member_of(order):
    """Redis lost this one member (a write that never arrived), and nothing else."""
    TimeoutQueue.from_settings().unschedule([str(order.pk)])


@pytest.fixture
def failing() -> set[str]:
    """The orders whose stock cannot be released (their receiver raises), by key."""
    return set()


@pytest.fixture
def dead_letters(settings, receiver, consumer, clock, make_order, order_model, failing):
    """Three overdue orders whose close failed for good: open dead letters (the receiver raises)."""
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "RETRY_DELAYS": [], "COMPENSATION_FULL_INTERVAL": FULL}

    def stock_service_down(sender, order, **kwargs):
        if str(order.pk) in failing:
            raise RuntimeError(f"cannot release the stock of order {order.pk}")

    receiver(stock_service_down)
    orders = [make_order(in_seconds=-1000 - i) for i in range(3)]
    failing.update(str(order.pk) for order in orders)
    consumer().run(once=True)
    assert DeadLetter.objects.filter(resolved_at=None).count() == 3
    return orders


@both_models
@both_redis
def test_the_scan_reads_open_dead_letters_once_and_again_only_on_its_full_walk(dead_letters, clock, make_order):
    # The test's clock runs ahead of the database's, by which a row is due: deadlines stay in the past.
    first = compensate(now=clock())
    second = compensate(now=clock.advance(60))
    late = make_order(in_seconds=-120)  # due since the last scan's cutoff; its member lost: the scan's
    lose_member_of(late)
    third = compensate(now=clock.advance(60))
    full = compensate(now=clock.advance(FULL))

    assert (first.examined, first.left_as_dead_letters) == (3, 3)
    assert (second.examined, second.left_as_dead_letters) == (0, 0)
    assert (third.examined, third.closed, third.left_as_dead_letters) == (1, 1, 0)
    assert state(late) == "closed"
    assert (full.examined, full.left_as_dead_letters) == (3, 3)
    assert all(state(order) == "unpaid" for order in dead_letters)


@both_redis
def test_a_row_the_scan_leaves_to_anyone_but_staff_is_read_again_by_the_next(dead_letters, clock, make_order,
                                                                                settings):
    """A held order (a payment in flight) stays overdue and open too, but the next scan must read it
    again (its hold may end, or Redis lose it): the walk starts no later than its deadline."""
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "HOLD_CONDITION": Q(close_reason="psp-pending")}
    held = make_order(in_seconds=-2000, close_reason="psp-pending")

    first = compensate(now=clock())
    lose_member_of(held)
    Order.objects.filter(pk=held.pk).update(close_reason="")  # the payment failed meanwhile
    second = compensate(now=clock.advance(300))

    assert (first.examined, first.held, first.left_as_dead_letters) == (4, 1, 3)
    assert (second.closed, state(held)) == (1, "closed")


def test_a_requeued_dead_letter_whose_member_redis_lost_is_closed_by_the_full_walk_at_the_latest(
        dead_letters, clock, failing):
    """Below where the walk starts, only the full walk reads (COMPENSATION_FULL_INTERVAL): the
    bound docs/design.md gives a row whose deadline had passed the scan before Redis lost it."""
    compensate(now=clock())
    letter = DeadLetter.objects.get(order_id=str(dead_letters[0].pk))
    failing.clear()  # the stock service is back
    requeue([letter], user=None, now=clock())
    lose_member_of(dead_letters[0])

    scan = compensate(now=clock.advance(300))
    full = compensate(now=clock.advance(FULL))

    assert (scan.closed, full.closed) == (0, 1)
    assert state(dead_letters[0]) == "closed"


def test_a_dry_run_leaves_where_the_next_scan_starts_alone(dead_letters, clock):
    compensate(now=clock(), dry_run=True)
    scan = compensate(now=clock.advance(300))

    assert (scan.examined, scan.left_as_dead_letters) == (3, 3)


def test_the_scan_walks_from_the_oldest_when_asked(dead_letters, clock):
    compensate(now=clock())

    again = compensate(now=clock.advance(300), from_oldest=True)

    assert (again.examined, again.left_as_dead_letters) == (3, 3)


def test_the_command_walks_from_the_oldest_when_asked(dead_letters, clock):
    compensate(now=clock())
    out = io.StringIO()

    call_command("order_timeout_compensate", "--from-oldest", stdout=out)

    assert "3 overdue unpaid orders found, 0 closed" in out.getvalue()
