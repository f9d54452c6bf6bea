"""Liveness apart from the lease (issue 27): a consumer's heartbeat, and the hand-over of a dead one's
batch to the next claims at once.

Tried on bc07ed2 with real consumers and the default settings: 2,000 orders due at once, one of two
consumers SIGKILLed mid-batch and started again at once: the latest close came 35.5 s after the
deadline, its batch waiting out the 30 s lease. A consumer beats every third of
HEARTBEAT_SECONDS (timers/heartbeats.py); a beat that finds another's heartbeat run out lets that
one's leases run out now (lua/heartbeat.lua).
"""

from __future__ import annotations

import signal

import pytest
from django.db import DatabaseError, connections

from order_timeout.consumer import Consumer
from order_timeout.db.session import end_session_named, session_identity
from order_timeout.models import Order

from .conftest import both_redis, running, wait_for
from .helpers import count_in, leased_members

pytestmark = pytest.mark.django_db(transaction=True)


def leases(queue, members):
    return {member: where.lease_ms for member, where in queue.positions(members).items()}


def claimed_batch(queue, consumer_id, now_ms, count=3, lease_ms=30_000):
    """``count`` due members, claimed by a claim of ``consumer_id`` with a lease of ``lease_ms``."""
    # Members of the first shard (a Cluster's queue has several).
    first = queue.shards[0]
    members = [member for member in (f"o{n}" for n in range(1000)) if queue.shard_for(member) is first][:count]
    queue.schedule(dict.fromkeys(members, now_ms - 1000))
    claim = queue.shards[0].claim(now_ms, count, now_ms + lease_ms, f"{consumer_id}:0")
    assert sorted(claim.members) == members
    return members


@both_redis
def test_the_leases_of_a_consumer_whose_heartbeat_ran_out_are_handed_over_at_once(queue):
    shard, now = queue.shards[0], 1_000_000_000
    shard.heartbeat("dead", now, now + 1500)
    members = claimed_batch(queue, "dead", now)

    handed, _, _ = shard.heartbeat("alive", now + 2000, now + 3500)

    assert handed == len(members)
    assert leases(queue, members) == dict.fromkeys(members, now + 2000)
    # The next claim takes them over: 28 s before the lease they were given would have run out.
    assert shard.claim(now + 2000, 10, now + 32_000, "alive:0").members


@both_redis
def test_a_consumer_that_keeps_beating_keeps_its_batch(queue):
    shard, now = queue.shards[0], 1_000_000_000
    shard.heartbeat("busy", now, now + 1500)
    members = claimed_batch(queue, "busy", now)

    shard.heartbeat("busy", now + 1000, now + 2500)
    handed, _, _ = shard.heartbeat("other", now + 2000, now + 3500)

    assert handed == 0
    assert leases(queue, members) == dict.fromkeys(members, now + 30000)


@both_redis
def test_a_consumer_that_stopped_is_never_taken_for_dead(queue):
    shard, now = queue.shards[0], 1_000_000_000
    shard.heartbeat("leaving", now, now + 1500)
    members = claimed_batch(queue, "leaving", now)

    shard.heartbeat("leaving", now + 100, None)
    handed, _, _ = shard.heartbeat("other", now + 60_000, now + 61_500)

    assert handed == 0
    assert leases(queue, members) == dict.fromkeys(members, now + 30000)


@both_redis
def test_a_claim_of_one_that_never_beat_keeps_its_lease(queue):
    """The compensation scan's claims, and a consumer of an older release, have no heartbeat: their
    leases run their course."""
    shard, now = queue.shards[0], 1_000_000_000
    members = claimed_batch(queue, "scan-or-older", now)

    handed, _, _ = shard.heartbeat("other", now + 60_000, now + 61_500)

    assert handed == 0
    assert leases(queue, members) == dict.fromkeys(members, now + 30000)


@both_redis
def test_a_dead_consumers_session_goes_to_the_first_beat_that_finds_it_dead_and_to_no_other(queue):
    shard, now = queue.shards[0], 1_000_000_000
    shard.heartbeat("frozen", now, now + 1500, "default\x1f42")
    shard.heartbeat("stopped", now, now + 1500, "default\x1f43")
    shard.heartbeat("stopped", now + 100, None, "default\x1f43")

    found = shard.heartbeat("alive", now + 2000, now + 3500)
    again = shard.heartbeat("other", now + 2100, now + 3600)

    assert found.sessions == ["default\x1f42"] and again.sessions == []


def other_session():
    """A second session of the test database, as another consumer's."""
    other = connections.create_connection("default")
    other.ensure_connection()
    return other


def session_alive(other) -> bool:
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT 1")
        return True
    except DatabaseError:
        return False


def test_a_recorded_session_is_ended_by_its_name():
    other = other_session()
    try:
        identity = session_identity(other)

        assert end_session_named("default", identity)

        assert not session_alive(other)
    finally:
        other.close()


def test_a_recorded_postgresql_session_whose_pid_came_back_for_a_stranger_is_left_alone():
    """A backend pid is reused once its process exits: the name carries when the backend started."""
    other = other_session()
    try:
        if other.vendor != "postgresql":
            pytest.skip("MySQL/MariaDB thread ids are not reused while the server runs")
        pid, started = session_identity(other).split("@")

        assert not end_session_named("default", f"{pid}@{int(started) - 1}")

        assert session_alive(other)
    finally:
        other.close()


@both_redis
def test_a_lease_that_already_ran_out_keeps_its_earlier_time(queue):
    """Its age counts in the backlog's "oldest due" figure: a hand-over never makes it look younger."""
    shard, now = queue.shards[0], 1_000_000_000
    shard.heartbeat("dead", now, now + 1500)
    members = claimed_batch(queue, "dead", now, lease_ms=500)

    shard.heartbeat("alive", now + 2000, now + 3500)

    assert leases(queue, members) == dict.fromkeys(members, now + 500)


@both_redis
def test_a_running_consumer_beats_on_every_lane_and_leaves_them_when_it_stops(queue):
    worker = Consumer(max_wait=0.2)
    with running(worker):
        wait_for(lambda: all(queue.client.zscore(shard.keys.consumers, worker.consumer_id)
                             for shard in worker.lanes.shards))
    assert not any(queue.client.zscore(shard.keys.consumers, worker.consumer_id) for shard in worker.lanes.shards)


@pytest.mark.slow
@both_redis
@pytest.mark.parametrize("stop", ["killed", "frozen"])
def test_a_consumer_killed_or_frozen_mid_batch_has_its_batch_closed_by_another_long_before_its_lease(
        consumer_process, queue, tmp_path, stop):
    """The lease is an hour here, and so is the server's limit on the frozen one's transaction: only
    the heartbeat can hand the batch over, and end the session that holds its rows, in the test."""
    from .test_consumer_processes import due_orders, started

    orders = due_orders(20)
    stall = tmp_path / "claimed"
    hour = {"ORDER_TIMEOUT_LEASE_SECONDS": "3600"}
    victim = consumer_process("--batch-size", "20", env={**hour, "SHOP_STALL_FILE": str(stall)})
    victim.wait_until(stall.exists)
    # Its first claim (a shard's due members: all 20 with one shard) stays leased.
    claimed = leased_members(queue)
    assert claimed and set(claimed) <= {str(order.pk) for order in orders}
    survivor = consumer_process("--batch-size", "20", env=hour)
    survivor.wait_until(lambda: started(survivor))

    victim.kill() if stop == "killed" else victim.signal(signal.SIGSTOP)

    # Closed, then acked: the survivor lets go of each lease after its commit.
    wait_for(lambda: count_in(Order, "closed") == 20 and leased_members(queue) == [])
    assert "heartbeat stopped" in survivor.err
    if stop == "frozen":
        assert "Ended the database session" in survivor.err
        victim.kill()
    survivor.signal(signal.SIGTERM)
    assert survivor.wait()[0] == 0
