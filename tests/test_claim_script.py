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
    queue.schedule({str(pk): 1000 + pk for pk in range(1, 7)})
    first = shard.claim(10_000, 3, 60_000, "me:1")
    assert queue.client.object("encoding", shard.keys.owners) == b"hashtable"

    second = shard.claim(10_000, 3, 60_000, "me:2", ack=(first.token, first.members))

    assert sorted(queue.client.zrange(shard.keys.leased, 0, -1)) == sorted(m.encode() for m in second.members)
    assert sorted(queue.client.hkeys(shard.keys.owners)) == sorted([b"", *(m.encode() for m in second.members)])
    assert queue.client.object("encoding", shard.keys.owners) == b"hashtable"
    # With the shard's last lease acked, no key is left behind.
    shard.claim(10_000, 3, 60_000, "me:3", ack=(second.token, second.members))
    assert not queue.client.exists(shard.keys.owners, shard.keys.leased)


def test_a_claim_acks_its_own_late_batch_before_it_takes_expired_leases_over(queue) -> None:
    """The batch a consumer committed may have outlived its lease before the next claim: that
    claim acks it first, so it does not take its own closed orders over again."""
    shard = queue.shards[0]
    queue.schedule({"7": 1000, "8": 1001})
    batch = shard.claim(10_000, 500, 20_000, "me:1")

    later = shard.claim(30_000, 500, 90_000, "me:2", ack=(batch.token, batch.members))

    assert (later.members, later.takeovers) == ([], 0)
    assert queue.client.zcard(shard.keys.leased) == 0
    assert queue.client.hlen(shard.keys.takeovers) == 0


def test_an_empty_member_leased_over_the_owners_field_is_quarantined_all_the_same(queue) -> None:
    """An empty member (another program's write) is leased onto the owners hash's own field;
    another claim's lease may set that field back before the consumer quarantines the member."""
    shard = queue.shards[0]
    queue.client.zadd(shard.keys.pending, {"": 1000, "7": 1001})
    claim = shard.claim(10_000, 500, 60_000, "me:1")
    assert claim.members == ["", "7"]
    queue.schedule({"8": 1002})
    shard.claim(10_000, 500, 60_000, "other:1")

    assert shard.quarantine(claim.token, [""], 10_000, sweep=False) == 1

    assert queue.client.zrange(shard.keys.quarantine, 0, -1) == [b""]
    assert queue.client.zscore(shard.keys.leased, "") is None
