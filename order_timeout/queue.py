"""The Redis side of the queue: schedule, forget, claim, ack, reschedule, retry, renew.

Speaks only Redis: it takes members and scores (see ``codec``) and knows
nothing of Django models. Every step is one script (or one plain command), so
nothing needs MULTI. Every Redis error leaves as ``QueueUnavailable``.

A claim gets a token; ack, retry, reschedule and renew show it, and a member
whose lease another claim took over meanwhile is not theirs to move.
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
from redis.backoff import NoBackoff
from redis.commands.core import Script
from redis.exceptions import RedisError
from redis.retry import Retry as RedisRetry

from .exceptions import QueueUnavailable
from .keys import QueueKeys

logger = logging.getLogger("order_timeout")

SCRIPT_NAMES = ("schedule", "claim", "forget", "reschedule", "retry", "renew", "renew_lock",
                "release_lock")


@functools.cache
def load_script_source(name: str) -> str:
    """A script's text, read once per process (every create runs the schedule script)."""
    return resources.files("order_timeout").joinpath("lua", f"{name}.lua").read_text("utf-8")


@contextmanager
def _redis_errors(action: str) -> Iterator[None]:
    try:
        yield
    except RedisError as exc:
        raise QueueUnavailable(f"Redis failed to {action}: {type(exc).__name__}: {exc}") from exc


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _pairs(deadlines: Mapping[str, int]) -> list[Any]:
    """score1, member1, score2, member2, ... as the scripts take them."""
    args: list[Any] = []
    for member, score in deadlines.items():
        args += [score, member]
    return args


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
    # Members whose row another transaction kept locked, and since when the oldest has been.
    busy: int = 0
    oldest_busy_ms: int | None = None
    # Members taken over from a consumer that died, froze or hung with them.
    taken_over: int = 0


@dataclass(frozen=True)
class Claim:
    """One claim: the members now leased to the caller, its token, and the next deadline.

    ``takeovers`` is how often the single member of this claim was taken over
    from a consumer that died with it (0 for an ordinary batch).
    """

    members: list[str]
    next_score: int | None = field(default=None)
    token: str = ""
    takeovers: int = 0


@dataclass(frozen=True)
class Position:
    """Where a member is in Redis: its pending score and its lease expiry (ms), if any."""

    pending_ms: int | None
    lease_ms: int | None

    @property
    def missing(self) -> bool:
        return self.pending_ms is None and self.lease_ms is None


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


def bounded_client(client: Redis, timeout: float) -> Redis:
    """A client on the same server whose every round trip gives up after ``timeout`` seconds.

    For work done inside a web request (scheduling on commit): a Redis that
    hangs must cost the request a bounded time, not the alias's timeouts
    (often none) times redis-py's retries.
    """
    pool = client.connection_pool
    kwargs = {**pool.connection_kwargs, "socket_timeout": timeout, "socket_connect_timeout": timeout,
              "retry": RedisRetry(NoBackoff(), 0), "retry_on_timeout": False}
    return Redis(connection_pool=type(pool)(connection_class=pool.connection_class, **kwargs))


class TimeoutQueue:
    """One delay queue in one Redis: a pending set, a lease set and their bookkeeping."""

    def __init__(self, client: Redis, key_prefix: str) -> None:
        self.client = client
        self.keys = QueueKeys(key_prefix)

    @classmethod
    def from_settings(cls) -> TimeoutQueue:
        from django_redis import get_redis_connection

        from .conf import settings

        return cls(get_redis_connection(settings.REDIS_ALIAS), settings.KEY_PREFIX)

    @classmethod
    def for_saves(cls) -> TimeoutQueue:
        """The queue as seen from a request: every round trip bounded by ``SCHEDULE_TIMEOUT``."""
        from django_redis import get_redis_connection

        from .conf import settings

        client = get_redis_connection(settings.REDIS_ALIAS)
        key = (id(client), settings.SCHEDULE_TIMEOUT)
        bounded = _bounded_clients.get(key)
        if bounded is None:
            bounded = _bounded_clients[key] = bounded_client(client, settings.SCHEDULE_TIMEOUT)
        return cls(bounded, settings.KEY_PREFIX)

    @cached_property
    def scripts(self) -> dict[str, Script]:
        """Scripts by name, registered once per client (EVALSHA, loaded on first use)."""
        return {name: self.client.register_script(load_script_source(name)) for name in SCRIPT_NAMES}

    @property
    def _forget_keys(self) -> list[str]:
        keys = self.keys
        return [keys.pending, keys.leased, keys.owners, keys.attempts, keys.first_failure,
                keys.takeovers, keys.busy]

    # -- from the shop's side ------------------------------------------------

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
            return int(self.scripts["schedule"](keys=[self.keys.pending, self.keys.wake],
                                                args=_pairs(deadlines)))

    def unschedule(self, members: Iterable[str]) -> None:
        """Forget members wherever they are: pending, leased, retry state (the order was paid)."""
        self._forget("", members)

    def sync(self, deadlines: Mapping[str, int], gone: Iterable[str]) -> None:
        """Schedule ``deadlines`` and forget ``gone``."""
        self.schedule(deadlines)
        self.unschedule(gone)

    def _forget(self, token: str, members: Iterable[str]) -> int:
        members = list(members)
        if not members:
            return 0
        with _redis_errors("forget members"):
            return int(self.scripts["forget"](keys=self._forget_keys, args=[token, *members]))

    # -- from the consumer's side ----------------------------------------------

    def claim(self, due_ms: int, limit: int, lease_until_ms: int, token: str) -> Claim:
        """Lease up to ``limit`` members due by ``due_ms`` until ``lease_until_ms``, under ``token``.

        An expired lease is taken over alone (see ``lua/claim.lua``).
        """
        if limit < 1:
            raise ValueError(f"a claim takes at least one member, not {limit}")
        keys = self.keys
        with _redis_errors("claim"):
            reply = self.scripts["claim"](
                keys=[keys.pending, keys.leased, keys.owners, keys.takeovers],
                args=[due_ms, limit, lease_until_ms, token],
            )
        next_score = _text(reply[0])
        return Claim(
            members=[_text(member) for member in reply[2:]],
            next_score=int(float(next_score)) if next_score else None,
            token=token,
            takeovers=int(reply[1]),
        )

    def ack(self, token: str, members: Iterable[str]) -> int:
        """Done with these members for good (closed, paid, gone): forget them.

        Their pending entries go in any case; their leases and state only if
        ``token`` still holds them. Returns how many leases were released.
        """
        return self._forget(token, members)

    def retry(self, token: str, members: Iterable[str], now_ms: int,
              delays_ms: list[int]) -> list[Retry]:
        """Count a failed attempt for each member this claim holds and schedule its next try."""
        members = list(members)
        if not members:
            return []
        keys = self.keys
        with _redis_errors("schedule retries"):
            reply = self.scripts["retry"](
                keys=[keys.pending, keys.leased, keys.owners, keys.attempts, keys.first_failure],
                args=[token, now_ms, len(delays_ms), *delays_ms, *members],
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

    def reschedule(self, token: str, deadlines: Mapping[str, int], *,
                   busy_since_ms: int | None = None) -> int:
        """Move members this claim holds back to pending at new deadlines; returns how many moved.

        ``busy_since_ms``: their rows were locked by another transaction (they
        are counted as busy from the first time that happened).
        """
        if not deadlines:
            return 0
        keys = self.keys
        with _redis_errors("reschedule"):
            return int(self.scripts["reschedule"](
                keys=[keys.pending, keys.leased, keys.owners, keys.busy],
                args=[token, "" if busy_since_ms is None else busy_since_ms, *_pairs(deadlines)],
            ))

    def renew(self, token: str, members: Iterable[str], until_ms: int) -> int:
        """Move the leases this claim holds to ``until_ms`` (in the past: hand them over now)."""
        members = list(members)
        if not members:
            return 0
        with _redis_errors("renew leases"):
            return int(self.scripts["renew"](keys=[self.keys.leased, self.keys.owners],
                                             args=[token, until_ms, *members]))

    # -- looking ------------------------------------------------------------------

    def positions(self, members: Iterable[str]) -> dict[str, Position]:
        """Each member's pending score and lease expiry, in one round trip."""
        members = list(members)
        if not members:
            return {}
        with _redis_errors("look members up"):
            pipe = self.client.pipeline(transaction=False)
            pipe.zmscore(self.keys.pending, members)
            pipe.zmscore(self.keys.leased, members)
            pending, leased = pipe.execute()
        return {
            member: Position(None if p is None else int(p), None if lease is None else int(lease))
            for member, p, lease in zip(members, pending, leased, strict=True)
        }

    def missing(self, members: Iterable[str]) -> list[str]:
        """The members that are neither pending nor leased."""
        return [member for member, where in self.positions(members).items() if where.missing]

    def in_backoff(self, members: Iterable[str]) -> set[str]:
        """The members with a failed close behind them (retry state kept)."""
        members = list(members)
        if not members:
            return set()
        with _redis_errors("read retry state"):
            counts = self.client.hmget(self.keys.attempts, members)
        return {member for member, count in zip(members, counts, strict=True) if count is not None}

    def stats(self, now_ms: int) -> QueueStats:
        """Sizes of the queue, in one round trip."""
        keys = self.keys
        with _redis_errors("read queue statistics"):
            pipe = self.client.pipeline(transaction=False)
            pipe.zcard(keys.pending)
            pipe.zcount(keys.pending, "-inf", now_ms)
            pipe.zcard(keys.leased)
            pipe.zcount(keys.leased, "-inf", now_ms)
            pipe.zrange(keys.pending, 0, 0, withscores=True)
            pipe.zrange(keys.leased, 0, 0, withscores=True)
            pipe.zcard(keys.busy)
            pipe.zrange(keys.busy, 0, 0, withscores=True)
            pipe.hlen(keys.takeovers)
            (pending, due, leased, expired, first_pending, first_lease, busy, first_busy,
             taken_over) = pipe.execute()
        waiting = [int(first[0][1]) for first in (first_pending, first_lease)
                   if first and first[0][1] <= now_ms]
        return QueueStats(pending=pending, due=due, leased=leased, expired_leases=expired,
                          oldest_due_ms=min(waiting) if waiting else None, busy=busy,
                          oldest_busy_ms=int(first_busy[0][1]) if first_busy else None,
                          taken_over=taken_over)

    # -- the compensation scan's bookkeeping ------------------------------------

    def acquire_lock(self, token: str, ttl_ms: int) -> bool:
        with _redis_errors("take the compensation lock"):
            return bool(self.client.set(self.keys.compensation_lock, token, nx=True, px=ttl_ms))

    def renew_lock(self, token: str, ttl_ms: int) -> bool:
        with _redis_errors("renew the compensation lock"):
            return bool(self.scripts["renew_lock"](keys=[self.keys.compensation_lock], args=[token, ttl_ms]))

    def release_lock(self, token: str) -> bool:
        with _redis_errors("release the compensation lock"):
            return bool(self.scripts["release_lock"](keys=[self.keys.compensation_lock], args=[token]))

    def scans_started(self, members: Iterable[str]) -> dict[str, int]:
        """How many scans started closing each member and never finished (died)."""
        members = list(members)
        if not members:
            return {}
        with _redis_errors("read what the scan started"):
            counts = self.client.hmget(self.keys.scanning, members)
        return {member: int(count or 0) for member, count in zip(members, counts, strict=True)}

    def start_scanning(self, members: Iterable[str]) -> None:
        """Note that the scan is about to close these (cleared by ``done_scanning``)."""
        members = list(members)
        if members:
            with _redis_errors("mark members the scan closes"):
                pipe = self.client.pipeline(transaction=False)
                for member in members:
                    pipe.hincrby(self.keys.scanning, member, 1)
                pipe.execute()

    def done_scanning(self, members: Iterable[str]) -> None:
        members = list(members)
        if members:
            with _redis_errors("clear members the scan closed"):
                self.client.hdel(self.keys.scanning, *members)

    def listen_for_wakeups(self, on_wake: Callable[[], None]) -> WakeListener:
        """Call ``on_wake`` (in a thread) whenever a new earliest deadline is scheduled."""
        with _redis_errors("subscribe to wake-ups"):
            return WakeListener(self.client, self.keys.wake, on_wake)

    # -- for tests and diagnostics -------------------------------------------------

    def score_of(self, member: str) -> int | None:
        """The pending deadline of a member, or None."""
        with _redis_errors("read a score"):
            score = self.client.zscore(self.keys.pending, member)
        return None if score is None else int(score)

    def leased_members(self) -> list[str]:
        """Every member under lease now."""
        with _redis_errors("read the lease set"):
            return [_text(m) for m in self.client.zrange(self.keys.leased, 0, -1)]

    def pending_count(self) -> int:
        """How many members wait in the pending set."""
        with _redis_errors("count pending members"):
            return int(self.client.zcard(self.keys.pending))


# One bounded client per (django-redis client, timeout), shared by every request of a process.
_bounded_clients: dict[tuple[int, float], Redis] = {}
