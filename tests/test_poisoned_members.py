"""Members and scores Redis holds that name no order: never a crash, never a loop, never a loss.

Another app writing the same key, a hand-made repair, a bad deploy: whatever
sits in the queue, the consumer goes on, the healthy orders claimed beside it
close in the same turn, and the stranger is moved out of the queue into its
quarantine, where the status command and the admin page show it.
"""

from __future__ import annotations

import json
import logging
import signal
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.db.models import Count
from django.utils import timezone

from order_timeout import schedule
from order_timeout.queue import MAX_SCORE
from order_timeout.timers.members import now_score
from testproject.shop.models import Expiry

from .conftest import both_models, both_redis, wait_for
from .helpers import count_in, expiries, leased_members, pending_count, state

pytestmark = pytest.mark.django_db(transaction=True)

UNDECODABLE = b"\xff\xfe"


def quarantined(queue) -> list[bytes]:
    return sorted(member for shard in queue.shards for member in queue.client.zrange(shard.keys.quarantine, 0, -1))


def put_raw(queue, member: bytes, score: float | str, shard=None) -> None:
    """ZADD behind the app's back, as another program would."""
    shard = shard or queue.shards[0]
    queue.client.zadd(shard.keys.pending, {member: score})


@both_redis
@both_models
def test_an_undecodable_member_is_quarantined_and_the_order_claimed_with_it_closes_in_the_same_turn(
        consumer, make_order, queue, clock, caplog):
    order = make_order(in_seconds=-1)
    shard = queue.shard_for(str(order.pk))
    put_raw(queue, UNDECODABLE, now_score(clock()) - 5000, shard)

    with caplog.at_level(logging.ERROR, logger="order_timeout"):
        stats = consumer().run(once=True)

    assert state(order) == "closed" and expiries(order) == 1
    assert stats.closed == 1
    assert quarantined(queue) == [UNDECODABLE]
    assert pending_count(queue) == 0 and leased_members(queue) == []
    # Logged once, with the raw bytes escaped.
    assert caplog.text.count(r"\xff\xfe") == 1


@both_redis
def test_an_undecodable_member_taken_over_is_quarantined_not_raised(consumer, queue, clock):
    shard = queue.shards[0]
    queue.client.zadd(shard.keys.leased, {UNDECODABLE: now_score(clock()) - 1000})
    queue.client.hset(shard.keys.owners, UNDECODABLE, "a-dead-consumer")

    consumer().run(once=True)

    assert quarantined(queue) == [UNDECODABLE]
    assert leased_members(queue) == []
    assert queue.client.hlen(shard.keys.takeovers) == 0


@both_redis
@both_models
@pytest.mark.parametrize("score", ["+inf", MAX_SCORE + 1], ids=["infinite", "past-year-9999"])
def test_a_score_no_deadline_can_have_is_quarantined_and_the_queue_goes_on(consumer, make_order, queue, clock,
                                                                         score):
    put_raw(queue, b"12345678", score)

    consumer().run(once=True)  # the stranger is the only member: the claim sees it as the next deadline
    order = make_order(in_seconds=-1)
    consumer().run(once=True)

    assert quarantined(queue) == [b"12345678"]
    assert state(order) == "closed"


@both_redis
def test_a_lane_whose_next_score_is_infinite_does_not_crash_the_idle_refresh(consumer, queue, clock):
    put_raw(queue, b"1", "+inf")
    worker = consumer()

    assert worker.lanes.next_scores()[0] == 0  # "look now": the claim quarantines it


@both_models
def test_a_malformed_member_is_dropped_into_the_quarantine(consumer, make_order, queue, clock):
    order = make_order(in_seconds=-1)
    queue.schedule({"not-an-id": now_score(clock()) - 10})

    stats = consumer().run(once=True)

    assert state(order) == "closed"
    assert stats.dropped == 1
    assert quarantined(queue) == [b"not-an-id"]


def test_the_status_command_shows_the_quarantine_and_fails_past_its_threshold(consumer, queue, clock, capsys):
    put_raw(queue, UNDECODABLE, now_score(clock()) - 10)
    consumer().run(once=True)

    call_command("order_timeout_status", "--no-drift", "--json")
    assert json.loads(capsys.readouterr().out)["quarantined"] == 1
    with pytest.raises(CommandError) as crossed:
        call_command("order_timeout_status", "--no-drift", "--max-quarantined", "0")
    assert crossed.value.returncode == 2
    assert "1 members in the quarantine" in str(crossed.value)


@pytest.mark.slow
@both_redis
@both_models
def test_two_consumer_processes_survive_poison_and_close_every_healthy_order(consumer_process, queue, order_model,
                                                                           clock):
    """The tried case: an undecodable member and a +inf score in the pending set killed two running
    consumers within 12 s. Now they quarantine both, keep running and close every order."""
    racers = [consumer_process("--batch-size", "50") for _ in range(2)]
    for racer in racers:
        racer.wait_until(lambda racer=racer: "running" in racer.out)
    due = timezone.now() - timedelta(seconds=1)
    orders = order_model.objects.bulk_create([order_model(expires_at=due) for _ in range(200)])
    schedule(orders)
    for shard in queue.shards:
        queue.client.zadd(shard.keys.pending, {UNDECODABLE + str(shard.index).encode(): now_score(due),
                                               b"far-" + str(shard.index).encode(): "+inf"})

    wait_for(lambda: count_in(order_model, "closed") == 200 and pending_count(queue) == 0
             and leased_members(queue) == [])
    for racer in racers:
        assert racer.proc.poll() is None, racer.err  # both still running
        racer.signal(signal.SIGTERM)
    results = [racer.wait() for racer in racers]

    assert [code for code, _, _ in results] == [0, 0]
    assert len(quarantined(queue)) == 2 * len(queue.shards)
    assert not Expiry.objects.values("order_id").annotate(n=Count("id")).filter(n__gt=1).exists()
    assert Expiry.objects.count() == 200


@both_redis
def test_an_overdue_order_whose_member_redis_scores_infinite_is_closed_by_the_scan(make_order, queue, clock):
    from order_timeout.scans.compensation import compensate

    order = make_order(in_seconds=-600)
    queue.client.zadd(queue.shard_for(str(order.pk)).keys.pending, {str(order.pk): "+inf"})

    result = compensate(now=clock())

    assert result.closed == 1 and state(order) == "closed"


@both_redis
def test_the_rebuild_gives_a_member_scored_infinite_its_rows_deadline_again(make_order, queue, clock):
    from order_timeout.scans.compensation import compensate
    from order_timeout.timers.members import deadline_score

    order = make_order(in_seconds=600)
    queue.client.zadd(queue.shard_for(str(order.pk)).keys.pending, {str(order.pk): "+inf"})

    result = compensate(rebuild=True, now=clock())

    assert result.restored == 1
    assert queue.client.zscore(queue.shard_for(str(order.pk)).keys.pending, str(order.pk)) == \
        deadline_score(order.expires_at)
