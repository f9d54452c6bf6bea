"""What the claim script does to Redis's own structures (issue 28): the lease's bookkeeping stays
O(1) a member, and the ack a claim carries acks any member, however it is spelled."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from redis import Redis

from order_timeout.queue import TimeoutQueue

from .test_consumer import own_key_prefix


@pytest.fixture
def queue(redis_client: Redis) -> Iterator[TimeoutQueue]:
    """One shard of the test's own keys (the test database is flushed after)."""
    yield TimeoutQueue(redis_client, own_key_prefix(), 1)


def test_the_owners_hash_is_a_hash_table_from_the_first_lease_and_stays_one(queue) -> None:
    """A listpack is scanned for every field set, read or dropped: a batch of 500 leased and
    acked at 2.4 us a member each way, quadratic in the batch."""
    shard = queue.shards[0]
    queue.schedule({str(pk): 1000 + pk for pk in range(1, 4)})
    first = shard.claim(10_000, 500, 60_000, "me:1")
    assert queue.client.object("encoding", shard.keys.owners) == b"hashtable"

    shard.claim(10_000, 500, 60_000, "me:2", ack=(first.token, first.members))

    assert queue.client.zcard(shard.keys.leased) == 0
    assert queue.client.hkeys(shard.keys.owners) == [b""]  # only the field that keeps it a table
    assert queue.client.object("encoding", shard.keys.owners) == b"hashtable"


def test_a_heartbeat_that_finds_a_dead_consumer_hands_over_its_leases_past_the_owners_marker(queue) -> None:
    shard = queue.shards[0]
    queue.schedule({"7": 1000, "8": 1001})
    claim = shard.claim(10_000, 500, 60_000, "dead:1")
    assert sorted(claim.members) == ["7", "8"]
    shard.heartbeat("dead", 5_000, 10_000)
    beat = shard.heartbeat("alive", 20_000, 30_000)
    assert beat.handed == 2
    assert sorted(shard.claim(20_001, 500, 90_000, "alive:1").members) == ["7", "8"]


def test_a_claim_carries_the_ack_of_members_that_hold_a_newline_too(queue) -> None:
    """The ack goes as one argument, each member ended by a newline; a text key may hold one,
    and is then acked on its own, first, as forget acks it."""
    shard = queue.shards[0]
    odd = "line one\nline two"
    queue.schedule({odd: 1000, "plain": 1001})
    claim = shard.claim(10_000, 500, 60_000, "me:1")
    assert sorted(claim.members) == sorted([odd, "plain"])

    shard.claim(10_000, 500, 60_000, "me:2", ack=(claim.token, claim.members))

    assert queue.client.zcard(shard.keys.leased) == 0
    assert queue.client.zcard(shard.keys.pending) == 0
