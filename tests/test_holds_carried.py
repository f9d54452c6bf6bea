"""A held order costs no round trip more than a closed one: its put-back travels with the next claim.

A batch with orders a payment in flight holds used to put them back by a
script of its own after the commit. The claim that follows carries them now,
as it carries the batch's ack (claim.lua puts each back where the carried
token still holds its lease, as reschedule.lua would). The promises stay:
only the lease holder moves a member; a held order's next look is
min(now + HOLD_RECHECK, deadline + MAX_HOLD); a consumer that dies first
loses nothing (its leases are taken over and judged again under the lock).
"""

from __future__ import annotations

import pytest
from django.db.models import Q

from order_timeout.conf import settings as order_settings
from order_timeout.consumer import Consumer
from order_timeout.timers.members import deadline_score, now_score
from testproject.shop.models import OrderPayment, PaymentState

from . import test_ack_with_next_claim as acks
from .conftest import running, wait_for
from .helpers import expiries, leased_members, state
from .test_ack_with_next_claim import CLOSE_ONLY, scheduled, scripts_sent

pytestmark = pytest.mark.django_db(transaction=True)

RECHECK = 30
# The queue of the test's own keys on one shard, each round trip recorded, as the acks' tests have it.
queue, traffic = acks.queue, acks.traffic


@pytest.fixture
def holds(settings):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "HOLD_CONDITION": Q(payments__state="pending"),
                              "HOLD_RECHECK": RECHECK}


def paying(order):
    return OrderPayment.objects.create(order=order, state=PaymentState.PENDING)


def held_marks(queue):
    shard = queue.shards[0]
    return {member.decode(): int(score) for member, score in queue.client.zrange(shard.keys.held, 0, -1,
                                                                                  withscores=True)}


def pending_scores(queue):
    shard = queue.shards[0]
    return {member.decode(): int(score) for member, score in queue.client.zrange(shard.keys.pending, 0, -1,
                                                                                  withscores=True)}


def test_a_batch_with_held_orders_sends_no_script_more_than_a_batch_without(
        holds, queue, traffic, make_order, clock):
    orders = [make_order(in_seconds=-1) for _ in range(6)]
    paying(orders[0]), paying(orders[3])
    scheduled(queue, orders)
    worker = Consumer(queue, batch_size=2, now=clock, follow_database_clock=False, kinds=CLOSE_ONLY)
    traffic.trips.clear()

    stats = worker.run(once=True)

    assert (stats.closed, stats.held) == (4, 2)
    # Three full claims, then the one that finds nothing due and carries the last batch's ack and
    # held members: the same scripts as six orders with no payment in flight.
    assert scripts_sent(traffic) == ["claim"] * 4
    assert leased_members(queue) == []


def test_the_next_claim_puts_the_held_members_back_at_their_next_look_marked_held(
        holds, queue, make_order, clock):
    held, closing = make_order(in_seconds=-1), make_order(in_seconds=-1)
    paying(held)
    scheduled(queue, [held, closing])
    worker = Consumer(queue, now=clock, follow_database_clock=False, kinds=CLOSE_ONLY)

    worker._run_once(None)  # the loop's step: what the batch settled waits for the next claim
    assert sorted(leased_members(queue)) == sorted([str(held.pk), str(closing.pk)])
    assert held_marks(queue) == {}
    worker._run_once(None)

    assert leased_members(queue) == [] and state(closing) == "closed" and state(held) == "unpaid"
    assert pending_scores(queue) == {str(held.pk): now_score(clock()) + RECHECK * 1000}
    assert held_marks(queue) == {str(held.pk): now_score(clock())}


def test_a_held_members_next_look_is_no_later_than_its_longest_hold(holds, queue, make_order, clock, settings):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "MAX_HOLD": 10}
    order = make_order(in_seconds=-5)
    paying(order)
    scheduled(queue, [order])

    Consumer(queue, now=clock, follow_database_clock=False, kinds=CLOSE_ONLY).run(once=True)

    assert pending_scores(queue) == {str(order.pk): deadline_score(order.expires_at) + 10_000}


def test_a_carried_held_member_that_another_claim_took_over_stays_in_its_lease(holds, queue, make_order):
    order = make_order(in_seconds=-1)
    shard, now_ms = acks.taken_over(queue, order)

    shard.claim(now_ms, 1, now_ms + 60_000, "dead:2", held=(now_ms, {str(order.pk): now_ms + 30_000}))

    assert leased_members(queue) == [str(order.pk)] and pending_scores(queue) == {}
    assert queue.client.hget(shard.keys.owners, str(order.pk)) == b"alive:1"
    assert held_marks(queue) == {}


def test_a_consumer_that_dies_carrying_held_members_loses_nothing(holds, queue, make_order, clock):
    held, closing = make_order(in_seconds=-1), make_order(in_seconds=-1)
    payment = paying(held)
    scheduled(queue, [held, closing])
    Consumer(queue, now=clock, follow_database_clock=False, kinds=CLOSE_ONLY)._run_once(None)  # then dies

    OrderPayment.objects.filter(pk=payment.pk).update(state=PaymentState.FAILED)
    clock.advance(order_settings.LEASE_SECONDS + 1)
    stats = Consumer(queue, now=clock, follow_database_clock=False, kinds=CLOSE_ONLY).run(once=True)

    # Both taken over and judged again under the lock: the one closed before is let go, the one
    # whose payment failed meanwhile is closed, once.
    assert (stats.closed, stats.skipped_paid) == (1, 1)
    assert [state(held), state(closing)] == ["closed", "closed"]
    assert [expiries(held), expiries(closing)] == [1, 1]
    assert leased_members(queue) == [] and pending_scores(queue) == {}


def test_a_consumer_that_sleeps_has_put_its_held_members_back(holds, queue, make_order, clock):
    worker = Consumer(queue, now=clock, follow_database_clock=False, kinds=CLOSE_ONLY, max_wait=3600,
                      heartbeat_seconds=3600)
    with running(worker):
        order = make_order(in_seconds=-1)
        paying(order)
        scheduled(queue, [order])
        worker._wake.set()
        # Asleep, with nothing due for HOLD_RECHECK: the held member waits in pending, not leased, and
        # nothing is left to carry. (Asked together: the claim that carried it lets go of it only once
        # Redis answered, a moment after the member is back.)
        wait_for(lambda: pending_scores(queue) == {str(order.pk): now_score(clock()) + RECHECK * 1000}
                 and worker._carried is None)
        assert leased_members(queue) == []
