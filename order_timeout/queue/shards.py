"""The Redis side of the queue: schedule, forget, claim, ack, reschedule, retry, renew, quarantine.

Speaks only Redis: it takes members and scores (see ``timers.members``) and
knows nothing of Django models. A queue is ``SHARDS`` shards (``Shard``), each
with its own hash tag, so a Redis Cluster spreads them over its masters; a
member always lives in the same shard. Every step is one script (or one plain
command) on one shard, never MULTI, and at most ``SLICE`` members per script
call, so no call holds Redis for long. Every Redis error, Cluster errors
included, leaves as ``QueueUnavailable``.

A claim gets a token; ack, retry, reschedule and renew show it, and a member
whose lease another claim took over meanwhile is not theirs to move.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, NamedTuple, TypeVar

from redis.commands.core import Script

from ..exceptions import QueueUnavailable
from .errors import redis_errors
from .housekeeping import Housekeeping
from .keys import CLOSE, GlobalKeys, QueueKeys, kind_name, shard_of
from .scripts import SCRIPT_NAMES, load_script_source

logger = logging.getLogger("order_timeout")

# Most members one script call carries, so no call holds Redis for long: a claimed
# batch of up to 500 is acked, retried or renewed in one call (BATCH_SIZE's default is 200).
SLICE = 500
# Most members one schedule call adds: each is a ZADD into a sorted set that may hold
# millions. On the benchmark machine 500 into a sorted set of a million took 3.5 ms
# (median) and sometimes over 5; 200 took 1.4 ms, but its slowest of 5,000 calls once
# reached 5.8 ms; 100 keeps even a slow call well under 5 ms (docs/benchmarks.md).
SCHEDULE_SLICE = 100

T = TypeVar("T")

# The latest deadline a score can stand for: 9999-12-31 23:59:59.999999 UTC (a datetime holds
# no later one) in ms, rounded up. A score past it (+inf) was written by something else: its
# member is quarantined, never waited for.
MAX_SCORE = 253_402_300_800_000
# A lane's next score when it holds a score no deadline can have: "look now", so the claim
# that comes next quarantines it.
LOOK_NOW = 0

# Why a member went back to pending (``reschedule``'s mark), kept with its first time.
BUSY = "busy"
HELD = "held"


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _score(value: bytes | str | float | None) -> int | None:
    """A score as whole ms, or None when there is none or it is no deadline (+inf, past year 9999)."""
    if value is None or value == b"" or value == "":
        return None
    number = float(value)
    if not math.isfinite(number) or number > MAX_SCORE:
        return None
    return int(number)


def _is_deadline(value: bytes | str | float) -> bool:
    """Whether a score Redis holds can be a deadline (finite, and no later than year 9999)."""
    return _score(value) is not None


def escaped(members: Iterable[bytes | str]) -> str:
    """Members for a log line: as Redis holds them, undecodable bytes escaped."""
    return ", ".join(repr(member) for member in members)


def _lines(items: Sequence[str]) -> str | None:
    """``items`` as one argument, each ended by a newline ("" for none); None when one holds a
    newline itself (a text key may): then it cannot be carried so, and goes on its own."""
    lines = "\n".join(items) + "\n" if items else ""
    return lines if lines.count("\n") == len(items) else None


def _pairs(deadlines: Mapping[str, int]) -> list[Any]:
    """score1, member1, score2, member2, ... as the scripts take them."""
    args: list[Any] = []
    for member, score in deadlines.items():
        args += [score, member]
    return args


def _slices(items: Sequence[T], size: int = SLICE) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


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
    # Members held by a payment in flight (HOLD_CONDITION), and since when the oldest has been.
    held: int = 0
    oldest_held_ms: int | None = None
    # Members moved out of the queue because they name no order (undecodable, malformed,
    # scored past any deadline): for a person to look at.
    quarantined: int = 0

    @staticmethod
    def add(parts: Iterable[QueueStats]) -> QueueStats:
        parts = list(parts)

        def earliest(values: Iterable[int | None]) -> int | None:
            known = [value for value in values if value is not None]
            return min(known) if known else None

        return QueueStats(
            pending=sum(p.pending for p in parts), due=sum(p.due for p in parts),
            leased=sum(p.leased for p in parts), expired_leases=sum(p.expired_leases for p in parts),
            oldest_due_ms=earliest(p.oldest_due_ms for p in parts), busy=sum(p.busy for p in parts),
            oldest_busy_ms=earliest(p.oldest_busy_ms for p in parts),
            taken_over=sum(p.taken_over for p in parts),
            held=sum(p.held for p in parts), oldest_held_ms=earliest(p.oldest_held_ms for p in parts),
            quarantined=sum(p.quarantined for p in parts),
        )


@dataclass(frozen=True)
class Claim:
    """One claim on one shard: the members now leased to the caller, its token, the next deadline.

    ``takeovers`` is how often the members of this claim were taken over
    from a consumer that died with them (0 for an ordinary batch). Only when
    ``died_alone`` (one member, whose last holder held nothing else) may the
    caller give it up for that: a member that died in a batch may be innocent.
    """

    members: list[str]
    next_score: int | None = field(default=None)
    token: str = ""
    takeovers: int = 0
    died_alone: bool = False
    shard: int = 0
    # The kind of timer claimed (keys.CLOSE or keys.REMIND).
    kind: str = CLOSE
    # Members moved to the quarantine instead (undecodable, or scored past any deadline).
    quarantined: int = 0


class Beat(NamedTuple):
    """What one heartbeat on a shard found."""

    # Leases of consumers whose heartbeat ran out, handed to the next claims.
    handed: int
    # The database sessions their batches ran on ("alias\x1fidentity"), to end.
    sessions: list[str]
    # The shard has no epoch marker: Redis lost it, or the queue was never set up.
    epoch_missing: bool = False


@dataclass(frozen=True)
class Position:
    """Where a member is in Redis: its pending score and its lease expiry (ms), if any."""

    pending_ms: int | None
    lease_ms: int | None
    # A score no deadline can have (+inf, past year 9999): read as no score at all, so the
    # scan closes the order if it is overdue and the rebuild puts a real deadline back.
    unreadable: bool = False

    @property
    def missing(self) -> bool:
        return self.pending_ms is None and self.lease_ms is None


class Shard:
    """One shard: its keys, and every step as one script call on them."""

    def __init__(self, client: Any, keys: QueueKeys, scripts: Callable[[], dict[str, Script]]) -> None:
        self.client = client
        self.keys = keys
        self.index = keys.shard
        self._scripts = scripts

    @property
    def scripts(self) -> dict[str, Script]:
        return self._scripts()

    def schedule(self, deadlines: Mapping[str, int], *, only_missing: bool = False) -> int:
        added = 0
        members = list(deadlines)
        with redis_errors("schedule"):
            for part in _slices(members, SCHEDULE_SLICE):
                chunk = {member: deadlines[member] for member in part}
                if only_missing:
                    added += int(self.client.zadd(self.keys.pending, chunk, nx=True))
                else:
                    added += int(self.scripts["schedule"](keys=[self.keys.pending, self.keys.wake],
                                                          args=_pairs(chunk)))
        return added

    def announce(self, deadlines: Mapping[str, int]) -> None:
        """Add members at these scores, or move them earlier (LT), waking no one: every slice in
        one round trip. For members that must be there early and are scheduled properly later
        (a notice, a lease late, before its transaction commits)."""
        with redis_errors("announce"):
            pipe = self.client.pipeline(transaction=False)
            members = list(deadlines)
            for part in _slices(members, SCHEDULE_SLICE):
                pipe.zadd(self.keys.pending, {member: deadlines[member] for member in part}, lt=True)
            pipe.execute()

    def forget(self, token: str, members: Sequence[str]) -> int:
        keys = self.keys
        dropped = 0
        with redis_errors("forget members"):
            for part in _slices(members):
                dropped += int(self.scripts["forget"](
                    keys=[keys.pending, keys.leased, keys.owners, keys.attempts, keys.first_failure,
                          keys.takeovers, keys.busy, keys.held],
                    args=[token, *part]))
        return dropped

    def claim(self, due_ms: int, limit: int, lease_until_ms: int, token: str, *,
              due_first: bool = False, ack: tuple[str, Sequence[str]] | None = None,
              held: tuple[int, Mapping[str, int]] | None = None) -> Claim:
        """Lease a dead claim's batch (or one member of it), or up to ``limit`` due members.

        ``ack``: ``(token, members)`` of an earlier claim of this shard, committed since: acked
        in the same script (as ``forget`` acks them; at most ``SLICE`` members), after a claim of
        due members, before a takeover or an idle answer. ``held``: ``(since_ms, {member: next
        look})``, that claim's members a payment in flight holds (at most ``SLICE``): put back
        to pending in the same script, as ``reschedule(..., mark=HELD)`` would, where that
        claim's token still holds their lease.

        Expired leases go first unless ``due_first``: a consumer alternates, so
        a dead consumer's batch, taken over whole (then member by member if its
        holders keep dying), and the orders falling due meanwhile each get every
        other claim.

        Members that are not UTF-8, and members scored past any deadline (a
        bad write: +inf, a score beyond year 9999), go to the quarantine: they
        are never handed to the caller, and the members claimed with them are.
        """
        keys = self.keys
        acked_token, acked = ack or ("", ())
        if len(acked) > SLICE:
            raise ValueError(f"a claim carries at most {SLICE} members to ack, not {len(acked)}")
        # One argument for the batch, each member ended by a newline; a member that holds one
        # (a text key may) is acked on its own, first.
        lines = _lines(acked)
        if lines is None:
            self.forget(acked_token, acked)
            lines = ""
        held_since, next_looks = held or (None, {})
        if len(next_looks) > SLICE:
            raise ValueError(f"a claim carries at most {SLICE} held members, not {len(next_looks)}")
        held_lines = _lines([str(part) for member, score in next_looks.items() for part in (score, member)])
        if held_lines is None:
            self.reschedule(acked_token, next_looks, HELD, held_since)
            held_lines = ""
        with redis_errors("claim"):
            reply = self.scripts["claim"](
                keys=[keys.pending, keys.leased, keys.owners, keys.takeovers, keys.attempts, keys.first_failure,
                      keys.busy, keys.held, keys.paused],
                args=[due_ms, limit, lease_until_ms, token, "due" if due_first else "takeover",
                      acked_token if lines or held_lines else "", lines,
                      "" if held_since is None else held_since, held_lines],
            )
        try:
            raw_next, takeovers, raw_members = reply[0], int(reply[1]), list(reply[2:])
            far = bool(raw_next) and not _is_deadline(raw_next)
        except (TypeError, ValueError, IndexError, OverflowError) as exc:
            # Only a script other than ours answers so; its members stay leased and are taken over.
            raise QueueUnavailable(f"Redis answered a claim with {reply!r:.200}, which the claim "
                                   f"script never returns ({type(exc).__name__}: {exc})") from exc
        unreadable: list[bytes | str] = []
        try:
            members = [_text(member) for member in raw_members]
        except UnicodeDecodeError:
            members = []
            for member in raw_members:
                try:
                    members.append(_text(member))
                except UnicodeDecodeError:
                    unreadable.append(member)
        quarantined = self.quarantine(token, unreadable, due_ms, sweep=far) if unreadable or far else 0
        if quarantined:
            logger.error("%s: moved %d member(s) of shard %d into its quarantine: not UTF-8, or scored past "
                         "any deadline (%s). They name no row; the queue goes on without them.",
                         kind_name(keys.kind), quarantined, keys.shard,
                         escaped(unreadable) if unreadable else "far scores")
        return Claim(
            members=members,
            # After a quarantine the next score is unknown: look again now.
            next_score=LOOK_NOW if quarantined else None if far else _score(raw_next),
            token=token, takeovers=abs(takeovers) if members else 0, died_alone=takeovers > 0 and bool(members),
            shard=self.index, kind=self.keys.kind,
            quarantined=quarantined,
        )

    def quarantine(self, token: str, members: Sequence[bytes | str], now_ms: int, *,
                   sweep: bool = True) -> int:
        """Move ``members`` (and, with ``sweep``, members scored past any deadline) to the quarantine."""
        keys = self.keys
        moved = 0
        with redis_errors("quarantine members"):
            for part in _slices(list(members)) if members else [[]]:
                if not part and not sweep:
                    continue
                moved += int(self.scripts["quarantine"](
                    keys=[keys.pending, keys.leased, keys.owners, keys.attempts, keys.first_failure,
                          keys.takeovers, keys.busy, keys.held, keys.quarantine],
                    args=[now_ms, MAX_SCORE if sweep else "+inf", token, *part]))
        return moved

    def retry(self, token: str, members: Sequence[str], now_ms: int,
              delays_ms: list[int]) -> list[Retry]:
        keys = self.keys
        retries: list[Retry] = []
        with redis_errors("schedule retries"):
            for part in _slices(members):
                reply = self.scripts["retry"](
                    keys=[keys.pending, keys.leased, keys.owners, keys.attempts, keys.first_failure,
                          keys.busy, keys.held],
                    args=[token, now_ms, len(delays_ms), *delays_ms, *part],
                )
                retries += [
                    Retry(member=_text(reply[i]), attempts=int(reply[i + 1]),
                          first_failure_ms=int(_text(reply[i + 2])),
                          retry_at_ms=int(_text(reply[i + 3])) if _text(reply[i + 3]) else None)
                    for i in range(0, len(reply), 4)
                ]
        return retries

    def take(self, token: str, members: Sequence[str], now_ms: int, until_ms: int) -> list[str]:
        taken: list[str] = []
        with redis_errors("take members"):
            for part in _slices(members):
                taken += map(_text, self.scripts["take"](
                    keys=[self.keys.pending, self.keys.leased, self.keys.owners],
                    args=[token, now_ms, until_ms, *part]))
        return taken

    def reschedule(self, token: str, deadlines: Mapping[str, int], mark: str = "",
                   since_ms: int | None = None) -> int:
        keys = self.keys
        moved = 0
        with redis_errors("reschedule"):
            for part in _slices(list(deadlines)):
                moved += int(self.scripts["reschedule"](
                    keys=[keys.pending, keys.leased, keys.owners, keys.busy, keys.held],
                    args=[token, mark, "" if since_ms is None else since_ms,
                          *_pairs({member: deadlines[member] for member in part})],
                ))
        return moved

    def heartbeat(self, consumer: str, now_ms: int, until_ms: int | None, session: str = "") -> Beat:
        """``consumer`` is alive until ``until_ms`` (None: it leaves), its batch on ``session``; hand
        the leases of every consumer whose heartbeat ran out to the next claims."""
        keys = self.keys
        with redis_errors("beat"):
            reply = self.scripts["heartbeat"](
                keys=[keys.consumers, keys.leased, keys.owners, keys.sessions, keys.epoch],
                args=[now_ms, consumer, "" if until_ms is None else until_ms, session])
        return Beat(int(reply[0]), [_text(found) for found in reply[2:]], epoch_missing=bool(int(reply[1])))

    def epoch(self, op: str = "read", epoch: str = "") -> tuple[str, bool]:
        """The epoch this shard's marker holds ("" for none), and whether this server stamped it
        (False: Redis restarted from a snapshot, or a replica took over); ``op`` "mark" sets it
        first, "claim" sets it unless set (lua/epoch.lua)."""
        with redis_errors(f"{op} the epoch"):
            held, here = self.scripts["epoch"](keys=[self.keys.epoch], args=[op, epoch])
        return _text(held), bool(int(here))

    def renew(self, token: str, members: Sequence[str], until_ms: int) -> int:
        moved = 0
        with redis_errors("renew leases"):
            for part in _slices(members):
                moved += int(self.scripts["renew"](keys=[self.keys.leased, self.keys.owners],
                                                   args=[token, until_ms, *part]))
        return moved

    def positions(self, members: Sequence[str]) -> dict[str, Position]:
        """Each member's pending score and lease expiry, each slice read at one instant (a script)."""
        found: dict[str, Position] = {}
        with redis_errors("look members up"):
            for part in _slices(members):
                if not part:
                    continue
                reply = self.scripts["positions"](keys=[self.keys.pending, self.keys.leased], args=list(part))
                for member, pending, lease in zip(part, reply[:len(part)], reply[len(part):], strict=True):
                    found[member] = Position(_score(pending), _score(lease),
                                             unreadable=bool(pending) and _score(pending) is None)
        return found

    def stats(self, now_ms: int) -> QueueStats:
        keys = self.keys
        with redis_errors("read queue statistics"):
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
            pipe.zcard(keys.held)
            pipe.zrange(keys.held, 0, 0, withscores=True)
            pipe.zcard(keys.quarantine)
            (pending, due, leased, expired, first_pending, first_lease, busy, first_busy,
             taken_over, held, first_held, quarantined) = pipe.execute()

        def first_score(first: list[Any]) -> int | None:
            return _score(first[0][1]) if first else None

        waiting = [score for score in map(first_score, (first_pending, first_lease))
                   if score is not None and score <= now_ms]
        return QueueStats(pending=pending, due=due, leased=leased, expired_leases=expired,
                          oldest_due_ms=min(waiting) if waiting else None, busy=busy,
                          oldest_busy_ms=first_score(first_busy), taken_over=taken_over, held=held,
                          oldest_held_ms=first_score(first_held), quarantined=quarantined)


class TimeoutQueue:
    """One delay queue of one kind of timer: its shards, and the members of a call grouped by
    the shard they live in."""

    def __init__(self, client: Any, key_prefix: str, shards: int = 1, kind: str = CLOSE) -> None:
        self.client = client
        self.prefix = key_prefix
        self.kind = kind
        self.shards = [Shard(client, QueueKeys(key_prefix, index, shards, kind), lambda: self.scripts)
                       for index in range(shards)]
        self.global_keys = GlobalKeys(key_prefix, kind)

    @classmethod
    def from_settings(cls, kind: str = CLOSE) -> TimeoutQueue:
        """The queue on ``REDIS_ALIAS``'s client (``alias_client``); ``QueueUnavailable`` if it cannot connect."""
        from ..conf import settings
        from .clients import alias_client

        return cls(alias_client(settings.REDIS_ALIAS), settings.KEY_PREFIX, settings.SHARDS, kind)

    def of_kind(self, kind: str) -> TimeoutQueue:
        """The queue of another kind of timer on the same client, prefix and shards."""
        return type(self)(self.client, self.prefix, len(self.shards), kind)

    @classmethod
    def for_saves(cls) -> TimeoutQueue:
        """The queue as seen from a request: every round trip bounded by ``SCHEDULE_TIMEOUT``.

        Its client is the process's one for this alias, its settings and the
        timeout, shared by every thread and async context (Django builds cache
        clients per thread and per request; one bounded client each would open
        connections without end).
        """
        from ..conf import settings
        from .clients import saves_client

        return cls(saves_client(settings.REDIS_ALIAS, settings.SCHEDULE_TIMEOUT), settings.KEY_PREFIX,
                   settings.SHARDS)

    @cached_property
    def scripts(self) -> dict[str, Script]:
        """Scripts by name, registered once per client (EVALSHA, loaded on first use)."""
        return {name: self.client.register_script(load_script_source(name)) for name in SCRIPT_NAMES}

    # -- shards -----------------------------------------------------------------

    def shard_for(self, member: str) -> Shard:
        return self.shards[shard_of(member, len(self.shards))]

    def by_shard(self, members: Iterable[str]) -> dict[Shard, list[str]]:
        grouped: dict[Shard, list[str]] = defaultdict(list)
        for member in members:
            grouped[self.shard_for(member)].append(member)
        return grouped

    # -- from the shop's side ------------------------------------------------

    def schedule(self, deadlines: Mapping[str, int], *, only_missing: bool = False) -> int:
        """Add members, or move them to a new deadline (score, in ms); returns how many were new.

        ``only_missing`` adds members absent from the pending set and leaves
        the others (a pending retry keeps its backoff).
        """
        return sum(shard.schedule({member: deadlines[member] for member in members},
                                  only_missing=only_missing)
                   for shard, members in self.by_shard(deadlines).items())

    def announce(self, deadlines: Mapping[str, int]) -> None:
        """``Shard.announce`` on each shard: members early, moved earlier only, waking no one."""
        for shard, members in self.by_shard(deadlines).items():
            shard.announce({member: deadlines[member] for member in members})

    def unschedule(self, members: Iterable[str]) -> None:
        """Forget members wherever they are: pending, leased, retry state (the order was paid)."""
        for shard, part in self.by_shard(members).items():
            shard.forget("", part)

    def sync(self, deadlines: Mapping[str, int], gone: Iterable[str]) -> None:
        """Schedule ``deadlines`` and forget ``gone``."""
        self.schedule(deadlines)
        self.unschedule(gone)

    # -- from the consumer's side ----------------------------------------------

    def ack(self, token: str, members: Iterable[str]) -> int:
        """Done with these members for good (closed, paid, gone): forget them.

        Their pending entries go in any case; their leases and state only if
        ``token`` still holds them. Returns how many leases were released.
        """
        return sum(shard.forget(token, part) for shard, part in self.by_shard(members).items())

    def retry(self, token: str, members: Iterable[str], now_ms: int,
              delays_ms: list[int]) -> list[Retry]:
        """Count a failed attempt for each member this claim holds and schedule its next try."""
        return [retry for shard, part in self.by_shard(members).items()
                for retry in shard.retry(token, part, now_ms, delays_ms)]

    def take(self, token: str, members: Iterable[str], now_ms: int, until_ms: int) -> list[str]:
        """Lease ``members`` to ``token`` until ``until_ms``, but those a live lease of another claim
        holds (the compensation scan's failures, so they are retried as a consumer's); the taken."""
        return [member for shard, part in self.by_shard(members).items()
                for member in shard.take(token, part, now_ms, until_ms)]

    def reschedule(self, token: str, deadlines: Mapping[str, int], *, mark: str = "",
                   since_ms: int | None = None) -> int:
        """Move members this claim holds back to pending at new deadlines; returns how many moved.

        ``mark`` says why, for the backlog's figures: ``BUSY`` (their rows were
        locked by another transaction) or ``HELD`` (a payment in flight holds
        them); each is counted from the first time it was found so
        (``since_ms``). Any other put-back clears both marks.
        """
        return sum(shard.reschedule(token, {member: deadlines[member] for member in part}, mark,
                                    since_ms)
                   for shard, part in self.by_shard(deadlines).items())

    def renew(self, token: str, members: Iterable[str], until_ms: int) -> int:
        """Move the leases this claim holds to ``until_ms``."""
        return sum(shard.renew(token, part, until_ms) for shard, part in self.by_shard(members).items())

    def quarantine(self, token: str, members: Iterable[str], now_ms: int) -> int:
        """Move members this claim holds that name no order (malformed) to their shards' quarantine."""
        return sum(shard.quarantine(token, part, now_ms, sweep=False)
                   for shard, part in self.by_shard(members).items())

    def quarantined(self, limit: int = 20) -> list[bytes]:
        """The members in the quarantine, latest first, at most ``limit`` (raw: they may not be text)."""
        found: list[tuple[float, bytes]] = []
        with redis_errors("read the quarantine"):
            for shard in self.shards:
                found += [(score, member) for member, score in
                          self.client.zrange(shard.keys.quarantine, 0, limit - 1, desc=True, withscores=True)]
        return [member for _score_ms, member in sorted(found, reverse=True)[:limit]]

    def trim_quarantine(self, before_ms: int) -> int:
        """Delete what was moved into the quarantine before ``before_ms``: how many went."""
        with redis_errors("trim the quarantine"):
            return sum(int(self.client.zremrangebyscore(shard.keys.quarantine, "-inf", f"({before_ms}"))
                       for shard in self.shards)

    def hand_over(self, token: str, members: Iterable[str], now_ms: int) -> int:
        """Let the leases this claim holds run out now: the next claims take them over.

        Scored with the moment of the hand-over (not 0), so the backlog's
        "oldest due" age counts from when they became claimable again.
        """
        return self.renew(token, members, now_ms)

    # -- looking ------------------------------------------------------------------

    def positions(self, members: Iterable[str]) -> dict[str, Position]:
        """Each member's pending score and lease expiry."""
        found: dict[str, Position] = {}
        for shard, part in self.by_shard(members).items():
            found.update(shard.positions(part))
        return found

    def missing(self, members: Iterable[str]) -> list[str]:
        """The members that are neither pending nor leased."""
        return [member for member, where in self.positions(members).items() if where.missing]

    def stats(self, now_ms: int) -> QueueStats:
        """Sizes of the queue, all shards added up."""
        return QueueStats.add(self.shard_stats(now_ms).values())

    def shard_stats(self, now_ms: int) -> dict[int, QueueStats]:
        return {shard.index: shard.stats(now_ms) for shard in self.shards}

    def delete_all_keys(self) -> None:
        """Delete every key of this queue and nothing else (one command per hash tag)."""
        with redis_errors("delete the queue's keys"):
            for shard in self.shards:
                keys = shard.keys
                self.client.delete(*keys.all(), keys.consumers, keys.sessions, keys.epoch, keys.paused)
            self.client.delete(*self.global_keys.all())

    # -- the compensation scan's bookkeeping ------------------------------------

    def acquire_lock(self, token: str, ttl_ms: int) -> bool:
        with redis_errors("take the compensation lock"):
            return bool(self.client.set(self.global_keys.compensation_lock, token, nx=True, px=ttl_ms))

    def renew_lock(self, token: str, ttl_ms: int) -> bool:
        with redis_errors("renew the compensation lock"):
            return bool(self.scripts["renew_lock"](keys=[self.global_keys.compensation_lock],
                                                   args=[token, ttl_ms]))

    def mark_epoch(self, epoch: str) -> None:
        """Set the epoch marker on every shard: the queue is set up (or rebuilt) as of ``epoch``."""
        for shard in self.shards:
            shard.epoch("mark", epoch)

    def claim_epoch(self, candidate: str) -> str:
        """The queue's epoch in Redis, ``candidate`` if it had none: set on the first shard unless
        set (the consumers setting a new queue up at once agree on the first one's), then on the
        others unless set. Returns the epoch the first shard holds."""
        epoch = self.shards[0].epoch("claim", candidate)[0] or candidate
        for shard in self.shards[1:]:
            shard.epoch("claim", epoch)
        return epoch

    def epoch_trouble(self, epoch: str) -> str | None:
        """None when every shard holds the marker of ``epoch``, stamped by the server holding it;
        else what a shard shows: "gone" (Redis lost the queue), or "moved" (a Redis restarted from
        a snapshot, or a replica promoted: the writes it missed are lost)."""
        trouble = None
        for shard in self.shards:
            held, here = shard.epoch()
            if held != epoch:
                return "gone"
            if not here:
                trouble = "moved"
        return trouble

    def epoch_intact(self, epoch: str) -> bool:
        """Whether every shard holds the marker of ``epoch``, stamped by its own server."""
        return self.epoch_trouble(epoch) is None

    def release_lock(self, token: str) -> bool:
        with redis_errors("release the compensation lock"):
            return bool(self.scripts["release_lock"](keys=[self.global_keys.compensation_lock],
                                                     args=[token]))

    def scans_started(self, members: Iterable[str]) -> dict[str, int]:
        """How many scans started closing each member and never finished (died)."""
        members = list(members)
        if not members:
            return {}
        with redis_errors("read what the scan started"):
            counts = self.client.hmget(self.global_keys.scanning, members)
        return {member: int(count or 0) for member, count in zip(members, counts, strict=True)}

    def start_scanning(self, members: Iterable[str]) -> None:
        """Note that the scan is about to close these (cleared by ``done_scanning``)."""
        members = list(members)
        if members:
            with redis_errors("mark members the scan closes"):
                pipe = self.client.pipeline(transaction=False)
                for member in members:
                    pipe.hincrby(self.global_keys.scanning, member, 1)
                pipe.execute()

    def paused_flags(self) -> list[bool]:
        """Each shard's paused flag, as the claim script reads it."""
        with redis_errors("read the pause of the queue"):
            pipe = self.client.pipeline(transaction=False)
            for shard in self.shards:
                pipe.get(shard.keys.paused)  # GET, as the claim script reads it (no EXISTS in the ACL rule)
            return [flag is not None for flag in pipe.execute()]

    def set_paused(self, paused: bool) -> None:
        """Set (or clear) every shard's paused flag: the claim script claims nothing while it is set."""
        with redis_errors("set the pause of the queue"):
            pipe = self.client.pipeline(transaction=False)
            for shard in self.shards:
                if paused:
                    pipe.set(shard.keys.paused, "1")
                else:
                    pipe.delete(shard.keys.paused)
            pipe.execute()

    @cached_property
    def housekeeping(self) -> Housekeeping:
        """Where this kind's scan starts its walk; the prune's turn and totals."""
        return Housekeeping(self.client, self.global_keys, lambda: self.scripts)

    def record_drift(self, missing: int) -> None:
        with redis_errors("record the drift"):
            self.client.set(self.global_keys.drift, missing)

    def last_drift(self) -> int | None:
        with redis_errors("read the drift"):
            value = self.client.get(self.global_keys.drift)
        return None if value is None else int(value)

    def done_scanning(self, members: Iterable[str]) -> None:
        members = list(members)
        if members:
            with redis_errors("clear members the scan closed"):
                self.client.hdel(self.global_keys.scanning, *members)


