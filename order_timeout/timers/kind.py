"""A kind of timer as the engine reads it: what the lifecycle asks of every kind, written once.

The lifecycle (claim -> lock by the database's clock -> judge -> act -> settle:
ack, reschedule, busy, held, retry with backoff, takeover limit, give up,
watchdog, one-by-one fallback) lives in ``lifecycle`` and ``acting``; a
``Kind`` answers its questions: which rows, where their deadlines live, how
members name them, the judge under the lock, the act, what giving up records.
The app's own kinds subclass it (``closes.OrderTimeout``, ``reminders.Reminders``,
``notices.Notices``); a timer a shop declares (``declaration.Timer``) is read
through ``Declared``, which takes its attributes and hooks from the declaration
and nothing else from it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from functools import partial
from typing import Any, ClassVar

from django.db import models, router
from django.db.models import Q

from ..conf import settings
from ..db.columns import auto_now_values
from ..db.keys import KeysIn
from ..db.locks import LockedOrders, lock_orders
from ..reporting.wording import Wording
from .deadlines import ColumnDeadlines, DeadlineStore, OutsideDeadlines
from .declaration import ATTRIBUTES, NOW, SETTING, Declarable, Timer
from .members import deadline_score, integer_keys, now_score, order_member, parse_member
from .outcome import Due, Key, Outcome
from .receivers import run_batch_receiver

# Hooks that read a batch's rows as the model's instances: a kind that has its own takes them.
_TAKING_INSTANCES = ("fire", "is_pending", "judge", "act")


class Kind(Declarable):
    """One kind of timed transition, as the lifecycle reads it; the defaults are a plain timer's."""

    # What it moves: the declared attributes and their defaults, from ``declaration.Declarable``
    # (docs/timers.md says what each means). A declared timer's are its declaration's
    # (``Declared``); the app's kinds set or compute their own.

    # Seconds a consumer lets this kind's due members gather between two claims that do not come
    # back full (``lanes.ShardRota``): for work that may come a little late (the reminders), so
    # the closes do not wait behind a batch of a few of them every turn. 0: claimed when due.
    gathers: float = 0.0

    def deadline_for(self, row: Any) -> datetime | None:
        """The deadline a save gives a row that starts waiting (``deadline = None``); None: none."""
        return None

    def fire(self, rows: list[Any], now: datetime) -> None:
        """The batch's receiver, after the UPDATE, in the same transaction."""

    def waits(self, row: Any) -> bool:
        """Whether a row in hand may still be acted on (its loaded fields; the lock decides)."""
        return True

    def public_name(self, row: Any) -> str:
        """The row as people and API clients know it (a refusal's message, a refused write)."""
        public = getattr(row, "timeout_public_name", None)
        return str(public()) if callable(public) else str(row.pk)

    # -- how the lifecycle reads it (the app's kinds override some) ---------------------------

    # The queue's kind of timer in Redis (the key namespace); the name unless a kind says so.
    queue_name: ClassVar[str | None] = None
    # A kind whose act calls the outside world (the notices: SMTP, webhooks) says so: its rows are
    # locked, judged and ``begin()``-ed in a short transaction, and ``deliver()`` runs after it
    # commits, with no transaction and no row lock held across a slow call.
    acts_outside_transaction: ClassVar[bool] = False
    # Most members one claim of this kind takes (None: BATCH_SIZE): a kind whose act waits on
    # the outside world takes no more than it acts on at once.
    claim_limit: ClassVar[int | None] = None

    def __init__(self) -> None:
        self.deadlines: DeadlineStore = (OutsideDeadlines(self) if self.deadline is None
                                         else ColumnDeadlines(self.deadline))

    def __repr__(self) -> str:
        return f"<timer {self.name!r} of {self.model._meta.label}>"

    @property
    def key_space(self) -> str:
        return self.name if self.queue_name is None else self.queue_name

    @property
    def wording(self) -> Wording:
        """How it reads in log lines, reports and metrics (reporting/wording.py): a timer's, by its name."""
        return Wording(label=self.name)

    @property
    def label(self) -> str:
        """Its name in every log line and report: "close", "reminders", "notices", a timer's name."""
        return self.wording.label

    def describe(self, key: Key) -> str:
        """A key in a log line."""
        return f"{self.model._meta.model_name}={key}"

    @property
    def using(self) -> str:
        return router.db_for_write(self.model)

    def validate(self) -> None:
        """``ImproperlyConfigured`` when a condition does not compile against the model (check E017
        says the same at start-up): a consumer refuses to run rather than fail every due row."""
        from django.core.exceptions import ImproperlyConfigured

        from ..db.locks import compiles

        for attribute in ("pending", "hold", "settled"):
            condition = getattr(self, attribute)
            problem = None if condition is None or condition == Q() else compiles(self.model, condition)
            if problem:
                raise ImproperlyConfigured(f"{self!r}.{attribute} does not fit {self.model._meta.label}: {problem}")

    # -- from the shop's side ----------------------------------------------------------------

    def schedule(self, rows: Any) -> None:
        """Make Redis follow these rows after commit (after ``bulk_create()`` or ``update()``,
        which send no signals; a save does it by itself)."""
        from .syncing import follow

        follow([self], rows)

    def unschedule(self, rows: Any) -> None:
        """Take these rows off this timer's queue after commit."""
        from .syncing import forget

        forget([self], rows)

    def set_deadline(self, row: Any, at: datetime | None) -> None:
        """Give ``row`` (an instance or a primary key) its deadline ``at``, or take it away (None),
        and schedule it after commit: for a timer whose deadlines live in the app's table."""
        if not isinstance(self.deadlines, OutsideDeadlines):
            raise TypeError(f"{self!r} reads its deadlines from {self.model._meta.label}.{self.deadline}: "
                            "set that field and save the row.")
        self.deadlines.set(row, at)

    # -- members -----------------------------------------------------------------------------

    def member(self, key: Key) -> str:
        return order_member(self.model, key)

    def parse(self, member: str) -> Key:
        """The key a member names; ``ValueError`` when it names none (it goes to the quarantine)."""
        return self.parser()(member)

    def parser(self) -> Callable[[str], Key]:
        """``parse`` with the model looked up once, for a claim's hundreds of members."""
        return partial(parse_member, self.model)

    def keys_of(self, members: Sequence[str]) -> tuple[dict[Key, str], list[str]]:
        """Each member by the key it names, and the members that name none (for the quarantine)."""
        if type(self).parser is Kind.parser:
            keys = integer_keys(self.model, members)
            if keys is not None:
                return dict(zip(keys, members, strict=True)), []
        parse = self.parser()
        by_key: dict[Key, str] = {}
        malformed: list[str] = []
        for member in members:
            try:
                by_key[parse(member)] = member
            except ValueError:
                malformed.append(member)
        return by_key, malformed

    def row_of(self, key: Key) -> Any:
        """The primary key of the row to lock for ``key``."""
        return key

    def rows_of(self, keys: Sequence[Key]) -> list[Any]:
        """``row_of`` each key (the keys themselves, when they are the rows' keys)."""
        return list(keys) if type(self).row_of is Kind.row_of else [self.row_of(key) for key in keys]

    def follow(self, row: Any) -> tuple[dict[str, int], list[str]]:
        """What Redis must hold for ``row`` as it is now: ``({member: score}, [members to forget])``."""
        member = self.member(row.pk)
        deadline = self.deadlines.of(row)
        if deadline is None or not self.waits(row):
            return {}, [member]
        return {member: deadline_score(deadline)}, []

    @property
    def follows_saves(self) -> bool:
        """Whether saves give rows their deadlines (``deadline_for`` declared on an outside timer)."""
        return False

    def scores(self, rows: Sequence[tuple[Any, datetime]]) -> dict[str, int]:
        """The members and scores of rows ``(pk, deadline)`` waiting for their deadline."""
        return {self.member(pk): deadline_score(deadline) for pk, deadline in rows}

    # -- under the lock ---------------------------------------------------------------------

    def hold_condition(self) -> Q | None:
        return self.hold

    def settled_condition(self) -> Q | None:
        return self.settled

    def longest_hold(self) -> timedelta | None:
        seconds = settings.MAX_HOLD if self.max_hold is SETTING else self.max_hold
        return None if seconds is None else timedelta(seconds=seconds)

    def takes_instances(self) -> bool:
        """Whether this batch's rows must be the model's instances: when the kind declares a
        ``fire()`` (it takes them), or a re-check or act of its own (it may read any field).
        Otherwise the rows are locked as their keys and the columns the re-check reads, and no
        instance is built. Asked once a batch."""
        # Asked of this instance: a method set on it (a test's, a plugin's) counts as declared.
        return any(getattr(getattr(self, name), "__func__", None) is not getattr(Kind, name)
                   for name in _TAKING_INSTANCES)

    def acts_in_two_trips(self) -> bool:
        """Whether a batch's act is its statements alone, running none of the shop's code (no
        receiver, no ``fire``): then its transaction may take two round trips, BEGIN with its
        reads and its writes with COMMIT (db/two_trips.py). Asked once a batch."""
        return False

    def lock(self, manager: Any, pks: Sequence[Any]) -> LockedOrders:
        """Lock the rows (one SELECT, the database's clock on it), and learn their deadlines."""
        columns: tuple[str, ...] | None = None
        if not self.takes_instances():
            columns = (self.deadline,) if self.deadline is not None else ()
        locked = lock_orders(manager, pks, hold=self.hold_condition(),
                             pending=None if self.pending == Q() else self.pending,
                             settled=self.settled_condition(), columns=columns)
        locked.deadlines = self.deadlines.read(manager, locked)
        return locked

    def is_pending(self, row: Any, locked: LockedOrders) -> bool:
        """Whether a locked instance still meets ``pending`` (rows locked as tuples: ``locked.pending``)."""
        return row.pk in locked.pending

    def judge(self, keys: Sequence[Key], locked: LockedOrders, outcome: Outcome) -> list[Due]:
        """Sort the keys under the lock: the due ones (returned, with their rows) and the rest."""
        now = outcome.db_now = locked.db_now
        rows, deadlines = locked.rows, locked.deadlines
        longest = self.longest_hold()
        if (now is not None and not locked.instances
                and len(rows) == len(keys) == len(locked.pending) == len(deadlines)
                and not (locked.busy or locked.settled) and None not in deadlines.values()
                and max(deadlines.values()) <= now):
            # The burst's batch: every row found, pending, with a deadline and due. Told by a few
            # operations over the whole batch, not a look at each row; the held ones (a payment in
            # flight, within its longest hold) set apart as a set.
            if not locked.held:
                outcome.moments = dict(deadlines)
                return [(key, rows[key]) for key in keys]
            held = {key for key in locked.held if longest is None or now < deadlines[key] + longest}
            outcome.held.update((key, deadlines[key]) for key in keys if key in held)
            outcome.moments = {key: deadline for key, deadline in deadlines.items() if key not in held}
            return [(key, rows[key]) for key in keys if key not in held]
        pending = None if locked.instances else locked.pending
        due: list[Due] = []
        for key in keys:
            row = rows.get(key)
            deadline = deadlines.get(key)
            if key in locked.busy:
                outcome.busy.append(key)
            elif row is None:
                outcome.missing.append(key)
            elif deadline is None or (key not in pending if pending is not None else not self.is_pending(row, locked)):
                outcome.settled.append(key)
            elif now is None or deadline > now:
                outcome.not_due[key] = deadline
            elif key in locked.settled:
                outcome.kept[key] = deadline
            elif key in locked.held and (longest is None or now < deadline + longest):
                outcome.held[key] = deadline
            else:
                due.append((key, row))
                outcome.moments[key] = deadline
        return due

    def written(self, now: datetime) -> dict[str, Any]:
        """What the act's UPDATE writes: ``values``, ``NOW`` as the database's time, and the
        model's ``auto_now`` fields (a bare UPDATE would leave them stale), unless ``values``
        names them."""
        values = {name: now if value is NOW else value for name, value in self.values.items()}
        return {**auto_now_values(self.model, now), **values}

    def act(self, due: list[Due], now: datetime, progress: Any = None) -> None:
        """One UPDATE for the batch, then ``fire`` (rows locked as instances); the deadlines are done."""
        pks = self.rows_of([key for key, _row in due])
        values = self.written(now) if self.values else {}
        manager = self.model._base_manager.db_manager(self.using)
        if values:
            # Locked and judged due by the database's clock: the condition cannot change now.
            manager.filter(self.pending, KeysIn(pks)).update(**values)
        if isinstance(due[0][1], models.Model):
            rows = [row for _key, row in due]
            for row in rows:
                for name, value in values.items():
                    setattr(row, name, value)
            run_batch_receiver(lambda: self.fire(rows, now))
        self.deadlines.done(manager, pks)
        if progress is not None:
            progress()

    def begin(self, due: list[Due], now: datetime) -> None:
        """``acts_outside_transaction``: what the lock's transaction writes before ``deliver()``."""

    def deliver(self, due: list[Due], now: datetime, progress: Any = None) -> dict[Key, BaseException]:
        """``acts_outside_transaction``: act on ``due`` with no transaction open; the failures, by key."""
        raise NotImplementedError(f"{self!r} acts inside the transaction (act())")

    # -- giving up, looking again -----------------------------------------------------------

    def retry_delays(self) -> list[float] | None:
        """Seconds before each retry of a failed act (None: the setting RETRY_DELAYS)."""
        return None

    def gives_up_at_once(self, error: BaseException) -> bool:
        """Whether ``error`` makes a retry pointless (a target that refused for good): given up now."""
        return False

    def give_up(self, failures: Sequence[Any], now: datetime) -> Any:
        """Record the keys whose act kept failing (a dead letter each, for staff); a ``Burial``."""
        from .giving_up import bury

        return bury(self, failures, now)

    def settled_recheck_ms(self, now: datetime) -> int:
        """When to look at a row its settled condition settles again: HOLD_RECHECK from now (it is
        never acted on while settled, so no longest hold caps it)."""
        return now_score(now) + round(1000 * settings.HOLD_RECHECK)

    def recheck_ms(self, deadline: datetime, now: datetime) -> int:
        """When to look at a held row again: HOLD_RECHECK from now, not past its longest hold."""
        recheck = now_score(now) + round(1000 * settings.HOLD_RECHECK)
        longest = self.longest_hold()
        return recheck if longest is None else min(recheck, deadline_score(deadline + longest))

    # -- when its rows fall due (what the scans walk: scans/walks.py) ----------------------------

    # A kind whose act is moot once the row's deadline passed (a reminder) says so: the scan's
    # overdue walk passes it by (the close scan closes the row).
    moot_past_deadline: ClassVar[bool] = False

    def falls_due_early(self) -> timedelta:
        """How long before its row's deadline a member may fall due (a reminder's longest lead)."""
        return timedelta(0)


class Declared(Kind):
    """A timer a shop declared, as the engine reads it: what it moves, its hooks and its name all
    come from the declaration (an instance of the shop's ``Timer`` subclass), read each time."""

    def __init__(self, declaration: Timer) -> None:
        self.declaration = declaration
        declaration._kind = self  # what its schedule(), unschedule() and set_deadline() go through
        super().__init__()

    def fire(self, rows: list[Any], now: datetime) -> None:
        self.declaration.fire(rows, now)

    def waits(self, row: Any) -> bool:
        return self.declaration.waits(row)

    def deadline_for(self, row: Any) -> datetime | None:
        return self.declaration.deadline_for(row)

    def public_name(self, row: Any) -> str:
        return str(self.declaration.public_name(row))

    @property
    def declares_fire(self) -> bool:
        """Whether the shop wrote a ``fire()`` (a receiver of the batch's instances)."""
        return type(self.declaration).fire is not Timer.fire

    @property
    def follows_saves(self) -> bool:
        return self.deadline is None and type(self.declaration).deadline_for is not Timer.deadline_for

    def takes_instances(self) -> bool:
        """Instances when the shop's ``fire()`` takes them, or a hook was set on this kind itself
        (a test's, a plugin's: it may read any field)."""
        return self.declares_fire or any(name in self.__dict__ for name in _TAKING_INSTANCES)


def _read_from_the_declaration(name: str) -> property:
    def read(kind: Declared) -> Any:
        return getattr(kind.declaration, name)
    return property(read)


# Each declared attribute read from the declaration, each time (a test or a shop may change it).
for _name in ATTRIBUTES:
    setattr(Declared, _name, _read_from_the_declaration(_name))
