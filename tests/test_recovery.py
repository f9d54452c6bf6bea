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
from django.utils import timezone

from order_timeout import unschedule
from order_timeout.consumer import Consumer
from order_timeout.models import QueueEpoch
from order_timeout.queue import TimeoutQueue
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


@both_models
def test_a_redis_back_from_a_snapshot_that_missed_the_last_writes_is_rebuilt_at_once(
        private_redis, make_order, order_model, clock):
    """The epoch marker survives a failover to a replica that missed the last second of writes (or
    a restart from the last snapshot); its stamp, the run id of the server that wrote it, does not.
    The deadlines scheduled after the snapshot close, and those before keep their scores."""
    worker = Consumer(max_wait=0.2)
    queue = TimeoutQueue.from_settings()
    with running(worker):
        wait_for(lambda: marked(worker))
        before = [make_order(in_seconds=3600) for _ in range(3)]
        queue.client.save()
        # Due a few seconds from now by the real clock, which the consumer follows (the test clock
        # stopped at the fixture's setup: seen in CI, a slow setup made these due as they were
        # written, and the consumer had claimed the first before it was looked for in Redis).
        clock.current = timezone.now()
        missed = [make_order(in_seconds=3) for _ in range(5)]
        assert all(score_of(queue, str(order.pk)) for order in missed)

        private_redis.crash_to_last_save()

        wait_for(lambda: count_in(order_model, "closed") == 5 and marked(worker))
    assert [expiries(order) for order in missed] == [1] * 5
    assert all(score_of(queue, str(order.pk)) == deadline_score(order.expires_at) for order in before)
    assert {row.rebuilds for row in QueueEpoch.objects.all()} == {1}  # each queue once


@both_redis
def test_a_marker_stamped_by_another_server_has_the_queue_rebuilt_and_stamped_again(
        queue, make_order, redis_backend):
    """A replica promoted over its master holds the master's stamp: the queue is rebuilt once (the
    deadline it never got is back) and its markers stamped by the server that holds them now."""
    worker = Consumer(max_wait=0.2)
    with running(worker):
        wait_for(lambda: marked(worker))
        row = QueueEpoch.objects.get(queue=f"{queue.prefix}:{queue.kind}")
        order = make_order(in_seconds=3600)
        unschedule([order])  # the write the replica missed
        for shard in queue.shards:
            shard.client.set(shard.keys.epoch, f"{row.epoch} {'0' * 40}")  # the old master's stamp

        wait_for(lambda: marked(worker) and score_of(queue, str(order.pk)))
    assert score_of(queue, str(order.pk)) == deadline_score(order.expires_at)
    assert QueueEpoch.objects.get(pk=row.pk).rebuilds == 1


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
