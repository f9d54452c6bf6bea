"""Reminders before the deadline: each sent once, on time, never for a paid, closed or held order.

The shop's receiver of ``deadline_approaching`` (``testproject.shop.receivers.record_reminder``)
writes a ``ReminderEmail`` row in the reminder's transaction: a row is a reminder that went out.
The database's clock decides every moment, so these tests use deadlines in real time.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.db.models import Count, Q
from django.utils import timezone

from order_timeout.consumer import Consumer
from order_timeout.models import Order, Reminder
from order_timeout.queue.keys import REMIND
from order_timeout.reporting.health import measure
from order_timeout.scans.compensation import compensate
from order_timeout.signals import deadline_approaching
from order_timeout.timers.members import deadline_score, reminder_member
from order_timeout.timers.reminders import GATHER_SECONDS
from testproject.shop.models import OrderPayment, Payment, ReminderEmail, ShopOrder

from .conftest import both_models, running, wait_for
from .helpers import lose_redis_data, set_state, state

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def reminders(settings):
    """Two reminders, 60 s and 45 s before the deadline."""
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "REMINDERS": [60, 45]}


def emails(order=None) -> list[tuple[str, float]]:
    rows = ReminderEmail.objects.order_by("seconds_left")
    if order is not None:
        rows = rows.filter(order_id=str(order.pk))
    return [(order_id, seconds) for order_id, seconds in rows.values_list("order_id", "seconds_left")]


def reminder_queue(queue):
    return queue.of_kind(REMIND)


def due_reminders_order(model, seconds_ahead: float = 30):
    """An order whose deadline is ``seconds_ahead`` away: both reminders' moments have passed."""
    return model.objects.create(expires_at=timezone.now() + timedelta(seconds=seconds_ahead))


@both_models
def test_each_reminder_is_sent_once_before_the_deadline(reminders, order_model, queue):
    order = due_reminders_order(order_model)

    first = Consumer().run(once=True)
    again = Consumer().run(once=True)

    assert sorted(emails(order), key=lambda e: -e[1]) == [(str(order.pk), 60.0), (str(order.pk), 45.0)]
    assert (first.reminders.sent, again.reminders.sent) == (2, 0)
    assert Reminder.objects.filter(order_id=str(order.pk), outcome="sent").count() == 2
    assert state(order) == "unpaid"
    assert reminder_queue(queue).stats(deadline_score(timezone.now())).pending == 0


def test_a_consumer_claims_due_reminders_again_only_once_they_have_gathered(reminders, consumer, clock):
    """After a batch of reminders, the next reminders due wait up to ``GATHER_SECONDS`` (by the
    consumer's clock) for others: a few larger batches, not a small one between every two
    batches of closes."""
    due_reminders_order(Order)
    worker = consumer()
    assert reminders_claimed([worker.run_once() for _ in worker.lanes.shards]) == 2  # each lane's turn

    due_reminders_order(Order)
    gathering = [worker.run_once() for _ in worker.lanes.shards]
    clock.advance(GATHER_SECONDS)
    gathered = [worker.run_once() for _ in worker.lanes.shards]

    assert reminders_claimed(gathering) == 0 and reminders_claimed(gathered) == 2


def reminders_claimed(claims) -> int:
    return sum(len(claim.members) for claim in claims if claim.kind == REMIND)


def test_a_reminder_is_sent_at_its_moment_not_before(settings, queue):
    """A consumer running: the reminder 1 s before a deadline 1.5 s away goes out 0.5 s from now."""
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "REMINDERS": [1]}
    order = Order.objects.create(expires_at=timezone.now() + timedelta(seconds=1.5))
    moment = order.expires_at - timedelta(seconds=1)

    worker = Consumer(max_wait=5)
    with running(worker):
        wait_for(lambda: emails(order), timeout=30)

    record = Reminder.objects.get(order_id=str(order.pk))
    assert record.outcome == "sent" and record.at >= moment  # by the database's clock: never early
    assert record.at < order.expires_at


@both_models
def test_no_reminder_for_an_order_paid_before_its_moment(reminders, order_model, queue):
    order = due_reminders_order(order_model)
    order_model.objects.get(pk=order.pk).mark_paid()  # its members leave both queues

    set_state(order, "paid")  # and were they still there (a lost ZREM), the row says paid
    reminder_queue(queue).schedule({reminder_member(order_model, order.pk, 60_000): 0})
    stats = Consumer().run(once=True)

    assert emails() == [] and stats.reminders.sent == 0
    assert reminder_queue(queue).stats(deadline_score(timezone.now())).pending == 0


def test_no_reminder_for_an_order_paid_a_millisecond_before_its_moment(settings, queue):
    """The payment commits a millisecond before the reminder falls due; the consumer comes right
    after it (its member still there, as if the payment's ZREM was lost): the row says paid."""
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "REMINDERS": [1]}
    order = Order.objects.create(expires_at=timezone.now() + timedelta(seconds=1.5))
    moment = order.expires_at - timedelta(seconds=1)
    member = reminder_member(Order, order.pk, 1000)

    time.sleep(max(0.0, (moment - timezone.now()).total_seconds() - 0.001))
    Order.objects.filter(pk=order.pk).update(status="paid")  # behind the queue's back: still there
    time.sleep(max(0.0, (moment - timezone.now()).total_seconds()) + 0.01)
    assert reminder_queue(queue).positions([member])[member].pending_ms is not None
    stats = Consumer().run(once=True)

    assert emails() == [] and Reminder.objects.count() == 0
    assert stats.reminders.done == 1


@both_models
def test_no_reminder_for_a_closed_order_or_one_without_a_deadline(reminders, order_model, queue):
    closed = due_reminders_order(order_model)
    set_state(closed, "closed")
    no_deadline = due_reminders_order(order_model)
    order_model._base_manager.filter(pk=no_deadline.pk).update(expires_at=None)

    Consumer().run(once=True)

    assert emails() == []


@both_models
def test_no_reminder_for_an_order_whose_payment_is_in_flight(reminders, settings, order_model, queue):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "HOLD_CONDITION": Q(payments__state="pending")}
    order = due_reminders_order(order_model)
    (Payment if order_model is ShopOrder else OrderPayment).objects.create(order=order)

    stats = Consumer().run(once=True)

    assert emails() == [] and stats.reminders.held == 2
    assert set(Reminder.objects.values_list("outcome", flat=True)) == {"held"}


def test_an_extended_deadline_moves_its_reminders(settings, queue):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "REMINDERS": [60]}
    order = Order.objects.create(expires_at=timezone.now() + timedelta(seconds=30))  # due now
    order.extend_deadline(timezone.now() + timedelta(hours=2))

    stats = Consumer().run(once=True)

    assert emails() == [] and stats.reminders.rescheduled == 1
    member = reminder_member(Order, order.pk, 60_000)
    score = reminder_queue(queue).client.zscore(reminder_queue(queue).shard_for(member).keys.pending, member)
    assert int(score) == deadline_score(Order.objects.get(pk=order.pk).expires_at) - 60_000


def test_a_shortened_deadline_brings_its_reminders_forward(settings, queue):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "REMINDERS": [60]}
    order = Order.objects.create(expires_at=timezone.now() + timedelta(hours=2))
    assert Consumer().run(once=True).reminders.sent == 0

    order.extend_deadline(timezone.now() + timedelta(seconds=30))
    Consumer().run(once=True)

    assert emails(order) == [(str(order.pk), 60.0)]


def test_an_order_extended_after_its_reminder_gets_it_again_for_the_new_deadline(settings, queue):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "REMINDERS": [60]}
    order = Order.objects.create(expires_at=timezone.now() + timedelta(seconds=30))
    Consumer().run(once=True)

    order.extend_deadline(order.expires_at + timedelta(seconds=10))  # still within 60 s
    Consumer().run(once=True)

    assert [seconds for _, seconds in emails(order)] == [60.0, 60.0]
    assert Reminder.objects.filter(order_id=str(order.pk)).values("deadline").distinct().count() == 2


def test_no_reminder_after_the_deadline(settings, queue):
    """No consumer ran until the deadline had passed: the reminder is dropped, the order closed."""
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "REMINDERS": [60]}
    order = Order.objects.create(expires_at=timezone.now() + timedelta(seconds=0.3))
    time.sleep(0.4)

    stats = Consumer().run(once=True)

    assert emails() == [] and stats.closed == 1 and stats.reminders.done == 1
    assert state(order) == "closed"


def test_a_reminder_scheduled_past_its_moment_is_sent_at_once(settings, queue):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "REMINDERS": [900]}
    order = Order.objects.create(expires_at=timezone.now() + timedelta(minutes=5))  # 15 min reminder: late

    Consumer().run(once=True)

    assert emails(order) == [(str(order.pk), 900.0)]


def test_redis_flushed_rebuild_restores_reminders_and_they_are_sent(settings, queue):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "REMINDERS": [60, 45]}
    soon = Order.objects.create(expires_at=timezone.now() + timedelta(seconds=30))
    later = Order.objects.create(expires_at=timezone.now() + timedelta(hours=3))
    sent_before = Order.objects.create(expires_at=timezone.now() + timedelta(seconds=50))
    Consumer().run(once=True)  # sent_before's 60 s reminder goes out; soon's two as well
    ReminderEmail.objects.all().delete()
    Reminder.objects.filter(order_id=str(soon.pk)).delete()  # as if soon's never went out
    lose_redis_data(queue)

    result = compensate(rebuild=True)
    Consumer().run(once=True)

    assert result.reminders_restored == 2 + 2 + 1  # soon: 2, later: 2, sent_before: its 45 s one
    assert sorted(emails()) == sorted([(str(soon.pk), 45.0), (str(soon.pk), 60.0)])
    waiting = reminder_queue(queue).positions([
        reminder_member(Order, later.pk, 60_000), reminder_member(Order, later.pk, 45_000),
        reminder_member(Order, sent_before.pk, 45_000), reminder_member(Order, sent_before.pk, 60_000)])
    assert [where.pending_ms is not None for where in waiting.values()] == [True, True, True, False]


def test_the_beat_scan_puts_back_a_missed_reminder_whose_deadline_is_ahead(settings, queue):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "REMINDERS": [60]}
    order = Order.objects.create(expires_at=timezone.now() + timedelta(seconds=30))
    reminder_queue(queue).unschedule([reminder_member(Order, order.pk, 60_000)])  # a failover lost it

    result = compensate(heal=True)
    Consumer().run(once=True)

    assert result.reminders_restored == 1
    assert emails(order) == [(str(order.pk), 60.0)]


def test_a_receiver_that_raises_retries_like_a_close_and_never_blocks_the_close(settings, queue, receiver,
                                                                              consumer, clock):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "REMINDERS": [60], "RETRY_DELAYS": [0.2]}
    order = Order.objects.create(expires_at=clock() + timedelta(seconds=1))
    calls = []

    def mail_service_down(sender, order, **kwargs):
        calls.append(order.pk)
        raise ConnectionError("the mail service is down")

    deadline_approaching.connect(mail_service_down, weak=False)
    try:  # on the test's clock: each run sees the moment the test names, however slow the machine
        first = consumer().run(once=True)
        clock.advance(0.25)
        second = consumer().run(once=True)  # the retry fails too: the last delay was used
        clock.advance(1)
        third = consumer().run(once=True)  # the deadline: the close goes on
    finally:
        deadline_approaching.disconnect(mail_service_down)

    assert (first.reminders.failed, second.reminders.given_up) == (1, 1)
    assert len(calls) == 2 and emails() == []  # the shop's row rolled back with each failure
    assert Reminder.objects.get(order_id=str(order.pk)).outcome == "failed"
    assert third.closed == 1 and state(order) == "closed"


def test_status_and_metrics_count_reminders(reminders, queue):
    for seconds in (30, 3600, 7200):
        Order.objects.create(expires_at=timezone.now() + timedelta(seconds=seconds))

    health = measure(drift=False)

    assert (health.reminders_pending, health.reminders_due) == (6, 2)


def test_three_consumers_send_each_reminder_once(settings, queue):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "REMINDERS": [60, 45]}
    orders = [Order.objects.create(expires_at=timezone.now() + timedelta(seconds=30)) for _ in range(60)]

    workers = [Consumer(batch_size=7) for _ in range(3)]
    threads = [running(worker) for worker in workers]
    for thread in threads:
        thread.__enter__()
    try:
        wait_for(lambda: ReminderEmail.objects.count() >= 120, timeout=60)
    finally:
        for thread in threads:
            thread.__exit__(None, None, None)

    assert ReminderEmail.objects.count() == 120
    assert not ReminderEmail.objects.values("order_id", "seconds_left").annotate(
        n=Count("id")).filter(n__gt=1).exists()
    assert {order_id for order_id, _ in emails()} == {str(o.pk) for o in orders}


def test_staff_read_the_reminders_in_the_admin_and_cannot_change_them(reminders, queue, admin_client):
    order = due_reminders_order(Order)
    Consumer().run(once=True)

    listing = admin_client.get("/admin/order_timeout/reminder/")
    change = admin_client.get(f"/admin/order_timeout/reminder/{Reminder.objects.first().pk}/change/")

    assert listing.status_code == 200 and str(order.pk) in listing.text and "60.0" in listing.text
    assert change.status_code == 200 and "Save" not in change.text  # view only
    assert admin_client.get("/admin/order_timeout/reminder/add/").status_code == 403
