"""The database side of the lifecycle: lock the rows by the database's clock, re-check, act.

Knows nothing of Redis, and nothing of any one kind: it takes a kind's keys
and reports what became of each (an ``Outcome``), so the caller can ack,
reschedule or retry. Whether a row is due is decided by the database server's
clock, in the statement that locks it: a caller whose own clock runs fast can
be late, never early.

One transaction locks the batch's rows (``SELECT ... FOR UPDATE SKIP LOCKED``),
the kind re-checks each under the lock and acts on the due ones with no
savepoint (its UPDATE and its receivers): a few statements per batch. When
that fails, the batch climbs a ladder of ways to be acted on (``_Ladder``),
each named for the failure it answers: a receiver refused a key, so the
whole transaction runs again with that key apart and the rest in one
savepoint; the rest failed too, so again with a savepoint per key; the batch
failed as a whole (with no key to blame), so each key alone, in a
transaction of its own. A key whose receiver refuses fails alone. A lock
conflict (deadlock, lock wait timeout), in the lock or in a receiver, is the
database's: the transaction is tried again at once, then the keys are
reported busy. A receiver's lost connection is the database's too: the error
is raised and nothing was acted on.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from django.db import Error as DatabaseError, OperationalError, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from ..db.errors import is_lock_conflict
from ..db.session import limit_transaction
from ..db.two_trips import takes_two_trips, two_trips as in_two_trips
from ..redaction import one_line
from .outcome import Due, Key, Outcome
from .receivers import ReceiverFailed, cause

if TYPE_CHECKING:
    from .kind import Kind

logger = logging.getLogger("order_timeout")

# A lock conflict is tried again at once this many times in all, pausing a
# random 5-50 ms (times the attempt) in between so two colliding transactions
# do not collide again in step.
LOCK_CONFLICT_ATTEMPTS = 5
LOCK_CONFLICT_PAUSE = (0.005, 0.05)

T = TypeVar("T")


def act_on(kind: Kind, keys: Sequence[Key], *, should_stop: Callable[[], bool] | None = None,
           progress: Callable[[], None] | None = None) -> Outcome:
    """Act on the keys among ``keys`` that are still due by the database's clock; report each.

    ``should_stop`` is asked before every transaction after the first; once it
    says yes, the keys not yet looked at are reported abandoned. ``progress``
    is called each time a key's receivers have run (a watchdog tells a slow
    batch from a stuck one by it). Raises a database error only when the
    database stops answering: nothing was acted on, the caller retries later.
    """
    stopping = should_stop or (lambda: False)
    if kind.acts_outside_transaction:
        return _act_outside(kind, keys, stopping, progress)
    return _Ladder(kind, stopping, progress).climb(keys)


# -- the ladder: the ways to act on a batch, each answering the failure of the way before -----------


Refusals = dict[Key, BaseException]
Way = Callable[[Sequence[Key], Refusals, "Exception | None"], Outcome]


class _Refused(Exception):
    """The key's error, not the batch's: a receiver refused it."""

    def __init__(self, refused: dict[Key, BaseException]) -> None:
        super().__init__(refused)
        self.refused = refused


class _ActFailed(Exception):
    """The act of several keys failed, not in a receiver and not the database's: no key to blame."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(error)
        self.error = error


class _Ladder:
    """One batch's ways to be acted on, tried in turn by ``climb``, each named for the failure it
    answers. Whose error a failure is (the key's, the act's, the database's) is decided once, where
    the act raises it (``_act_on_all``) or where a way gives it up (``_whose``)."""

    def __init__(self, kind: Kind, stopping: Callable[[], bool], progress: Callable[[], None] | None) -> None:
        self.kind, self.using, self.stopping, self.progress = kind, kind.using, stopping, progress
        # (the way, the failures it answers), in order: after a failure, the next way that answers it.
        self.ways: list[tuple[Way, tuple[type[Exception], ...]]] = [
            (self.all_at_once, ()),                             # first: nothing failed yet
            (self.the_refused_apart, (_Refused,)),              # a receiver refused a key
            (self.a_savepoint_each, (_Refused, _ActFailed)),    # after a refusal, the rest's act failed too
            (self.one_key_at_a_time, (Exception,)),             # the batch failed as a whole
        ]

    def climb(self, keys: Sequence[Key], *, alone: bool = False) -> Outcome:
        """The first way, then each failure's answer, until one acts. ``alone``: a key on its own (one
        key at a time's), whose failure past the savepoints is raised, to be counted against it."""
        ways = self.ways[:-1] if alone else self.ways
        refused: dict[Key, BaseException] = {}
        failure: Exception | None = None
        rung = 0
        while True:
            way = ways[rung][0]
            try:
                return _moments_of_acted(way(keys, refused, failure))
            except _StillConflicting:
                return Outcome(busy=list(keys))
            except _Stopped:
                return Outcome(abandoned=list(keys))
            except Exception as exc:
                failure = self._whose(exc)
            if isinstance(failure, _Refused):
                refused.update(failure.refused)
            rung = next((later for later in range(rung + 1, len(ways))
                         if isinstance(failure, ways[later][1])), len(ways))
            if rung == len(ways):
                raise failure
            if self.stopping():
                return Outcome(abandoned=list(keys))

    def _whose(self, error: Exception) -> Exception:
        """A failure that left a way: raised when it is the database's (the caller's transaction is
        broken, or the database stopped answering); otherwise the failure the next way answers."""
        if isinstance(error, (_Refused, _ActFailed)):
            return error
        connection = connections[self.using]
        if connection.in_atomic_block:
            raise error  # the caller's transaction is broken too; only the caller can roll it back
        if not _database_answers(connection):
            raise _unreachable(error)
        return error

    # -- the ways, in the order they are tried ---------------------------------------------------

    def all_at_once(self, keys: Sequence[Key], refused: Refusals, failure: Exception | None) -> Outcome:
        """The fast path: one transaction, the act on every due key with no savepoint."""
        # A batch that runs none of the shop's code: BEGIN with its reads, its writes with COMMIT.
        in_two_trips = self.kind.acts_in_two_trips() and takes_two_trips(self.using)
        try:
            return self._in_a_transaction(keys, self._act_on_all, two_trips=in_two_trips)
        except _ActFailed as act_failed:
            raise act_failed.error from act_failed.error.__cause__  # no key to blame: the batch failed as a whole

    def the_refused_apart(self, keys: Sequence[Key], refused: Refusals, failure: Exception | None) -> Outcome:
        """A receiver refused: the whole batch again, the refused keys failed, the rest in one savepoint."""
        def act(due: list[Due], now: datetime, outcome: Outcome) -> None:
            rest = _fail_refused(due, refused, outcome)
            if rest:
                with transaction.atomic(using=self.using):
                    self._act_on_all(rest, now, outcome)
        return self._in_a_transaction(keys, act)

    def a_savepoint_each(self, keys: Sequence[Key], refused: Refusals, failure: Exception | None) -> Outcome:
        """After a refusal, the rest's act failed too (another refusal, or with no key to blame): again,
        a savepoint per key, so a failing key fails alone."""
        def act(due: list[Due], now: datetime, outcome: Outcome) -> None:
            for item in _fail_refused(due, refused, outcome):
                try:
                    with transaction.atomic(using=self.using):
                        self._act_on_all([item], now, outcome)
                except _Refused as refusal:
                    outcome.failed.update(refusal.refused)
                except _ActFailed as act_failed:
                    outcome.failed[item[0]] = cause(act_failed.error)
        return self._in_a_transaction(keys, act)

    def one_key_at_a_time(self, keys: Sequence[Key], refused: Refusals, failure: Exception | None) -> Outcome:
        """The batch failed as a whole (its act with no key to blame, or its lock, its judge, its
        commit): each key alone, up the same ways, in a transaction of its own. A batch of one too: an
        error that was the database's (a connection a receiver lost) is counted against a key only
        when it comes back for it alone."""
        assert failure is not None
        if len(keys) > 1:
            logger.warning("%s: a batch of %d failed as a whole (%s: %s); acting on its keys one by one.",
                           self.kind.label, len(keys), type(failure).__name__, one_line(cause(failure)))
        else:
            logger.warning("%s: acting on %s failed (%s: %s); trying it once more.", self.kind.label,
                           self.kind.describe(keys[0]), type(failure).__name__, one_line(cause(failure)))
        outcome = Outcome()
        for index, key in enumerate(keys):
            if self.stopping():
                outcome.abandoned += keys[index:]
                break
            try:
                alone = self.climb([key], alone=True)
            except Exception as exc:
                if not _database_answers(connections[self.using]):
                    raise _unreachable(exc)  # noqa: B904 (_unreachable chains the cause itself)
                outcome.failed[key] = cause(exc)
                continue
            outcome.merge(alone)
            if alone.abandoned:
                outcome.abandoned += keys[index + 1:]
                break
        return outcome

    # -- what every way does ----------------------------------------------------------------------

    def _in_a_transaction(self, keys: Sequence[Key], act: Callable[[list[Due], datetime, Outcome], None], *,
                          two_trips: bool = False) -> Outcome:
        """One transaction (tried again on a lock conflict): lock the rows, judge each, ``act`` on the due.
        ``two_trips``: kept by db/two_trips.py, not by ``atomic`` (the act runs none of the shop's code)."""
        def once() -> Outcome:
            outcome = Outcome()
            if not keys:
                return outcome
            # The base manager: a shop's default manager may hide rows (soft delete, tenants).
            manager = self.kind.model._base_manager.db_manager(self.using)
            with in_two_trips(self.using) if two_trips else transaction.atomic(using=self.using):
                limit_transaction(self.using)  # under transaction pooling only: the limits, for this transaction
                due = _lock_and_judge(self.kind, keys, manager, outcome)
                if due:
                    assert outcome.db_now is not None  # a row was locked, so the database's clock was read
                    act(due, outcome.db_now, outcome)
            return outcome
        return _retrying_lock_conflicts(self.using, once, self.stopping, self.kind.wording.doing)

    def _act_on_all(self, due: list[Due], now: datetime, outcome: Outcome) -> None:
        """The kind's act on ``due``, whose error it is decided here: a lock conflict or a lost session is
        the database's (a receiver's raised as the driver's error, which says why); a receiver's refusal
        the key's (``_Refused``); any other failure of the act (its UPDATE) the act's (``_ActFailed``)."""
        try:
            self.kind.act(due, now, self.progress)
        except ReceiverFailed as failure:
            if _databases(failure.error, self.using):
                raise failure.error from failure.error.__cause__
            raise _Refused({failure.key: failure.error}) from failure.error
        except Exception as exc:
            if _databases(cause(exc), self.using):
                raise
            raise _ActFailed(exc) from exc
        _acted(outcome, due)

def _fail_refused(due: list[Due], refused: Refusals, outcome: Outcome) -> list[Due]:
    """The refused keys among ``due`` failed (their try is over); the rest, to act on."""
    outcome.failed.update({key: refused[key] for key, _row in due if key in refused})
    return [(key, row) for key, row in due if key not in refused]


def _unreachable(error: Exception) -> DatabaseError:
    """The error to raise when the database stopped answering: always a database error."""
    if isinstance(error, DatabaseError):
        return error
    wrapped = OperationalError(f"the database stopped answering: {error}")
    wrapped.__cause__ = error
    return wrapped


def _database_answers(connection: BaseDatabaseWrapper) -> bool:
    """Reconnect if needed; False when the database cannot be reached."""
    try:
        connection.close_if_unusable_or_obsolete()
        connection.ensure_connection()
        return connection.is_usable()
    except DatabaseError:
        return False


def _databases(error: BaseException, using: str) -> bool:
    """Whether an act's error is the database's, not the key's: the savepoint could not be
    rolled back, a lock conflict, or the server ended the session."""
    return (transaction.get_connection(using).needs_rollback or is_lock_conflict(error)
            or (isinstance(error, DatabaseError) and not connections[using].is_usable()))


def _act_outside(kind: Kind, keys: Sequence[Key], stopping: Callable[[], bool],
                 progress: Callable[[], None] | None) -> Outcome:
    """A kind that calls the outside world: lock, judge and ``begin`` in one short transaction, then
    ``deliver`` with none open, each key failing alone. Raises a database error only when the
    database stops answering."""
    using = kind.using

    def locked() -> tuple[Outcome, list[Due]]:
        outcome = Outcome()
        if not keys:
            return outcome, []
        with transaction.atomic(using=using):
            limit_transaction(using)
            due = _lock_and_judge(kind, keys, kind.model._base_manager.db_manager(using), outcome)
            if due:
                assert outcome.db_now is not None
                kind.begin(due, outcome.db_now)
        return outcome, due

    try:
        outcome, due = _retrying_lock_conflicts(using, locked, stopping, kind.wording.doing)
    except _StillConflicting:
        return Outcome(busy=list(keys))
    except _Stopped:
        return Outcome(abandoned=list(keys))
    except Exception as exc:
        if not _database_answers(connections[using]):
            raise _unreachable(exc)  # noqa: B904 (_unreachable chains the cause itself)
        if stopping():
            # Given up for time in its transaction: the guard ended the session (the error is that
            # ending), nothing was delivered, and its keys are handed over, as an act in one
            # transaction abandons them.
            return Outcome(abandoned=list(keys))
        raise
    if due:
        assert outcome.db_now is not None
        failed = kind.deliver(due, outcome.db_now, progress)
        outcome.failed.update(failed)
        _acted(outcome, [(key, row) for key, row in due if key not in failed])
    return _moments_of_acted(outcome)


def _lock_and_judge(kind: Kind, keys: Sequence[Key], manager: Any, outcome: Outcome) -> list[Due]:
    """In the caller's transaction: lock the rows (one statement, which reads the database's clock),
    judge each key under the lock (``outcome``: what else each is), return the due ones."""
    locked = kind.lock(manager, kind.rows_of(keys))
    due = kind.judge(keys, locked, outcome)
    if outcome.settled:
        # A row no longer pending needs its deadline no more (deadlines in the app's table go).
        kind.deadlines.done(manager, kind.rows_of(outcome.settled))
    return due


def _acted(outcome: Outcome, due: list[Due]) -> None:
    if not outcome.passed:
        outcome.acted.extend([key for key, _row in due])
        return
    passed = set(outcome.passed)
    outcome.acted.extend([key for key, _row in due if key not in passed])


def _moments_of_acted(outcome: Outcome) -> Outcome:
    """Only the acted-on keys' moments are kept (their lateness): judge gave every due key one."""
    if len(outcome.moments) != len(outcome.acted):
        acted = set(outcome.acted)
        outcome.moments = {key: moment for key, moment in outcome.moments.items() if key in acted}
    return outcome


class _StillConflicting(Exception):
    """Every immediate retry met a lock conflict too."""


class _Stopped(Exception):
    """The caller asked to stop before a retry."""


def _retrying_lock_conflicts(using: str, act: Callable[[], T], stopping: Callable[[], bool],
                             what: str = "closing") -> T:
    """Run ``act`` (a whole transaction); on a lock conflict, wait a few random ms and run it again.

    Raises ``_StillConflicting`` when every attempt conflicted, ``_Stopped``
    when the caller asked to stop between attempts.
    """
    connection = connections[using]
    for attempt in range(1, LOCK_CONFLICT_ATTEMPTS + 1):
        try:
            return act()
        except Exception as exc:
            if not is_lock_conflict(exc) or connection.in_atomic_block:
                raise
            logger.info("Lock conflict while %s (%s); trying again at once (%d/%d).",
                        what, one_line(exc), attempt, LOCK_CONFLICT_ATTEMPTS)
            if stopping():
                raise _Stopped from exc
            if attempt < LOCK_CONFLICT_ATTEMPTS:
                time.sleep(random.uniform(*LOCK_CONFLICT_PAUSE) * attempt)
    raise _StillConflicting
