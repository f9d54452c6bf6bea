"""The harness's only window on the queue's Redis: the app's public ``TimeoutQueue`` methods.

Keys, shards and scripts are the app's business and may change; every read
and write the harness makes in Redis goes through the few functions below,
so a new key layout is adapted here and nowhere else.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.utils import timezone

from order_timeout import get_order_model
from order_timeout.queue import TimeoutQueue
from order_timeout.queue.keys import CLOSE, REMIND
from order_timeout.timers.members import deadline_score, now_score, order_member, reminder_member
from order_timeout.timers.registry import registry


def _queue(kind: str = CLOSE) -> TimeoutQueue:
    return TimeoutQueue.from_settings(kind)


def _kinds() -> list[str]:
    """Every kind's queue: the order close, the reminders, each timer the shop declared and the
    notices (once the shop declares a handler)."""
    return [CLOSE, REMIND, *(timer.key_space for timer in registry.reported())]


def member_of(pk: Any) -> str:
    """The close member of an order."""
    return order_member(get_order_model(), pk)


def inject_malformed(members: Iterable[str], due: datetime) -> None:
    """Put members that name no order (or name one wrongly) into the pending set, due at ``due``.

    Through ``schedule()``: what a buggy producer, a bad migration or a
    person at redis-cli could leave there.
    """
    _queue().schedule({member: deadline_score(due) for member in members})


def inject_poison(due: datetime, tag: str) -> int:
    """Put into every shard's pending set a member that is not UTF-8, due at ``due``, and one
    scored +inf: what another program writing the same key could leave there. Returns how many."""
    queue = _queue()
    for shard in queue.shards:
        queue.client.zadd(shard.keys.pending, {b"\xff\xfe" + tag.encode(): deadline_score(due),
                                               f"far-{tag}".encode(): "+inf"})
    return 2 * len(queue.shards)


def _on_every_primary() -> dict[str, Any]:
    """The keyword that sends a server command to every primary of a Redis Cluster (redis-py
    sends some, SAVE among them, to one node of its choice); none for a standalone server."""
    client: Any = _queue().client
    return {"target_nodes": client.PRIMARIES} if hasattr(client, "get_primaries") else {}


def nodes_holding_the_queue() -> int:
    """How many Redis servers hold the queue's keys now: 1 on a standalone server; on a Redis
    Cluster, the primaries its shards' hash tags fell on."""
    queue = _queue()
    client: Any = queue.client
    if not hasattr(client, "get_node_from_key"):
        return 1
    return len({client.get_node_from_key(shard.keys.pending).name for shard in queue.shards})


def left_behind(limit: int = 5) -> list[str]:
    """What is still pending or leased, for the report of a run that did not drain: per member,
    its kind, shard, score or lease expiry (ms from now), the claim holding it, and the
    heartbeats the shard holds then (consumer: beat until, ms from now)."""
    now = now_score(timezone.now())
    found: list[str] = []
    for kind in _kinds():
        queue = _queue(kind)
        for shard in queue.shards:
            keys, client = shard.keys, queue.client
            beats = {k.decode(errors="replace"): int(v) - now
                     for k, v in client.zrange(keys.consumers, 0, -1, withscores=True)}
            for name, key in (("pending", keys.pending), ("leased", keys.leased)):
                for member, score in client.zrange(key, 0, limit - 1, withscores=True):
                    owner = client.hget(keys.owners, member)
                    found.append(f"{kind or 'close'} {keys.tag} {name} {member.decode(errors='replace')} "
                                 f"at {int(score) - now:+d} ms, claim {owner!r}, heartbeats {beats}")
    return found[:limit]


def snapshot() -> None:
    """SAVE: the queue's Redis writes all it holds to disk now, and a restart loads that back: the
    copy a replica holds that missed every write after it."""
    _queue().client.save(**_on_every_primary())


def flush() -> None:
    """FLUSHDB of the queue's Redis database: every member of every kind gone at once, the rows
    untouched (what an operator's FLUSHDB, or a cache.clear() on the queue's alias, does)."""
    _queue().client.flushdb(**_on_every_primary())


def mark_every_shard() -> None:
    """A key of the harness's own beside each shard's keys (under its hash tag: on the same server
    of a Redis Cluster). Nothing of the app writes it, so it is gone only once the server lost what
    it held: a consumer's rebuild, which may refill the queue as the server answers, cannot hide
    the loss as a count of queued members could."""
    queue = _queue()
    for shard in queue.shards:
        queue.client.set(f"{shard.keys.tag}:chaos-mark", 1)


def marks_left() -> int:
    """How many shards' servers still hold the harness's mark (``mark_every_shard``)."""
    queue = _queue()
    return sum(int(queue.client.exists(f"{shard.keys.tag}:chaos-mark")) for shard in queue.shards)


def quarantined() -> int:
    """Members in the quarantine of every shard and kind."""
    now = now_score(timezone.now())
    return sum(_queue(kind).stats(now).quarantined for kind in _kinds())


def queued(besides: Iterable[str] = ()) -> int:
    """Members pending or leased, of every kind (closes, reminders, the shop's timers), in every
    shard, other than ``besides`` (close members that rightly stay: orders held by a payment
    still in flight)."""
    now = now_score(timezone.now())
    count = 0
    for kind in _kinds():
        stats = _queue(kind).stats(now)
        count += stats.pending + stats.leased
    return count - len(present_among(besides))


def leased_among(members: Iterable[str]) -> list[str]:
    """The members that are under lease now."""
    return [member for member, where in _queue().positions(list(members)).items()
            if where.lease_ms is not None]


def leased_reminders(reminders: Iterable[tuple[Any, int]]) -> list[tuple[Any, int]]:
    """The reminders, ``(pk, lead_ms)``, whose members are under lease now."""
    model = get_order_model()
    by_member = {reminder_member(model, pk, lead): (pk, lead) for pk, lead in reminders}
    if not by_member:
        return []
    return [by_member[member] for member, where in _queue(REMIND).positions(list(by_member)).items()
            if where.lease_ms is not None]


def present_among(members: Iterable[str], looks: int = 3) -> list[str]:
    """The members that are pending or leased now.

    A member reported missing is looked up again (``looks`` times in all, 50 ms
    apart): ``positions()`` reads the pending set and then the lease set, not
    atomically, so a member a consumer moves from its lease back to pending
    between the two reads (a held order put back for its next look) is seen
    in neither. One that Redis lost stays missing at every look.
    """
    members = list(members)
    missing = set(members)
    for look in range(looks):
        if not missing:
            break
        if look:
            time.sleep(0.05)
        missing = set(_queue().missing(list(missing)))
    return [member for member in members if member not in missing]


def lose_alone(pks: Iterable[Any]) -> None:
    """Take these orders' members off the queue, as if their saves' writes never reached Redis."""
    from order_timeout import unschedule

    unschedule(list(get_order_model().objects.filter(pk__in=list(pks))))


def scan_runner() -> int | None:
    """The pid of the process running the fleet's scan now (None: none runs, or not a local one)."""
    from order_timeout.reporting.housekeeping import last_runs

    run = last_runs(_queue())["scan"]
    if run is None or run.ended is not None:
        return None
    pid = run.where.rsplit(":", 1)[-1]
    return int(pid) if pid.isdigit() else None
