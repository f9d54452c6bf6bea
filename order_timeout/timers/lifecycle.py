"""One batch, one page: the life of one claimed batch of any kind, read top to bottom in ``process``.

For one claim of one kind: (1) read the members as keys (what names none goes
to the quarantine); (2) give up at once on one whose consumers kept dying with
it; (3) lock the rows by the database's clock, judge each under its lock and
act on the due ones, in one transaction (``acting``), under the batch's watch;
(4) settle each key in Redis: ack what is done, reschedule what is not due
yet, look again shortly at a row locked elsewhere, later at a held one, retry
a failure after each of ``RETRY_DELAYS`` and give it up after the last, hand
an abandoned batch to the next claim. The kind says only what differs (its
keys, its lock, its judge, its act, what giving up records), and none of its
hooks calls back into this module. Written once: a fix or a speed-up here
lands for every kind.

Decided once for every kind (docs/design.md, "One lifecycle"): the takeover
limit is checked after the members are read (an unreadable one is
quarantined, a readable one given up through its kind); a batch that fails as
a whole is tried again key by key; a lock conflict or a lost connection
inside a receiver is the database's error, not the key's; every act calls
``progress`` after each key's receivers.
"""

from __future__ import annotations

import logging
import time
from contextlib import AbstractContextManager
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from ..exceptions import RepeatedTakeover
from ..queue import BUSY, HELD, Claim, TimeoutQueue
from .acting import act_on
from .giving_up import Failure
from .members import deadline_score, now_score
from .outcome import Key, Moments, Outcome, Report, Timing
from .retrying import Retrier

if TYPE_CHECKING:
    from .kind import Kind

logger = logging.getLogger("order_timeout")

# A key whose row another transaction holds is claimed again this much later.
BUSY_RETRY_MS = 1000


class Watch(Protocol):
    """What keeps an eye on a batch while it is acted on (the consumer's lease guard)."""

    def watching(self, claim: Claim, queue: TimeoutQueue, using: str) -> AbstractContextManager[Any]: ...


class Clock(Protocol):
    """The host's clock corrected to the database's, learning from each batch."""

    def __call__(self) -> datetime: ...

    def learn(self, db_now: datetime | None) -> None: ...


class Settler(Protocol):
    """Where a batch's settled members go once it committed: its done members acked, its held ones
    put back to look at again. ``AtOnce`` (the default) tells Redis now; the consumer carries both
    with its next claim of the shard (one round trip a batch, held or not)."""

    def ack(self, token: str, members: list[str]) -> None: ...

    def hold(self, token: str, next_looks: dict[str, int], since_ms: int) -> None: ...


class AtOnce:
    """A batch's ack and held members told to Redis at once, each by a call of its own."""

    def __init__(self, queue: TimeoutQueue) -> None:
        self.queue = queue

    def ack(self, token: str, members: list[str]) -> None:
        self.queue.ack(token, members)

    def hold(self, token: str, next_looks: dict[str, int], since_ms: int) -> None:
        self.queue.reschedule(token, next_looks, mark=HELD, since_ms=since_ms)


class Lifecycle:
    """Process one claim of one kind: ``process(kind, queue, claim, now) -> Report``."""

    def __init__(self, *, clock: Clock, watch: Watch, retry_delays_ms: list[int], max_takeovers: int,
                 lease_ms: int) -> None:
        self.clock = clock
        self.watch = watch
        self.retrier = Retrier(retry_delays_ms=retry_delays_ms, lease_ms=lease_ms)
        self.max_takeovers = max_takeovers

    def process(self, kind: Kind, queue: TimeoutQueue, claim: Claim, now: datetime, *,
                settler: Settler | None = None) -> Report:
        """The life of one claimed batch, in order (docs/design.md, "One batch, one page").

        ``settler``: where the batch's done and held members go once it committed (the consumer's:
        with its next claim); told to Redis at once (``AtOnce``) by default.
        """
        # 1. Read the members: each names a key of the kind's rows; what names none is quarantined.
        by_key, malformed = self._read(kind, queue, claim, now)
        report = Report(claimed=len(claim.members), dropped=len(malformed))
        # 2. Give up on the repeat offender: a member whose consumers kept dying with it alone.
        if claim.died_alone and claim.takeovers > self.max_takeovers and by_key:
            return self._give_up_taken_over(kind, queue, claim, by_key, now, report)
        # 3. Lock the rows by the database's clock, judge each under its lock, act on the due ones:
        # one transaction (acting.act_on), watched so that a batch past its time limit stops (and the
        # watch knows how far it got).
        with self.watch.watching(claim, queue, kind.using) as batch:
            outcome = act_on(kind, list(by_key), should_stop=batch.expired if batch else None,
                             progress=batch.advance if batch else None)
        self.clock.learn(outcome.db_now)
        acted_at = self.clock()
        # 4. Settle every member in Redis: ack, reschedule, look again, hand over, retry, give up.
        self._settle(kind, queue, claim.token, outcome, by_key, now, report, settler or AtOnce(queue))
        if batch is not None:
            report.timing = Timing(seconds=time.monotonic() - batch.started, given_up=batch.given_up.is_set(),
                                   done=batch.done)
        report.moments = Moments((self.clock() - now).total_seconds(), acted_at, outcome.moments)
        return report

    # -- reading the members ------------------------------------------------------------------

    @staticmethod
    def _read(kind: Kind, queue: TimeoutQueue, claim: Claim, now: datetime) -> tuple[dict[Key, str], list[str]]:
        """Each member's key; those that name none go to the quarantine (logged once)."""
        by_key, malformed = kind.keys_of(claim.members)
        if malformed:
            logger.error("%s: dropping %d malformed member(s) into the quarantine: %r", kind.label,
                         len(malformed), malformed[:20])
            queue.quarantine(claim.token, malformed, now_score(now))
        return by_key, malformed

    # -- settling in Redis ----------------------------------------------------------------------

    def _settle(self, kind: Kind, queue: TimeoutQueue, token: str, outcome: Outcome, by_key: dict[Key, str],
                now: datetime, report: Report, settler: Settler) -> None:
        now_ms = now_score(now)
        if outcome.missing:
            logger.warning("%s: no %s row for member(s) %r; dropped.", kind.label, kind.model.__name__,
                           [by_key[key] for key in outcome.missing][:20])
        done = [by_key[key] for key in (*outcome.acted, *outcome.settled, *outcome.passed, *outcome.missing)]
        if done:
            settler.ack(token, done)
        queue.reschedule(token, {by_key[key]: deadline_score(moment) for key, moment in outcome.not_due.items()})
        # Locked by someone else: look again shortly, not counted as a failure.
        queue.reschedule(token, {by_key[key]: now_ms + BUSY_RETRY_MS for key in outcome.busy},
                         mark=BUSY, since_ms=now_ms)
        # Held (a payment in flight): look again every HOLD_RECHECK, no later than its longest hold.
        if outcome.held:
            settler.hold(token, {by_key[key]: kind.recheck_ms(deadline, now) for key, deadline in outcome.held.items()},
                         since_ms=now_ms)
        # Settled by its settled condition, its deadline kept: looked at again, acted on once it is not.
        queue.reschedule(token, {by_key[key]: kind.settled_recheck_ms(now) for key in outcome.kept})
        if outcome.abandoned:
            # Hand them to the next claim at once (the guard did, unless it was not there).
            queue.hand_over(token, [by_key[key] for key in outcome.abandoned], now_score(self.clock()))
        report.given_up += self.retrier.retry_or_give_up(kind, queue, token, outcome.failed, by_key, now)
        report.count(outcome)

    def _give_up_taken_over(self, kind: Kind, queue: TimeoutQueue, claim: Claim, by_key: dict[Key, str],
                            now: datetime, report: Report) -> Report:
        """A member whose consumers kept dying with it: given up, not tried again.

        Unless its row is settled already (the give-up looks under the row
        lock): a holder that overran its lease may still have committed the
        act, and a dead letter would send staff after a row that needs nobody.
        """
        error = RepeatedTakeover(
            f"Its consumer died, froze or overran BATCH_TIME_LIMIT with it {claim.takeovers} times "
            "(a receiver that exits the process, runs out of memory or hangs?); not tried again.")
        failures = [Failure(key, claim.takeovers, now_score(now), error) for key in by_key]
        burial = self.retrier.give_up(kind, queue, claim.token, failures, by_key, now)
        for key in burial.buried:
            logger.error("%s %s taken over %d times: %s without another try.", kind.label, kind.describe(key),
                         claim.takeovers, kind.wording.give_up_verb)
        for key in (*burial.settled, *burial.missing):
            logger.info("%s %s taken over %d times, but %s: let go.", kind.label, kind.describe(key),
                        claim.takeovers, "gone" if key in burial.missing else "settled already")
        report.given_up += len(burial.buried)
        report.settled += len(burial.settled)
        report.dropped += len(burial.missing)
        return report
