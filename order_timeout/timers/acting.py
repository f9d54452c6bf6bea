"""The database side of the lifecycle: lock the rows by the database's clock, re-check, act.

Knows nothing of Redis, and nothing of any one kind: it takes a kind's keys
and reports what became of each (an ``Outcome``), so the caller can ack,
reschedule or retry. Whether a row is due is decided by the database server's
clock, in the statement that locks it: a caller whose own clock runs fast can
be late, never early.

One transaction locks the batch's rows (``SELECT ... FOR UPDATE SKIP LOCKED``),
the kind re-checks each under the lock and acts on the due ones with no
savepoint (its UPDATE and its receivers): a few statements per batch. If a
receiver refuses, the whole transaction is rolled back and run again without
that key, the others in a savepoint, and if another refuses too one savepoint
each, so a key whose receiver refuses fails alone. A batch that fails as a
whole for another reason, while the database still answers, is tried again a
key at a time. A lock conflict (deadlock, lock wait timeout), in the lock or in
a receiver, is the database's: the transaction is tried again at once, then the
keys are reported busy. A receiver's lost connection is the database's too:
the error is raised and nothing was acted on.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from django.db import Error as DatabaseError, OperationalError, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from ..db.errors import is_lock_conflict
from ..db.session import limit_transaction
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
    using = kind.using
    connection = connections[using]
    stopping = should_stop or (lambda: False)
    if kind.acts_outside_transaction:
        return _act_outside(kind, keys, stopping, progress)

    def attempt(keys: Sequence[Key]) -> Outcome:
        """The fast path; if a receiver refused, the whole batch again, carefully."""
        try:
            return _retrying_lock_conflicts(using, lambda: _transaction(kind, keys, using, progress=progress),
                                            stopping, kind.doing)
        except _Refused as refusal:
            if stopping():
                raise _Stopped from refusal
            refused = refusal.refused
        return _retrying_lock_conflicts(
            using, lambda: _transaction(kind, keys, using, refused=refused, progress=progress), stopping,
            kind.doing)

    try:
        return attempt(keys)
    except _StillConflicting:
        return Outcome(busy=list(keys))
    except _Stopped:
        return Outcome(abandoned=list(keys))
    except Exception as exc:
        batch_error = exc
    if connection.in_atomic_block:
        # The caller's transaction is broken too; only the caller can roll it back.
        raise batch_error
    if not _database_answers(connection):
        raise _unreachable(batch_error)
    outcome = Outcome()
    if stopping():
        outcome.abandoned = list(keys)
        return outcome
    # One more try for each key alone, a batch of one too: an error that was the database's (a
    # connection a receiver lost) is counted against a key only when it comes back for it alone.
    if len(keys) > 1:
        logger.warning("%s: a batch of %d failed as a whole (%s: %s); acting on its keys one by one.",
                       kind.label, len(keys), type(batch_error).__name__, one_line(cause(batch_error)))
    else:
        logger.warning("%s: acting on %s failed (%s: %s); trying it once more.", kind.label,
                       kind.describe(keys[0]), type(batch_error).__name__, one_line(cause(batch_error)))
    for index, key in enumerate(keys):
        if stopping():
            outcome.abandoned += keys[index:]
            break
        try:
            outcome.merge(attempt([key]))
        except _StillConflicting:
            outcome.busy.append(key)
        except _Stopped:
            outcome.abandoned += keys[index:]
            break
        except Exception as exc:
            if not _database_answers(connection):
                raise _unreachable(exc)  # noqa: B904 (_unreachable chains the cause itself)
            outcome.failed[key] = cause(exc)
    return outcome


class _Refused(Exception):
    """A receiver refused in the fast path: the batch is rolled back, to be acted on with savepoints."""

    def __init__(self, refused: dict[Key, BaseException]) -> None:
        super().__init__(refused)
        self.refused = refused


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
    """Whether a receiver's error is the database's, not the key's: the savepoint could not be
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
        outcome, due = _retrying_lock_conflicts(using, locked, stopping, kind.doing)
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


def _transaction(kind: Kind, keys: Sequence[Key], using: str, refused: dict[Key, BaseException] | None = None,
                 progress: Callable[[], None] | None = None) -> Outcome:
    """One transaction: lock, re-check and act on ``keys``; ``refused``: the careful second pass."""
    outcome = Outcome()
    if not keys:
        return outcome
    # The base manager: a shop's default manager may hide rows (soft delete, tenants).
    manager = kind.model._base_manager.db_manager(using)
    with transaction.atomic(using=using):
        limit_transaction(using)  # under transaction pooling only: the limits, for this transaction
        due = _lock_and_judge(kind, keys, manager, outcome)
        if not due:
            return outcome
        now = outcome.db_now
        assert now is not None  # a row was locked, so the database's clock was read
        if refused is None:
            try:
                kind.act(due, now, progress)
            except ReceiverFailed as failure:
                if _databases(failure.error, using):
                    raise failure.error from failure.error.__cause__  # keep the driver's error: it says why
                raise _Refused({failure.key: failure.error}) from failure.error
            _acted(outcome, due)
            return outcome
        outcome.failed.update({key: refused[key] for key, _row in due if key in refused})
        due = [(key, row) for key, row in due if key not in refused]
        if due:
            try:
                with transaction.atomic(using=using):
                    kind.act(due, now, progress)
            except ReceiverFailed as failure:
                if _databases(failure.error, using):
                    raise failure.error from failure.error.__cause__
                # This key's try has failed; the rest of the batch goes on.
                outcome.failed[failure.key] = failure.error
                _one_by_one(kind, [item for item in due if item[0] != failure.key], now, outcome, using, progress)
            except Exception as exc:
                if _databases(cause(exc), using):
                    raise
                _one_by_one(kind, due, now, outcome, using, progress)
            else:
                _acted(outcome, due)
    return _moments_of_acted(outcome)


def _one_by_one(kind: Kind, due: list[Due], now: Any, outcome: Outcome, using: str,
                progress: Callable[[], None] | None) -> None:
    """Act on each key in a savepoint of its own, so a failing one fails alone."""
    for item in due:
        try:
            with transaction.atomic(using=using):
                kind.act([item], now, progress)
        except Exception as exc:
            error = cause(exc)
            if _databases(error, using):
                raise error from error.__cause__
            outcome.failed[item[0]] = error
        else:
            _acted(outcome, [item])


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
