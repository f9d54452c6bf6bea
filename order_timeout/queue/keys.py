"""Every Redis key of one queue, built here and nowhere else.

A queue has ``SHARDS`` shards. Each shard's keys share one ``{hash tag}``, so
each script touches one Redis Cluster slot, and different shards land on
different slots (and masters): ``{prefix}`` for a queue of one shard (the
layout of every release so far), ``{prefix:N}`` for shard N of several. The
keys that belong to the queue as a whole (the scan's lock and bookkeeping)
carry ``{prefix}``.

There is a queue per kind of timer: the order close (``CLOSE``, the keys of
every release so far), the reminders (``REMIND``: the same names after
``remind:``, under the same hash tags), and each timer a shop declares (the
same names after ``<its name>:``).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass


def shard_of(member: str, shards: int) -> int:
    """The shard a member lives in: a fixed function of the member (CRC-32), never of time."""
    return zlib.crc32(member.encode()) % shards if shards > 1 else 0


# The kinds of timer: an order's close at its deadline, and its reminders before it.
CLOSE = ""
REMIND = "remind"
# The notices (order_timeout.Notice): the outbox's own queue.
NOTICE = "notice"
# The app's kinds by the names people read in logs and reports; a declared timer's is its own.
KIND_NAMES = {CLOSE: "close", REMIND: "reminders", NOTICE: "notices"}


def kind_name(kind: str) -> str:
    """A queue's kind in a log line: "close", "reminders", "notices", a timer's name."""
    return KIND_NAMES.get(kind, kind)


@dataclass(frozen=True)
class QueueKeys:
    """The keys of one shard of one kind of timer."""

    prefix: str
    shard: int = 0
    shards: int = 1
    kind: str = CLOSE

    @property
    def tag(self) -> str:
        return f"{{{self.prefix}}}" if self.shards == 1 else f"{{{self.prefix}:{self.shard}}}"

    def _key(self, name: str) -> str:
        return f"{self.tag}:{self.kind}:{name}" if self.kind else f"{self.tag}:{name}"

    @property
    def pending(self) -> str:
        """Sorted set: member = order id, score = deadline (ms)."""
        return self._key("pending")

    @property
    def leased(self) -> str:
        """Sorted set: member = claimed order id, score = lease expiry (ms)."""
        return self._key("leased")

    @property
    def owners(self) -> str:
        """Hash: member = leased order id, value = token of the claim that holds the lease."""
        return self._key("owners")

    @property
    def attempts(self) -> str:
        """Hash: member = order id, value = failed close attempts so far."""
        return self._key("attempts")

    @property
    def first_failure(self) -> str:
        """Hash: member = order id, value = time of its first failed close (ms)."""
        return self._key("first-failure")

    @property
    def takeovers(self) -> str:
        """Hash: member = order id, value = times its lease ran out and another claim took it."""
        return self._key("takeovers")

    @property
    def busy(self) -> str:
        """Sorted set: member = order id whose row was locked elsewhere, score = first time (ms)."""
        return self._key("busy")

    @property
    def held(self) -> str:
        """Sorted set: member = order id held by a payment in flight (HOLD_CONDITION), score =
        the first time it was found held (ms)."""
        return self._key("held")

    @property
    def quarantine(self) -> str:
        """Sorted set: member = a member that names no order (not UTF-8, malformed, scored past any
        deadline) as Redis held it, score = when it was moved here (ms). For a person to look at."""
        return self._key("quarantine")

    @property
    def paused(self) -> str:
        """String, set while staff keep this kind paused (the claim script claims nothing then); the
        pause itself is a row of the database (models.Pause), which sets it again if Redis lost it."""
        return self._key("paused")

    @property
    def consumers(self) -> str:
        """Sorted set: member = a running consumer's id, score = when its heartbeat runs out (ms)."""
        return self._key("consumers")

    @property
    def epoch(self) -> str:
        """String: the queue's epoch (models.QueueEpoch), set once the queue is set up or rebuilt.
        Gone with the rest of the shard when Redis loses it: what tells the consumers so."""
        return self._key("epoch")

    @property
    def sessions(self) -> str:
        """Hash: member = a running consumer's id, value = the database session its batch runs on
        ("alias\x1fidentity"), for the consumer that finds it dead to end."""
        return self._key("sessions")

    @property
    def wake(self) -> str:
        """(Sharded) pub/sub channel: a new earliest deadline (ms) of this shard, for consumers."""
        return self._key("wake")

    @property
    def probe(self) -> str:
        """Scratch key, and channel, of ``check --deploy``'s permission probe: deleted at once."""
        return self._key("probe")

    def all(self) -> list[str]:
        """Every key of the shard that holds data (for resharding and tests)."""
        return [self.pending, self.leased, self.owners, self.attempts, self.first_failure,
                self.takeovers, self.busy, self.held, self.quarantine]


@dataclass(frozen=True)
class GlobalKeys:
    """The keys of the queue as a whole: the scan's lock, and each kind's scan bookkeeping and drift
    (the order close's under the names of every release, ``{prefix}:drift``; another kind's under
    ``{prefix}:<kind>:drift``)."""

    prefix: str
    kind: str = CLOSE

    def _key(self, name: str) -> str:
        return f"{{{self.prefix}}}:{self.kind}:{name}" if self.kind else f"{{{self.prefix}}}:{name}"

    @property
    def compensation_lock(self) -> str:
        """String: the token of the compensation scan running now, if any (one for every kind)."""
        return f"{{{self.prefix}}}:compensation-lock"

    @property
    def drift(self) -> str:
        """String: how many of this kind's members the last beat run found missing from Redis."""
        return self._key("drift")

    @property
    def scanning(self) -> str:
        """Hash: member = a member the scan started acting on, value = scans that did not finish it."""
        return self._key("scanning")

    @property
    def scan_mark(self) -> str:
        """Hash: where this kind's next compensation scan starts its walk of the overdue rows
        (``from``, a deadline in ms: below it the last scan left only open dead letters) and when
        the last scan that walked them all from the oldest ran (``full``, ms)."""
        return self._key("scan-mark")

    @property
    def prune_turn(self) -> str:
        """String, with a time to live of ``PRUNE_INTERVAL``: the prune's turn as releases before 0.4
        took it (the beat's). Read by nothing now; deleted with the queue's keys, and lapses by itself."""
        return f"{{{self.prefix}}}:prune-turn"

    @property
    def pruned(self) -> str:
        """Hash: rows the prune deleted, per table, since Redis last lost its data (``total:<table>``),
        the last run's (``last:<table>``) and when it ended (``at``, ms) (one for every kind)."""
        return f"{{{self.prefix}}}:pruned"

    @property
    def prune_lock(self) -> str:
        """String, with a time to live the runner renews between chunks: the token of the prune
        running now, if any (one for every kind): one prune at a time, whoever runs it."""
        return f"{{{self.prefix}}}:prune-lock"

    @property
    def housekeeping_runs(self) -> str:
        """Hash: each housekeeping job's last run (``<job>:<field>``: when it started and ended by
        the database's clock, ms, where, by whom, whether complete, its figures), and when its last complete
        run started (``<job>:complete_started``): the fleet's one record of whose turn comes next."""
        return f"{{{self.prefix}}}:housekeeping-runs"

    @property
    def pauses(self) -> str:
        """String: a version of the timers' pauses (a new token at every pause and resume); the
        pauses themselves are rows of the database (one for every kind)."""
        return f"{{{self.prefix}}}:pauses"

    def all(self) -> list[str]:
        """Every key of the queue as a whole that holds data."""
        return [self.compensation_lock, self.drift, self.scanning, self.scan_mark, self.prune_turn, self.pruned,
                self.pauses, self.prune_lock, self.housekeeping_runs]
