"""What a shop declares: one timed transition of one model's rows, and nothing of the engine.

The class a shop subclasses holds the names docs/timers.md documents, and no other public
name (``tests/test_timer_declaration.py`` holds the two to each other), as a ``ModelAdmin``
or a Celery task does: a subclass cannot shadow an engine step by accident, and a reader of
the class meets only what a shop may say. The engine (``kind.Declared``) reads it::

    # shop/timers.py (found by the app at start-up, as admin.py is)
    from django.db.models import Q
    from order_timeout import timers

    @timers.register(StockReservation)
    class ReservationLapses(timers.Timer):
        name = "reservation-lapses"
        deadline = "expires_at"                 # a column of the model (None: the app's own table)
        pending = Q(state="held")               # the row must still meet it under its lock
        values = {"state": "released", "released_at": timers.NOW}   # one UPDATE per batch
        hold = Q(checkout__state="completing")  # optional: held, looked at again

        def fire(self, rows, now):              # optional: in the same transaction
            release_stock(rows)
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, ClassVar

from django.db import models
from django.db.models import Q


class _Now:
    """In ``Timer.values``: the database's time when the rows were locked."""

    def __repr__(self) -> str:
        return "timers.NOW"


NOW = _Now()
# ``Timer.max_hold`` left to the setting ``MAX_HOLD``.
SETTING: Any = object()


class Declarable:
    """What a timer moves and how: the attributes a shop declares on a ``Timer`` (docs/timers.md),
    with their defaults, listed here once. ``Timer`` takes them from here, and so does the
    engine's ``Kind`` (whose ``Declared`` reads each from the declaration: ``ATTRIBUTES``)."""

    # The model whose rows it moves (set by ``register``).
    model: ClassVar[type[models.Model]]
    # Unique among the timers; the Redis keys' namespace ({prefix}:<name>:pending) and the
    # kind a dead letter names. Letters, digits and _ . -.
    name: ClassVar[str] = ""
    # The DateTimeField holding each row's deadline; None: deadlines live in the app's own
    # table (order_timeout.Deadline), set with ``set_deadline()``, for a model you cannot migrate.
    deadline: ClassVar[str | None] = "expires_at"
    # What the row must still meet, under its lock, to be acted on (a Q over the model).
    pending: ClassVar[Q] = Q()
    # Written by one conditional UPDATE per batch; ``NOW`` is the database's time.
    values: ClassVar[Mapping[str, Any]] = {}
    # A due row that meets this is held (left as it is, looked at again every HOLD_RECHECK)
    # until ``max_hold`` seconds past its deadline. None: nothing holds.
    hold: ClassVar[Q | None] = None
    max_hold: ClassVar[Any] = SETTING
    # A pending row that meets this is settled all the same (paid by another column): never acted
    # on, never held toward its longest hold, a figure of its own in the status command.
    settled: ClassVar[Q | None] = None
    # What ``values`` writes is final: a save that moves an acted-on row away from it raises
    # ``order_timeout.exceptions.OrderClosed`` (the model's own save path; no edit of the model).
    final: ClassVar[bool] = False
    # Saves that do not lock: a save of a row loaded before the act, that would write over what
    # the act wrote, is refused with ``order_timeout.exceptions.StaleOrderStatus`` (its UPDATE is
    # conditional on the row not acted on), so a stale read never undoes an act.
    guard_saves: ClassVar[bool] = False
    # For ``deadline = None`` with ``deadline_for``: the fields a row's deadline follows. A save of
    # a waiting row that changes one asks ``deadline_for`` again.
    deadline_follows: ClassVar[tuple[str, ...]] = ()
    # Work that follows other timers' commits: its due rows step aside while another timer has a
    # backlog (a second at most), so a burst is not slowed by what it starts.
    yields: ClassVar[bool] = False



# Every declared attribute, in the order above: what ``kind.Declared`` forwards to the declaration.
ATTRIBUTES: tuple[str, ...] = tuple(Declarable.__annotations__)


class Timer(Declarable):
    """A timed transition of one model's rows: subclass it, say what differs, ``register`` it."""

    def fire(self, rows: list[Any], now: datetime) -> None:
        """Called once per batch after the UPDATE, in the same transaction (``rows``: the locked
        instances, ``values`` applied). Raising fails the batch, which is then acted on again a
        row at a time, so a failing row fails alone."""

    def waits(self, row: Any) -> bool:
        """Whether a row in hand may still be acted on: a cheap look at its loaded fields (no
        query), which the re-check under the lock decides for good. True: every row with a
        deadline is scheduled. A timer with ``deadline_for`` says here when a row starts and
        stops waiting (``row.status == "unconfirmed"``)."""
        return True

    def public_name(self, row: Any) -> str:
        """How ``row`` is named to people and API clients (an order code, a number): in a refusal's
        message and 409 body, its refused write, its log line and the admin. The primary key by
        default."""
        return str(row.pk)

    def deadline_for(self, row: Any) -> datetime | None:
        """For a timer whose deadlines live in the app's table (``deadline = None``): the deadline
        a row gets when a save makes it wait (created waiting, or moved into ``waits``). None, the
        default: no deadline by itself (the shop calls ``set_deadline()``)."""
        return None

    # -- what a shop calls (the registered timer does it: ``timers.registry.get(name)``) --------

    def schedule(self, rows: Any) -> None:
        """Make Redis follow these rows after commit (after ``bulk_create()`` or ``update()``,
        which send no signals; a save does it by itself)."""
        self._registered().schedule(rows)

    def unschedule(self, rows: Any) -> None:
        """Take these rows off this timer's queue after commit."""
        self._registered().unschedule(rows)

    def set_deadline(self, row: Any, at: datetime | None) -> None:
        """Give ``row`` (an instance or a primary key) its deadline ``at``, or take it away (None),
        and schedule it after commit: for a timer whose deadlines live in the app's table."""
        self._registered().set_deadline(row, at)

    # The engine's kind that reads this declaration, once registered (``kind.Declared``).
    _kind: Any = None

    def _registered(self) -> Any:
        kind = self._kind
        if kind is None:
            raise LookupError(f"{type(self).__qualname__} is not registered: timers.register({type(self).__name__}) "
                              "it, and call this on timers.registry.get(name).")
        return kind

    def __repr__(self) -> str:
        model = getattr(type(self), "model", None)
        return f"<timer {self.name!r} of {model._meta.label if model else 'no model yet'}>"
