"""Fewer round trips per batch (issue 28): a committed batch's ack travels with the next claim.

A consumer that goes straight on sends one script per batch: the claim,
carrying the last batch's ack (claim.lua acks it first, as forget.lua would).
One that sleeps, stops, or claims on another shard acks at once. The promise
stays: a lease is released only by its holder, only after the commit; a
consumer that dies holding an ack loses nothing and closes nothing twice.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from redis import Redis

from order_timeout.conf import settings as order_settings
from order_timeout.consumer import Consumer
from order_timeout.queue import TimeoutQueue
from order_timeout.timers.members import deadline_score, now_score
from order_timeout.timers.registry import ORDER_TIMEOUT

from .conftest import running, wait_for
from .helpers import Traffic, expiries, leased_members, recording_pool, state
from .test_consumer import own_key_prefix

pytestmark = pytest.mark.django_db(transaction=True)

# The order close alone: one lane, so every claim is of the shard the last batch came from.
CLOSE_ONLY = [ORDER_TIMEOUT]


@pytest.fixture
def traffic() -> Traffic:
    return Traffic()


@pytest.fixture
def queue(settings: Any, traffic: Traffic) -> Iterator[TimeoutQueue]:
    """A queue of the test's own keys on one shard, each round trip to it recorded."""
    client = Redis(connection_pool=recording_pool(settings.CACHES["order_timeout"]["LOCATION"], traffic))
    yield TimeoutQueue(client, own_key_prefix(), 1)
    client.close()


def scheduled(queue: TimeoutQueue, orders: list[Any]) -> None:
    queue.schedule({str(order.pk): deadline_score(order.expires_at) for order in orders})


def scripts_sent(traffic: Traffic) -> list[str]:
    return [name for trip in traffic.asked() if trip.outcome == "answered" for name in trip.scripts]


def test_a_consumer_going_straight_on_sends_one_script_per_batch_its_claim_carrying_the_last_ack(
        queue, traffic, make_order, clock):
    orders = [make_order(in_seconds=-1) for _ in range(6)]
    scheduled(queue, orders)
    worker = Consumer(queue, batch_size=2, now=clock, follow_database_clock=False, kinds=CLOSE_ONLY)
    traffic.trips.clear()

    stats = worker.run(once=True)

    assert stats.closed == 6
    # Three full claims, then the claim that finds nothing and carries the third batch's ack.
    assert scripts_sent(traffic) == ["claim"] * 4
    assert leased_members(queue) == [] and [state(order) for order in orders] == ["closed"] * 6


def test_a_claim_carries_the_ack_of_the_batch_before_it_and_releases_its_leases(queue, make_order, clock):
    first, second = make_order(in_seconds=-1), make_order(in_seconds=-1)
    scheduled(queue, [first, second])
    worker = Consumer(queue, batch_size=1, now=clock, follow_database_clock=False, kinds=CLOSE_ONLY)

    worker._run_once(None)  # the loop's step: the ack waits for the next claim
    assert leased_members(queue) == [str(first.pk)] and state(first) == "closed"
    worker._run_once(None)

    assert leased_members(queue) == [str(second.pk)]
    worker.flush_acks()
    assert leased_members(queue) == []


def test_run_once_acks_its_batch_before_it_returns(queue, make_order, clock):
    order = make_order(in_seconds=-1)
    scheduled(queue, [order])

    Consumer(queue, now=clock, follow_database_clock=False, kinds=CLOSE_ONLY).run_once()

    assert state(order) == "closed" and leased_members(queue) == []


def test_a_consumer_that_sleeps_has_acked_its_last_batch(queue, make_order, clock):
    worker = Consumer(queue, now=clock, follow_database_clock=False, kinds=CLOSE_ONLY, max_wait=3600,
                      heartbeat_seconds=3600)
    with running(worker):
        order = make_order(in_seconds=-1)
        scheduled(queue, [order])
        worker._wake.set()
        wait_for(lambda: state(order) == "closed")
        # Asleep, with nothing due for an hour: nothing of the batch is left leased.
        wait_for(lambda: leased_members(queue) == [])
        assert worker._carried is None


def test_a_consumer_that_stops_acks_its_last_batch(queue, make_order, clock):
    orders = [make_order(in_seconds=-1) for _ in range(2)]
    scheduled(queue, orders)
    worker = Consumer(queue, batch_size=1, now=clock, follow_database_clock=False, kinds=CLOSE_ONLY,
                      heartbeat_seconds=3600)
    closed = []

    def stop_after_the_first(*args: Any, **kwargs: Any) -> None:
        closed.append(1)
        worker.request_stop()

    worker.stats.add = stop_after_the_first  # type: ignore[method-assign]
    worker.run()

    assert closed == [1]
    assert leased_members(queue) == []
    assert sorted(state(order) for order in orders) == ["closed", "unpaid"]


def test_a_consumer_that_dies_holding_an_ack_loses_nothing_and_closes_nothing_twice(
        queue, make_order, clock):
    orders = [make_order(in_seconds=-1) for _ in range(2)]
    scheduled(queue, orders)
    dying = Consumer(queue, batch_size=2, now=clock, follow_database_clock=False, kinds=CLOSE_ONLY)
    dying._run_once(None)  # committed; the ack was waiting for a claim that never comes
    assert sorted(leased_members(queue)) == sorted(str(order.pk) for order in orders)

    clock.advance(order_settings.LEASE_SECONDS + 1)
    stats = Consumer(queue, now=clock, follow_database_clock=False, kinds=CLOSE_ONLY).run(once=True)

    assert (stats.closed, stats.skipped_paid) == (0, 2)  # taken over, found closed, let go
    assert leased_members(queue) == []
    assert [expiries(order) for order in orders] == [1, 1]


def taken_over(queue: TimeoutQueue, order: Any) -> tuple[Any, int]:
    """``order``'s member claimed by "dead:1", then, its lease run out, taken over by "alive:1": the
    shard, and the moment (ms) the next claim may be made at."""
    scheduled(queue, [order])
    shard = queue.shards[0]
    now_ms = now_score(order.expires_at) + 1000
    assert shard.claim(now_ms, 1, now_ms, "dead:1").members == [str(order.pk)]
    assert shard.claim(now_ms + 1, 1, now_ms + 60_000, "alive:1").members == [str(order.pk)]
    return shard, now_ms + 2


def test_a_stale_ack_in_a_claim_leaves_the_lease_of_the_claim_that_took_its_member_over(queue, make_order):
    order = make_order(in_seconds=-1)
    shard, now_ms = taken_over(queue, order)

    shard.claim(now_ms, 1, now_ms + 60_000, "dead:2", ack=("dead:1", [str(order.pk)]))

    assert leased_members(queue) == [str(order.pk)]
    assert queue.client.hget(shard.keys.owners, str(order.pk)) == b"alive:1"
