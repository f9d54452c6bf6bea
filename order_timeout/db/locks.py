"""Locking order rows for an act under their lock (a close, a reminder), and retrying lock conflicts.

Knows nothing of Redis. ``lock_orders`` is the one locking ``SELECT`` both
acts start with: the rows and the database's clock; with a ``HOLD_CONDITION``
(or a timer's pending and settled conditions) one more statement per batch
says which of the locked rows meet it, never a query per order. Rows another
transaction holds are skipped (``SKIP LOCKED``) and reported busy, so one
cannot stall the rest.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connections, router
from django.db.models import Case, DateTimeField, Exists, OuterRef, Q, When
from django.db.models.query import ModelIterable

from ..conf import settings
from .keys import KeysIn
from .session import DatabaseNow, as_read, database_now
from .templates import Statement, read_in_turn

logger = logging.getLogger("order_timeout")



@dataclass
class LockedOrders:
    """What one locking ``SELECT`` found."""

    rows: dict[Any, Any] = field(default_factory=dict)
    # The database's clock (None when no row was locked).
    db_now: datetime | None = None
    # Rows that exist but another transaction holds.
    busy: set[Any] = field(default_factory=set)
    # Rows the hold condition holds (a payment in flight).
    held: set[Any] = field(default_factory=set)
    # Rows that still meet the kind's condition (all of them, when it has none to ask).
    pending: set[Any] = field(default_factory=set)
    # Rows its settled condition says are settled (paid by another column): never acted on.
    settled: set[Any] = field(default_factory=set)
    # Each row's deadline, as the kind keeps it (filled in by the kind).
    deadlines: dict[Any, Any] = field(default_factory=dict)
    # Whether ``rows`` are the model's instances (False: each row the tuple ``(pk, *columns)``,
    # as the driver returned it, its values converted as Django would).
    instances: bool = True
    # The names of a tuple's values, when ``rows`` are tuples.
    columns: tuple[str, ...] = ()
    # The rows of each statement the caller asked along (``lock_orders``'s ``also``), in order.
    also: list[list[tuple[Any, ...]]] = field(default_factory=list)

    def values(self, name: str) -> dict[Any, Any]:
        """Each locked row's value of the column ``name``, by key."""
        if self.instances:
            return {pk: getattr(row, name) for pk, row in self.rows.items()}
        at = self.columns.index(name)
        return {pk: row[at] for pk, row in self.rows.items()}


def lock_orders(manager: Any, pks: Sequence[Any], *, hold: Q | None = None, pending: Q | None = None,
                settled: Q | None = None, columns: Sequence[str] | None = None,
                also: Sequence[Statement] = ()) -> LockedOrders:
    """Lock ``pks``' rows inside the caller's transaction, skipping those locked elsewhere.

    ``columns``: read only these (and the key), each row the tuple ``(pk, *columns)``, not every
    column into the model's instances; for a batch no receiver will see. ``also``: statements of
    the caller's for the same keys, run after the conditions (``found.also``): what the judge reads
    of other tables, read after the lock and in its round trip.

    ``hold``, ``pending`` and ``settled`` are each asked of the batch by one more statement of
    the same transaction, run after the locking one, ``filter(condition, pk IN (...))``: one
    set-based join per batch, not a subquery per row (a dependent subquery in the locking SELECT
    ran once per row, and on MySQL it locked the related rows it read, a payment's too). Read
    after the lock, a condition sees every commit made before the rows were locked, and a
    payment that must change the order waits for its lock.
    """
    conditions = [(name, condition) for name, condition in (("held", hold), ("pending", pending),
                                                            ("settled", settled)) if condition is not None]
    meetings = [_meeting(manager, condition) for _name, condition in conditions]
    if columns is None and _reads_rows_its_own_way(manager):
        found = LockedOrders(rows={order.pk: order for order in _locking(manager, pks)})
        answers = read_in_turn([*meetings, *also], manager.db, pks) if found.rows else [[] for _ in (*meetings, *also)]
        clocks = [order._timeout_db_now for order in found.rows.values()]
    else:
        instances = columns is None
        names = (tuple(field.attname for field in manager.model._meta.concrete_fields) if columns is None
                 else ("pk", *columns))
        # The conditions are asked only of a batch that locked a row (all of it busy: none).
        locked, *answers = read_in_turn([_locking_values(manager, names, instances), *meetings, *also], manager.db,
                                         pks, unless_the_first_finds_none=True)
        found = LockedOrders(rows=_instances(manager, names, locked) if instances else {row[0]: row for row in locked},
                             instances=instances, columns=() if instances else names)
        clocks = [row[-1] for row in locked]
    found.db_now = as_read(next((clock for clock in clocks if clock is not None), None), connections[manager.db])
    if found.db_now is None and found.rows:
        # The first was locked elsewhere or is gone: one more statement, rarely.
        found.db_now = database_now(manager.db)
    answers, found.also = answers[:len(conditions)], answers[len(conditions):]
    for (name, _condition), rows in zip(conditions, answers, strict=True):
        # A condition over a related table may match a row more than once: a set, of locked rows only.
        setattr(found, name, {row[0] for row in rows if row[0] in found.rows})
    if pending is None:
        found.pending = set(found.rows)
    absent = [pk for pk in pks if pk not in found.rows]
    if absent:
        found.busy = set(manager.filter(KeysIn(absent)).values_list("pk", flat=True))
    return found


def _locking(manager: Any, pks: Sequence[Any]) -> Any:
    """The locking ``SELECT`` of ``pks``' rows, skipping those locked elsewhere, with the clock."""
    skip_locked = connections[manager.db].features.has_select_for_update_skip_locked
    # The database's clock, read by the same statement on one row (the first asked for):
    # a datetime per row would cost a conversion per row for one value.
    # Ordered by the key, not by the model's Meta.ordering: the rows come off the primary key
    # as they are locked, with no sort of the batch (a filesort per batch on MariaDB).
    return (manager.select_for_update(skip_locked=skip_locked).filter(KeysIn(pks)).order_by("pk")
            .annotate(_timeout_db_now=Case(When(pk=pks[0], then=DatabaseNow()), default=None,
                                           output_field=DateTimeField())))


def _reads_rows_its_own_way(manager: Any) -> bool:
    """Whether the manager's queryset builds its instances with more than their columns (related
    rows along, deferred fields, annotations of its own) or in its own way (an iterable of its own,
    as django-polymorphic's hands each row over as its subclass): then the queryset builds them."""
    queryset = manager.all()
    query = queryset.query
    return bool(queryset._iterable_class is not ModelIterable or query.select_related
                or queryset._prefetch_related_lookups or query.annotations or query.extra
                or query.deferred_loading != (frozenset(), True))


def _locking_values(manager: Any, names: tuple[str, ...], instances: bool) -> Statement:
    """The locking ``SELECT``, each row the tuple of ``names`` and the database's clock."""
    shape = ("instances" if instances else "lock", manager.model._meta.label, type(manager), names,
             django_settings.USE_TZ)
    return Statement(shape, lambda keys: _locking(manager, keys).values_list(*names, "_timeout_db_now"),
                     names_first_key=True)


def _instances(manager: Any, names: tuple[str, ...], locked: list[tuple[Any, ...]]) -> dict[Any, Any]:
    """The locked rows as the model's instances, by key, each built by the model's own ``from_db``
    from every concrete column, as the queryset would build it (the same values, of the same
    types and zones). The queryset compiled the statement each batch and converted each row
    value by value."""
    model, db = manager.model, manager.db
    rows = {}
    for row in locked:
        instance = model.from_db(db, names, row[:-1])
        instance._timeout_db_now = row[-1]
        rows[instance.pk] = instance
    return rows


def _meeting(manager: Any, condition: Q) -> Statement:
    """The keys among the batch's whose row meets ``condition``."""
    return Statement(("meeting", manager.model._meta.label, type(manager), condition),
                     lambda keys: _rows_meeting(manager, condition, keys).values_list("pk"))


def _rows_meeting(manager: Any, condition: Q, pks: Sequence[Any]) -> Any:
    """The batch's rows that meet ``condition``, unordered (the model's ordering would sort them).

    PostgreSQL is asked ``EXISTS``: as a join it hashes the condition's related table whole
    (every pending payment scanned for each batch: 2.5x the time at 10,000, and growing with
    the table), where a semi-join probes the batch's own related rows. MySQL and MariaDB are
    asked the join, which they drive from the batch's keys (``EXISTS`` took them twice as long).
    """
    batch = manager.filter(KeysIn(pks)).order_by()
    if connections[manager.db].vendor == "postgresql":
        return batch.filter(Exists(manager.filter(condition, pk=OuterRef("pk"))))
    return batch.filter(condition)


def compiles(model: Any, condition: Q, using: str | None = None) -> str | None:
    """Why ``condition`` does not compile against ``model``'s rows (None when it does), without
    running it: built as ``lock_orders`` asks it of a batch."""
    using = using or router.db_for_write(model)
    try:
        query = _rows_meeting(model._base_manager.db_manager(using), condition, [0]).values_list("pk").query
        query.get_compiler(using=using).as_sql()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def validate_conditions(model: Any, using: str | None = None) -> None:
    """Build and compile the hold and settled statements of ``lock_orders`` for ``model``, without
    running them.

    ``ImproperlyConfigured`` naming ``HOLD_CONDITION`` or ``SETTLED_CONDITION`` when it does not
    fit the model (a field it does not have, a callable that raises or returns no ``Q``): found
    by ``manage.py check`` and when a consumer starts, never by a due order.
    """
    for key, condition in (("HOLD_CONDITION", settings.hold_condition()),
                           ("SETTLED_CONDITION", settings.settled_condition())):
        problem = None if condition is None else compiles(model, condition, using)
        if problem:
            raise ImproperlyConfigured(f"ORDER_TIMEOUT[{key!r}] does not fit {model._meta.label}: {problem}")
