"""The Redis side of the queue: schedule, unschedule, claim, ack, reschedule.

Speaks only Redis: it takes members and scores (see ``codec``) and knows
nothing of Django models. Every Redis error leaves as ``QueueUnavailable``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from importlib import resources
from typing import Any

from redis import Redis
from redis.commands.core import Script
from redis.exceptions import RedisError

from .exceptions import QueueUnavailable
from .keys import QueueKeys

SCRIPT_NAMES = ("claim", "reschedule")


def load_script_source(name: str) -> str:
    return resources.files("order_timeout").joinpath("lua", f"{name}.lua").read_text("utf-8")


@contextmanager
def _redis_errors(action: str) -> Iterator[None]:
    try:
        yield
    except RedisError as exc:
        raise QueueUnavailable(f"Redis failed to {action}: {exc}") from exc


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


@dataclass(frozen=True)
class Claim:
    """One claim: the members now leased to the caller, and the next deadline."""

    members: list[str]
    next_score: int | None = field(default=None)


class TimeoutQueue:
    """One delay queue in one Redis: a pending set and a lease set."""

    def __init__(self, client: Redis, key_prefix: str) -> None:
        self.client = client
        self.keys = QueueKeys(key_prefix)

    @classmethod
    def from_settings(cls) -> TimeoutQueue:
        from django_redis import get_redis_connection

        from .conf import settings

        return cls(get_redis_connection(settings.REDIS_ALIAS), settings.KEY_PREFIX)

    @cached_property
    def scripts(self) -> dict[str, Script]:
        """Scripts by name, registered once per client (EVALSHA, loaded on first use)."""
        return {name: self.client.register_script(load_script_source(name)) for name in SCRIPT_NAMES}

    def schedule(self, deadlines: Mapping[str, int]) -> None:
        """Add members, or move them to a new deadline (score, in ms)."""
        if not deadlines:
            return
        with _redis_errors("schedule"):
            self.client.zadd(self.keys.pending, dict(deadlines))

    def unschedule(self, members: Iterable[str]) -> None:
        """Forget members wherever they are: pending or leased."""
        members = list(members)
        if not members:
            return
        with _redis_errors("unschedule"):
            pipe = self.client.pipeline(transaction=True)
            pipe.zrem(self.keys.pending, *members)
            pipe.zrem(self.keys.leased, *members)
            pipe.execute()

    def claim(self, now_ms: int, limit: int, lease_ms: int) -> Claim:
        """Lease up to ``limit`` due members (and expired leases) until now + lease."""
        with _redis_errors("claim"):
            reply = self.scripts["claim"](
                keys=[self.keys.pending, self.keys.leased],
                args=[now_ms, limit, now_ms + lease_ms],
            )
        next_score = _text(reply[0])
        return Claim(
            members=[_text(member) for member in reply[1:]],
            next_score=int(float(next_score)) if next_score else None,
        )

    def ack(self, members: Iterable[str]) -> None:
        """Done with these members: drop their leases."""
        members = list(members)
        if not members:
            return
        with _redis_errors("ack"):
            self.client.zrem(self.keys.leased, *members)

    def reschedule(self, deadlines: Mapping[str, int]) -> int:
        """Move leased members back to pending at new deadlines; returns how many moved."""
        if not deadlines:
            return 0
        args: list[Any] = []
        for member, score in deadlines.items():
            args += [score, member]
        with _redis_errors("reschedule"):
            return int(self.scripts["reschedule"](keys=[self.keys.pending, self.keys.leased], args=args))

    def score_of(self, member: str) -> int | None:
        """The pending deadline of a member, or None."""
        with _redis_errors("read a score"):
            score = self.client.zscore(self.keys.pending, member)
        return None if score is None else int(score)

    def leased_members(self) -> list[str]:
        with _redis_errors("read the lease set"):
            return [_text(m) for m in self.client.zrange(self.keys.leased, 0, -1)]

    def pending_count(self) -> int:
        with _redis_errors("count pending members"):
            return int(self.client.zcard(self.keys.pending))
