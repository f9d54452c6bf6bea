"""Changing SHARDS loses no member: deadlines, leases run out and retry state all move."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command

from order_timeout.queue import TimeoutQueue
from order_timeout.timers.members import deadline_score, now_score

from .conftest import both_redis
from .helpers import leased_members, pending_count, score_of

pytestmark = pytest.mark.django_db(transaction=True)


def with_shards(settings, shards):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "SHARDS": shards}
    return TimeoutQueue.from_settings()


@both_redis
@pytest.mark.parametrize("old, new", [(1, 16), (16, 1), (16, 32)])
def test_reshard_moves_every_member_with_its_deadline_and_retry_state(redis_backend, settings, clock,
                                                                      make_order, old, new):
    before = with_shards(settings, old)
    orders = [make_order(in_seconds=60 + i) for i in range(60)]
    retried = str(orders[1].pk)
    before.client.hset(before.shard_for(retried).keys.attempts, retried, 2)  # in retry backoff
    # The earliest deadline, claimed by a consumer that died: its lease has run out.
    dead_consumer = str(orders[0].pk)
    before.shard_for(dead_consumer).claim(deadline_score(orders[0].expires_at), 1,
                                          now_score(clock()) - 1, "gone")

    after = with_shards(settings, new)
    out = io.StringIO()
    call_command("order_timeout_reshard", "--from", str(old), stdout=out)

    assert f"Reshard {old} -> {new} shards: moved" in out.getvalue()
    assert all(score_of(after, str(o.pk)) == deadline_score(o.expires_at)
               for o in orders if str(o.pk) != dead_consumer)
    # Its lease ran out: moved as due now, or still in place if its shard's keys did not change.
    assert score_of(after, dead_consumer) is not None or leased_members(after) == [dead_consumer]
    assert pending_count(after) + len(leased_members(after)) == 60
    assert int(after.client.hget(after.shard_for(retried).keys.attempts, retried)) == 2
    old_keys = {key for shard in before.shards for key in shard.keys.all()}
    new_keys = {key for shard in after.shards for key in shard.keys.all()}
    assert not any(after.client.exists(key) for key in old_keys - new_keys)


def test_reshard_waits_for_live_leases_and_says_so_when_they_outlive_the_wait(settings, make_order,
                                                                            clock):
    before = with_shards(settings, 1)
    order = make_order(in_seconds=-1)
    before.shards[0].claim(now_score(clock()), 1, now_score(clock()) + 60_000, "still-running")
    with_shards(settings, 4)

    with pytest.raises(CommandError, match="1 members are still leased"):
        call_command("order_timeout_reshard", "--from", "1", "--wait", "0.1", stdout=io.StringIO())
    assert str(order.pk) in leased_members(before)


@pytest.mark.parametrize("args, message", [
    (["--from", "0"], "--from must be from 1"), (["--from", "1"], "already: nothing to move"),
])
def test_bad_reshard_options_are_command_errors(args, message):
    with pytest.raises(CommandError, match=message):
        call_command("order_timeout_reshard", *args, stdout=io.StringIO())
