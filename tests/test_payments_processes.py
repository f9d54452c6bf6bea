"""Holds and reminders with consumers as real processes: racing, and SIGKILLed mid-batch."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db.models import Count, Q
from django.utils import timezone

from order_timeout import schedule
from order_timeout.consumer import Consumer
from order_timeout.models import Order, Reminder
from testproject.shop.models import Expiry, OrderPayment, ReminderEmail

from .conftest import Clock, wait_for
from .helpers import INNODB_TRX_POLL, count_in, leased_members, open_transactions_elsewhere

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

HOLD_PATH = "testproject.shop.payments.in_flight"


@pytest.fixture
def holds(settings):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "HOLD_CONDITION": Q(payments__state="pending")}
    return {"ORDER_TIMEOUT_HOLD_CONDITION": HOLD_PATH}


def due_orders(count: int, held_every: int) -> tuple[list[Order], list[Order]]:
    """``count`` due orders; every ``held_every``-th has a payment in flight."""
    deadline = timezone.now() - timedelta(seconds=1)
    orders = Order.objects.bulk_create([Order(expires_at=deadline) for _ in range(count)])
    schedule(orders)
    held = orders[::held_every]
    OrderPayment.objects.bulk_create([OrderPayment(order=order) for order in held])
    return orders, held


def after_the_leases(queue) -> Clock:
    """A clock just past the leases Redis holds now (a victim's guard may have renewed them)."""
    shards = [shard.keys.leased for shard in queue.shards]
    last = max(int(score) for key in shards for _, score in queue.client.zrange(key, 0, -1, withscores=True))
    return Clock(datetime.fromtimestamp((last + 1) / 1000, tz=UTC))


def closed_twice() -> bool:
    return Expiry.objects.values("order_id").annotate(n=Count("id")).filter(n__gt=1).exists()


def test_racing_consumers_never_close_a_held_order_and_close_the_rest_once(holds, consumer_process, queue):
    orders, held = due_orders(300, held_every=3)

    racers = [consumer_process("--once", "--batch-size", "40", env=holds) for _ in range(3)]
    results = [racer.wait() for racer in racers]

    assert [code for code, _, _ in results] == [0, 0, 0], [err for _, _, err in results]
    assert not closed_twice()
    assert Order.objects.filter(pk__in=[o.pk for o in held], status="unpaid").count() == len(held)
    assert Expiry.objects.count() == count_in(Order, "closed") == len(orders) - len(held)


def test_a_consumer_killed_mid_batch_never_closes_a_held_order(holds, consumer_process, queue, tmp_path):
    """It dies inside its first receiver, held orders in its batch; the batch is taken over."""
    orders, held = due_orders(20, held_every=4)
    stall = tmp_path / "claimed"
    victim = consumer_process("--batch-size", "20", env={**holds, "SHOP_STALL_FILE": str(stall)})
    victim.wait_until(stall.exists)

    victim.kill()
    wait_for(lambda: open_transactions_elsewhere() == 0, interval=INNODB_TRX_POLL)  # rolled back
    assert Expiry.objects.count() == 0
    Consumer(now=after_the_leases(queue), follow_database_clock=False).run(once=True)

    assert Order.objects.filter(pk__in=[o.pk for o in held], status="unpaid").count() == len(held)
    assert Expiry.objects.count() == count_in(Order, "closed") == len(orders) - len(held)
    assert not closed_twice()


@pytest.fixture
def reminders(settings):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "REMINDERS": [60, 45]}
    return {"ORDER_TIMEOUT_REMINDERS": "60,45"}


def orders_with_due_reminders(count: int) -> list[Order]:
    return [Order.objects.create(expires_at=timezone.now() + timedelta(seconds=40)) for _ in range(count)]


def sent_twice() -> bool:
    return ReminderEmail.objects.values("order_id", "seconds_left").annotate(
        n=Count("id")).filter(n__gt=1).exists()


def test_three_consumer_processes_send_each_reminder_once(reminders, consumer_process, queue):
    orders = orders_with_due_reminders(150)

    racers = [consumer_process("--once", "--batch-size", "25", env=reminders) for _ in range(3)]
    results = [racer.wait() for racer in racers]

    assert [code for code, _, _ in results] == [0, 0, 0], [err for _, _, err in results]
    assert ReminderEmail.objects.count() == Reminder.objects.filter(outcome="sent").count() == 300
    assert not sent_twice()
    assert {row.order_id for row in ReminderEmail.objects.all()} == {str(o.pk) for o in orders}


def test_a_consumer_killed_mid_batch_of_reminders_sends_each_once_after_the_lease(
        reminders, consumer_process, queue, tmp_path):
    orders = orders_with_due_reminders(10)
    stall = tmp_path / "reminding"
    victim = consumer_process("--batch-size", "50",
                              env={**reminders, "SHOP_REMINDER_STALL_FILE": str(stall)})
    victim.wait_until(stall.exists)

    victim.kill()
    wait_for(lambda: open_transactions_elsewhere() == 0, interval=INNODB_TRX_POLL)  # rolled back
    assert ReminderEmail.objects.count() == 0 and Reminder.objects.count() == 0
    Consumer(now=after_the_leases(queue.of_kind("remind")), follow_database_clock=False).run(once=True)

    assert ReminderEmail.objects.count() == 20 and not sent_twice()
    assert {row.order_id for row in ReminderEmail.objects.all()} == {str(o.pk) for o in orders}
    assert leased_members(queue.of_kind("remind")) == []
