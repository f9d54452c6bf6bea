"""The harness's only window on the queue's Redis: the app's public ``TimeoutQueue`` methods.

Keys, shards and scripts are the app's business and may change; every read
and write the harness makes in Redis goes through the few functions below,
so a new key layout is adapted here and nowhere else.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from django.utils import timezone

from order_timeout.codec import deadline_score, now_score
from order_timeout.queue import TimeoutQueue


def _queue() -> TimeoutQueue:
    return TimeoutQueue.from_settings()


def inject_malformed(members: Iterable[str], due: datetime) -> None:
    """Put members that name no order (or name one wrongly) into the pending set, due at ``due``.

    Through ``schedule()``: what a buggy producer, a bad migration or a
    person at redis-cli could leave there.
    """
    _queue().schedule({member: deadline_score(due) for member in members})


def queued() -> int:
    """Members pending or leased, in every shard."""
    stats = _queue().stats(now_score(timezone.now()))
    return stats.pending + stats.leased


def leased_among(members: Iterable[str]) -> list[str]:
    """The members that are under lease now."""
    return [member for member, where in _queue().positions(list(members)).items()
            if where.lease_ms is not None]


def present_among(members: Iterable[str]) -> list[str]:
    """The members that are pending or leased now."""
    members = list(members)
    missing = set(_queue().missing(members)) if members else set()
    return [member for member in members if member not in missing]
