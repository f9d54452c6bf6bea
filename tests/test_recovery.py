"""A queue Redis lost, rebuilt by a consumer at once (issue 27).

Tried on bc07ed2 with real consumers and the default settings, no Celery beat: the queue's Redis
emptied (FLUSHDB) 4 s before the deadline of 1,000 orders, and 0 of them closed within 75 s. Each
queue now keeps an epoch, a row in the database and a marker on each shard; a consumer whose
heartbeat finds a marker gone while the row exists rebuilds the queue from the rows
(scans/recovery.py).
"""

from __future__ import annotations

import pytest
from django.urls import reverse

from order_timeout.consumer import Consumer
from order_timeout.models import QueueEpoch
from order_timeout.timers.members import deadline_score

from .conftest import both_models, both_redis, flush_cluster, running, wait_for
from .helpers import count_in, expiries, score_of, state

pytestmark = pytest.mark.django_db(transaction=True)


def flush(queue, redis_backend):
    """Redis comes back empty, as after a restart without persistence."""
    if redis_backend == "cluster":
        flush_cluster()
    else:
        queue.client.flushdb()


def marked(worker) -> bool:
    rows = {row.queue: row.epoch for row in QueueEpoch.objects.all()}
    return bool(rows) and all(queue.epoch_intact(rows.get(f"{queue.prefix}:{queue.kind}", "?"))
                              for queue in worker.queues)


@both_models
@both_redis
def test_a_queue_redis_lost_before_the_consumer_started_is_rebuilt_and_every_due_order_closed_once(
        queue, make_order, order_model, redis_backend):
    overdue = [make_order(in_seconds=-5) for _ in range(10)]
    future = [make_order(in_seconds=3600) for _ in range(5)]
    paid = make_order(in_seconds=-5)
    paid.mark_paid()
    worker = Consumer(max_wait=0.2)
    assert worker.recovery.run()  # an earlier consumer set the queue up
    flush(queue, redis_backend)

    with running(worker):
        wait_for(lambda: count_in(order_model, "closed") == 10 and marked(worker))

    assert [expiries(order) for order in overdue] == [1] * 10
    assert state(paid) == "paid" and expiries(paid) == 0
    assert all(score_of(queue, str(order.pk)) == deadline_score(order.expires_at) for order in future)
    assert sum(row.rebuilds for row in QueueEpoch.objects.all()) >= 1


@both_redis
def test_a_queue_redis_loses_while_consumers_run_gets_its_future_deadlines_back_within_beats(
        queue, make_order, redis_backend):
    worker = Consumer(max_wait=0.2)
    with running(worker):
        wait_for(lambda: marked(worker))
        future = [make_order(in_seconds=3600) for _ in range(5)]
        assert all(score_of(queue, str(order.pk)) for order in future)

        flush(queue, redis_backend)

        wait_for(lambda: marked(worker) and all(score_of(queue, str(order.pk)) for order in future))
    assert all(score_of(queue, str(order.pk)) == deadline_score(order.expires_at) for order in future)


def test_a_new_queue_is_marked_and_nothing_rebuilt(queue, make_order):
    """A first deploy: no epoch anywhere. An order Redis never had is the compensation scan's, as
    before; the consumer only sets the queue up."""
    forgotten = make_order(in_seconds=-5)
    queue.client.flushdb()
    worker = Consumer(max_wait=0.2)

    with running(worker):
        wait_for(lambda: marked(worker))

    assert state(forgotten) == "unpaid"
    assert {row.rebuilds for row in QueueEpoch.objects.all()} == {0}


def test_staff_see_each_queues_epoch_and_its_rebuilds_in_the_admin(admin_client):
    QueueEpoch.objects.create(queue="order_timeout:close", epoch="e1", rebuilds=2)

    page = admin_client.get(reverse("admin:order_timeout_queueepoch_changelist"))

    assert page.status_code == 200 and b"order_timeout:close" in page.content
