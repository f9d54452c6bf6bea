"""The Redis side of the queue: schedule, unschedule, claim, ack, reschedule.

Speaks only Redis: it takes members and scores (see ``codec``) and knows
nothing of Django models. Every Redis error leaves as ``QueueUnavailable``.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from importlib import resources
from typing import Any

from redis import Redis
from redis.commands.core import Script
from redis.exceptions import RedisError

from .exceptions import QueueUnavailable

logger = logging.getLogger("order_timeout")
from .keys import QueueKeys

SCRIPT_NAMES = ("schedule", "claim", "reschedule", "retry", "renew_lock", "release_lock")


@functools.cache
def load_script_source(name: str) -> str:
    """A script's text, read once per process (every create runs the schedule script)."""
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
class Retry:
    """A failed member after ``retry()``: its attempts so far and when it is tried again."""

    member: str
    attempts: int
    first_failure_ms: int
    # None: no delay left, the caller must dead-letter and then ack it.
    retry_at_ms: int | None


@dataclass(frozen=True)
class QueueStats:
    pending: int
    due: int
    leased: int
    # Leases that ran out: their consumer died, they wait for the next claim.
    expired_leases: int
    # Score of the earliest due member (or expired lease) still waiting to be claimed, or None.
    oldest_due_ms: int | None


@dataclass(frozen=True)
class Claim:
    """One claim: the members now leased to the caller, and the next deadline."""

    members: list[str]
    next_score: int | None = field(default=None)


class WakeListener:
    """A pub/sub subscription in a thread of its own; redis-py re-subscribes after a reconnect."""

    def __init__(self, client: Redis, channel: str, on_wake: Callable[[], None]) -> None:
        self.pubsub = client.pubsub(ignore_subscribe_messages=True)
        self.pubsub.subscribe(**{channel: lambda message: on_wake()})
        self.thread = self.pubsub.run_in_thread(sleep_time=1.0, daemon=True,
                                                exception_handler=self._lost)

    @staticmethod
    def _lost(error: BaseException, pubsub: Any, thread: Any) -> None:
        # The consumer still wakes every MAX_WAIT; try again in a second.
        logger.warning("Lost the wake-up subscription (%s); retrying.", error)
        time.sleep(1.0)

    def close(self) -> None:
        self.thread.stop()
        self.thread.join(5)
        self.pubsub.close()


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

    def schedule(self, deadlines: Mapping[str, int], *, only_missing: bool = False) -> int:
        """Add members, or move them to a new deadline (score, in ms); returns how many were new.

        ``only_missing`` adds members absent from the pending set and leaves
        the others (a pending retry keeps its backoff).
        """
        if not deadlines:
            return 0
        with _redis_errors("schedule"):
            if only_missing:
                return int(self.client.zadd(self.keys.pending, dict(deadlines), nx=True))
            return int(self._schedule_script(deadlines))

    def _schedule_script(self, deadlines: Mapping[str, int], client: Any = None) -> Any:
        args: list[Any] = []
        for member, score in deadlines.items():
            args += [score, member]
        return self.scripts["schedule"](keys=[self.keys.pending, self.keys.wake], args=args,
                                        client=client)

    def unschedule(self, members: Iterable[str]) -> None:
        """Forget members wherever they are: pending, leased, retry state."""
        self.sync({}, members)

    def sync(self, deadlines: Mapping[str, int], gone: Iterable[str]) -> None:
        """Schedule ``deadlines`` and forget ``gone``, in one atomic round trip."""
        gone = list(gone)
        if not deadlines and not gone:
            return
        if not gone:
            # The common case, an order created or extended: one command, no MULTI.
            self.schedule(deadlines)
            return
        with _redis_errors("update the queue"):
            pipe = self.client.pipeline(transaction=True)
            if deadlines:
                self._schedule_script(deadlines, client=pipe)
            if gone:
                pipe.zrem(self.keys.pending, *gone)
                self._forget_lease(pipe, gone)
            pipe.execute()

    def _forget_lease(self, pipe: Any, members: list[str]) -> None:
        pipe.zrem(self.keys.leased, *members)
        pipe.hdel(self.keys.attempts, *members)
        pipe.hdel(self.keys.first_failure, *members)

    def claim(self, due_ms: int, limit: int, lease_until_ms: int) -> Claim:
        """Lease up to ``limit`` members due by ``due_ms`` (and expired leases) until ``lease_until_ms``."""
        if limit < 1:
            raise ValueError(f"a claim takes at least one member, not {limit}")
        with _redis_errors("claim"):
            reply = self.scripts["claim"](
                keys=[self.keys.pending, self.keys.leased],
                args=[due_ms, limit, lease_until_ms],
            )
        next_score = _text(reply[0])
        return Claim(
            members=[_text(member) for member in reply[1:]],
            next_score=int(float(next_score)) if next_score else None,
        )

    def ack(self, members: Iterable[str]) -> None:
        """Done with these members for good (closed, paid, gone): forget them everywhere.

        Pending too, not only the lease: another consumer that found the row
        locked while this one closed it may have put the member back already.
        """
        self.unschedule(members)

    def retry(self, members: Iterable[str], now_ms: int, delays_ms: list[int]) -> list[Retry]:
        """Count a failed attempt for each leased member and schedule its next try."""
        members = list(members)
        if not members:
            return []
        keys = [self.keys.pending, self.keys.leased, self.keys.attempts, self.keys.first_failure]
        with _redis_errors("schedule retries"):
            reply = self.scripts["retry"](
                keys=keys, args=[now_ms, len(delays_ms), *delays_ms, *members]
            )
        return [
            Retry(
                member=_text(reply[i]),
                attempts=int(reply[i + 1]),
                first_failure_ms=int(_text(reply[i + 2])),
                retry_at_ms=int(_text(reply[i + 3])) if _text(reply[i + 3]) else None,
            )
            for i in range(0, len(reply), 4)
        ]

    def reschedule(self, deadlines: Mapping[str, int]) -> int:
        """Move leased members back to pending at new deadlines; returns how many moved."""
        if not deadlines:
            return 0
        args: list[Any] = []
        for member, score in deadlines.items():
            args += [score, member]
        with _redis_errors("reschedule"):
            return int(self.scripts["reschedule"](keys=[self.keys.pending, self.keys.leased], args=args))

    def missing(self, members: Iterable[str]) -> list[str]:
        """The members that are neither pending nor leased."""
        members = list(members)
        if not members:
            return []
        with _redis_errors("look members up"):
            pipe = self.client.pipeline(transaction=False)
            pipe.zmscore(self.keys.pending, members)
            pipe.zmscore(self.keys.leased, members)
            pending, leased = pipe.execute()
        return [m for m, p, l in zip(members, pending, leased, strict=True) if p is None and l is None]

    def stats(self, now_ms: int) -> QueueStats:
        """Sizes of the queue, in one round trip."""
        with _redis_errors("read queue statistics"):
            pipe = self.client.pipeline(transaction=True)
            pipe.zcard(self.keys.pending)
            pipe.zcount(self.keys.pending, "-inf", now_ms)
            pipe.zcard(self.keys.leased)
            pipe.zcount(self.keys.leased, "-inf", now_ms)
            pipe.zrange(self.keys.pending, 0, 0, withscores=True)
            pipe.zrange(self.keys.leased, 0, 0, withscores=True)
            pending, due, leased, expired, first_pending, first_lease = pipe.execute()
        waiting = [int(first[0][1]) for first in (first_pending, first_lease)
                   if first and first[0][1] <= now_ms]
        return QueueStats(pending=pending, due=due, leased=leased, expired_leases=expired,
                          oldest_due_ms=min(waiting) if waiting else None)

    # -- a lock for jobs that must not overlap (the compensation scan) ----

    def acquire_lock(self, token: str, ttl_ms: int) -> bool:
        with _redis_errors("take the compensation lock"):
            return bool(self.client.set(self.keys.compensation_lock, token, nx=True, px=ttl_ms))

    def renew_lock(self, token: str, ttl_ms: int) -> bool:
        with _redis_errors("renew the compensation lock"):
            return bool(self.scripts["renew_lock"](keys=[self.keys.compensation_lock], args=[token, ttl_ms]))

    def release_lock(self, token: str) -> bool:
        with _redis_errors("release the compensation lock"):
            return bool(self.scripts["release_lock"](keys=[self.keys.compensation_lock], args=[token]))

    def listen_for_wakeups(self, on_wake: Callable[[], None]) -> WakeListener:
        """Call ``on_wake`` (in a thread) whenever a new earliest deadline is scheduled."""
        with _redis_errors("subscribe to wake-ups"):
            return WakeListener(self.client, self.keys.wake, on_wake)

    def score_of(self, member: str) -> int | None:
        """The pending deadline of a member, or None."""
        with _redis_errors("read a score"):
            score = self.client.zscore(self.keys.pending, member)
        return None if score is None else int(score)

    def leased_members(self) -> list[str]:
        """Every member under lease now (for tests and diagnostics)."""
        with _redis_errors("read the lease set"):
            return [_text(m) for m in self.client.zrange(self.keys.leased, 0, -1)]

    def pending_count(self) -> int:
        """How many members wait in the pending set."""
        with _redis_errors("count pending members"):
            return int(self.client.zcard(self.keys.pending))
