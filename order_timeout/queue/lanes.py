"""The lanes a consumer goes round: every kind's shards in one sequence, and which is due next.

A lane is one shard of one kind of timer (the order close's shards first,
then each other kind's). A consumer starts at a random lane and goes round,
so many consumers spread over the shards and no kind waits behind another;
a kind that yields (the notices, which follow the closes' commits) waits
behind the others' due members for a second at most.
It remembers each lane's next score (from its last claim, a wake-up, or a
refresh every ``MAX_WAIT``), so an idle consumer asks only the lanes that are
due or woke it.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence

from .errors import redis_errors
from .shards import LOOK_NOW, Claim, TimeoutQueue, _score

# A lane whose next score is not known yet: ask it.
UNKNOWN = 0


class Lanes:
    """The shards of every kind of timer a consumer serves, numbered in one sequence: a lane each.

    The closes' shards come first (lane = shard index), the reminders' after
    them. A consumer goes round the lanes, so no kind waits behind another.
    """

    def __init__(self, queues: Sequence[TimeoutQueue]) -> None:
        self.queues = list(queues)
        self.client = self.queues[0].client
        self.shards = [shard for queue in self.queues for shard in queue.shards]
        self._queue_of = [queue for queue in self.queues for _ in queue.shards]

    def queue_of(self, lane: int) -> TimeoutQueue:
        return self._queue_of[lane]

    def next_scores(self) -> dict[int, int | None]:
        """Each lane's earliest score (pending deadline or lease expiry), in one round trip."""
        with redis_errors("read the next deadlines"):
            pipe = self.client.pipeline(transaction=False)
            for shard in self.shards:
                pipe.zrange(shard.keys.pending, 0, 0, withscores=True)
                pipe.zrange(shard.keys.leased, 0, 0, withscores=True)
            replies = pipe.execute()
        result: dict[int, int | None] = {}
        for lane in range(len(self.shards)):
            # A score no deadline can have reads as "look now": the claim then quarantines it.
            firsts = [LOOK_NOW if _score(reply[0][1]) is None else _score(reply[0][1])
                      for reply in replies[2 * lane:2 * lane + 2] if reply]
            result[lane] = min(firsts) if firsts else None  # type: ignore[type-var]
        return result


# Seconds a yielding lane's due members wait at most while other lanes have a backlog.
YIELD_SECONDS = 1.0


class ShardRota:
    """Which lane to claim next: the next one due, going round.

    ``yielding`` lanes (a kind that says ``yields``: the notices) step aside
    for a backlog: while another lane is due and its last claim came back
    full (a burst), they are claimed only once passed over for
    ``YIELD_SECONDS``. A burst of closes goes first, and the work it starts
    follows within a second, never starved; a trickle (a steady stream, a
    takeover's one member) takes turns with them as any lanes do.

    ``gathering`` lanes (a kind that ``gathers``: the reminders) let their due
    members gather: after a claim that did not come back full, such a lane is
    due again only its gathering time (ms) later, so a steady stream of them
    comes in a few larger batches and the closes between them do not wait
    behind a small batch every turn. A full claim (a backlog) and a wake-up
    end the wait.
    """

    def __init__(self, shards: int, start: int | None = None, *, yielding: Collection[int] = (),
                 clock: Callable[[], float] = time.monotonic, gathering: Mapping[int, int] | None = None) -> None:
        self.count = shards
        # Per shard: the earliest score it holds (ms), UNKNOWN, or None when it is empty.
        self._next: list[int | None] = [UNKNOWN] * shards
        self._cursor = random.randrange(shards) if start is None else start
        self._lock = threading.Lock()
        self._yielding = frozenset(yielding)
        self._gathering = dict(gathering or {})
        self._clock = clock
        # Since when each yielding lane has been passed over while due (absent: it is not waiting).
        self._waiting_since: dict[int, float] = {}
        # The lanes whose last claim came back full: a backlog, which the yielding lanes let pass.
        self._backlog: set[int] = set()
        # The lanes of a paused kind (staff paused it): never claimed, never due, until resumed.
        self._paused: frozenset[int] = frozenset()
        # Per lane, how many times it was woken (the listener's thread): an answer asked before
        # the last wake-up is older than it, and must not write "empty" over it.
        self._wakes = [0] * shards

    def wakes(self) -> tuple[int, ...]:
        """Each lane's wake-ups so far: take it before asking Redis, give it to ``claimed`` or
        ``refreshed`` with the answer (a wake-up in between keeps its lane to be asked again)."""
        with self._lock:
            return tuple(self._wakes)

    def _woken_since(self, lane: int, since: Sequence[int] | None) -> bool:
        return since is not None and self._wakes[lane] != since[lane]

    def pause(self, lanes: Collection[int]) -> None:
        """Claim none of ``lanes`` from now on (and none of the others' pause any more)."""
        with self._lock:
            self._paused = frozenset(lanes)
            for lane in range(self.count):
                if lane not in self._paused:
                    self._next[lane] = UNKNOWN  # resumed: what fell due meanwhile is due now
                    self._wakes[lane] += 1

    def next_due(self, due_ms: int) -> int | None:
        """The next shard, going round, with something due by ``due_ms``; None if none has."""
        with self._lock:
            due = [(self._cursor + step) % self.count for step in range(self.count)]
            due = [index for index in due if (score := self._next[index]) is not None and score <= due_ms
                   and index not in self._paused]
            if not due:
                return None
            index = self._pick(due)
            self._cursor = (index + 1) % self.count
            return index

    def _pick(self, due: list[int]) -> int:
        """Of the due lanes (in turn order), the one to claim (class docstring)."""
        others = [index for index in due if index not in self._yielding]
        if not self._yielding or not any(index in self._backlog for index in others):
            self._waiting_since.clear()
            return due[0]
        now = self._clock()
        for index in due:
            if index in self._yielding and now - self._waiting_since.setdefault(index, now) >= YIELD_SECONDS:
                del self._waiting_since[index]
                return index
        return others[0]

    def has_due(self, due_ms: int) -> bool:
        with self._lock:
            return any(score is not None and score <= due_ms and lane not in self._paused
                       for lane, score in enumerate(self._next))

    def claimed(self, lane: int, claim: Claim, full: bool = False, *, since: Sequence[int] | None = None,
                at: int | None = None) -> None:
        """``claim`` came from ``lane``; ``full``: it took as many members as it could; ``since``:
        ``wakes()`` as the claim was sent; ``at``: the score it claimed up to (a gathering lane
        waits its gathering time from there)."""
        with self._lock:
            # After a claim that took members, more may be due at once.
            fresh = not claim.members and not self._woken_since(lane, since)
            self._next[lane] = claim.next_score if fresh else UNKNOWN
            gather = self._gathering.get(lane)
            if gather and claim.members and not full and at is not None and not self._woken_since(lane, since):
                self._next[lane] = at + gather
            if full:
                self._backlog.add(lane)
            else:
                self._backlog.discard(lane)

    def woke(self, shard: int) -> None:
        """A new earliest deadline was scheduled on ``shard``."""
        with self._lock:
            self._next[shard] = UNKNOWN
            self._wakes[shard] += 1

    def refreshed(self, scores: dict[int, int | None], *, since: Sequence[int] | None = None) -> None:
        """Every lane's next score, asked after ``since`` (``wakes()``)."""
        with self._lock:
            for index, score in scores.items():
                if not self._woken_since(index, since):
                    self._next[index] = score

    def earliest(self) -> int | None:
        """The earliest next score over every shard (None when all are empty)."""
        with self._lock:
            known = [score for lane, score in enumerate(self._next) if score is not None and lane not in self._paused]
        return min(known) if known else None
