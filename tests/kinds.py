"""Every kind of timer of the test project as a "case" that one test runs over.

A case says, for its kind, only what differs: how to make rows that fall
due, how to settle one behind the app's back, how to tell from the rows
themselves whether they were acted on, what the act's receivers wrote (so
"exactly once" is counted in committed rows), how to make a receiver raise
or a batch-level step fail, and how to hold a consumer process inside its
act. The tests in ``test_every_kind.py`` say the promise once, for every kind.

The kinds: the order close (on the app's ``Order`` and on the shop's
``ShopOrder``), the reminders, and the shop's three declared timers
(``testproject/shop/timers.py``).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

from django.apps import apps
from django.db import connection, transaction
from django.db.models import Q

from order_timeout import schedule
from order_timeout.models import DeadLetter, Deadline, Order, Reminder
from order_timeout.queue import TimeoutQueue
from order_timeout.scans.compensation import ScanResult
from order_timeout.scheduling import connect_receivers, disconnect_receivers
from order_timeout.signals import deadline_approaching, order_expired, order_keys_expired, orders_expired
from order_timeout.timers.kind import Kind
from order_timeout.timers.members import deadline_score
from order_timeout.timers.registry import ORDER_TIMEOUT, REMINDERS, registry
from testproject.shop.models import (
    Checkout,
    Expiry,
    OrderStatusChange,
    PlainOrder,
    ReminderEmail,
    Return,
    ShopOrder,
    StockRecord,
    StockReservation,
)
from testproject.shop.receivers import record_expiry_keys

from .helpers import lock_waits, set_state

# The one reminder of the reminders' case: a minute before the deadline.
LEAD_SECONDS = 60
LEAD_MS = LEAD_SECONDS * 1000

# A hook a test puts inside the act: called with each row, in the act's transaction.
RowHook = Callable[[Any], None]


@dataclass
class Stall:
    """How to hold a consumer process inside its act: what to give it, and how to see it is there."""

    env: dict[str, str] = field(default_factory=dict)
    inside: Callable[[], bool] = lambda: False


class Case:
    """One kind of timer, as the tests over every kind see it."""

    # Whether the kind's receivers run once per batch (a declared timer's fire()) or once per row.
    receivers_per_batch: ClassVar[bool] = False
    # How a test's id names it (``test_...[reservation-lapses]``), and the kind's own name.
    id: ClassVar[str]
    name: ClassVar[str] = ""
    # Whether the close scan acts on its overdue rows (a reminder past its deadline is moot:
    # the scan leaves it, timers/reminders.py).
    scanned_when_overdue: ClassVar[bool] = True
    # The table the act writes last: a consumer process waits there while another session
    # keeps it from writing (``stalled``); None when the kind has a file-based stall of its own.
    act_writes: ClassVar[str | None] = None

    def __init__(self, settings: Any, clock: Callable[[], datetime], monkeypatch: Any) -> None:
        self.settings = settings
        self.clock = clock
        self.monkeypatch = monkeypatch
        self.cleanup = ExitStack()

    def close(self) -> None:
        self.cleanup.close()

    def __repr__(self) -> str:
        return f"<case {self.id}>"

    # -- what it is --------------------------------------------------------------------------

    @property
    def kind(self) -> Kind:
        return registry.get(self.name)

    @property
    def model(self) -> Any:
        """The model whose rows are locked (an order model for the close and the reminders)."""
        return self.kind.model

    @property
    def label(self) -> str:
        return str(self.model._meta.label)

    @property
    def queue(self) -> TimeoutQueue:
        """This kind's queue, on whatever Redis the test's settings name now."""
        return TimeoutQueue.from_settings().of_kind(self.kind.key_space)

    @property
    def env(self) -> dict[str, str]:
        """What a consumer process needs to serve this kind as the test does."""
        return {}

    def key(self, row: Any) -> Any:
        return row.pk

    def member(self, row: Any) -> str:
        return self.kind.member(self.key(row))

    def score(self, row: Any) -> int:
        """The score Redis holds for the row's member while it waits."""
        return deadline_score(self.moment(row))

    def moment(self, row: Any) -> datetime:
        """When the row falls due."""
        deadline = self.kind.deadlines.of(row)
        assert deadline is not None
        return deadline

    # -- rows ----------------------------------------------------------------------------------

    def make(self, count: int = 1, in_seconds: float = -1, at: datetime | None = None) -> list[Any]:
        """``count`` rows falling due ``in_seconds`` from the test clock's now (or ``at``),
        committed and scheduled."""
        return self._make(count, at or self.clock() + timedelta(seconds=in_seconds))

    def _make(self, count: int, moment: datetime) -> list[Any]:
        raise NotImplementedError

    def settle(self, row: Any) -> None:
        """Settle the row behind the app's back (another process, SQL): it needs no act any more."""
        raise NotImplementedError

    def acted(self, rows: Sequence[Any]) -> int:
        """How many of ``rows`` were acted on, by the rows' own state."""
        raise NotImplementedError

    def effects(self, rows: Sequence[Any]) -> list[int]:
        """For each row, how many times what its act writes beside the row committed."""
        raise NotImplementedError

    def given_up(self, row: Any) -> bool:
        """Whether the row's act was given up (an open dead letter naming this kind)."""
        return DeadLetter.objects.filter(order_model=self.label, order_id=str(row.pk), timer=self.kind.name,
                                         resolved_at__isnull=True).exists()

    def restored(self, result: ScanResult) -> int:
        """The members a rebuild put back for this kind."""
        return result.figures(self.kind).restored

    def scan_acted(self, result: ScanResult) -> int:
        return result.figures(self.kind).closed

    # -- inside the act ------------------------------------------------------------------------

    def on_each_row(self, hook: RowHook) -> None:
        """Run ``hook(row)`` inside the act, in its transaction, for each row acted on."""
        raise NotImplementedError

    def refuse_in_batch(self, row: Any) -> None:
        """Make a batch-level step of the act (not a row's receiver) fail whenever ``row`` is in
        the batch."""
        raise NotImplementedError

    # The consumer's log line of one batch of this kind, the count of rows acted on in group 1.
    log_line: ClassVar[str] = ""

    def logged_acts(self, log: str) -> int:
        """The rows a consumer's log says it acted on."""
        return sum(int(n) for n in re.findall(self.log_line, log))

    @contextmanager
    def stalled(self, tmp_path: Path) -> Iterator[Stall]:
        """A consumer process started in the block waits inside its act, its rows locked, until
        the block ends (or it is killed)."""
        assert self.act_writes is not None
        with writes_blocked(self.act_writes):
            yield Stall(inside=waiting_to_write)


class CloseCase(Case):
    """The order close, on ``ORDER_MODEL`` (the app's ``Order``, or the shop's ``ShopOrder``)."""

    log_line = r"order_timeout close claimed=\d+ closed=(\d+)"

    def __init__(self, settings: Any, clock: Callable[[], datetime], monkeypatch: Any,
                 order_model: str = "order_timeout.Order") -> None:
        super().__init__(settings, clock, monkeypatch)
        self.order_model = apps.get_model(order_model)
        self.id = f"order-close-{self.order_model.__name__}"  # type: ignore[misc]
        if order_model != settings.ORDER_TIMEOUT.get("ORDER_MODEL", "order_timeout.Order"):
            settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "ORDER_MODEL": order_model}
            connect_receivers(self.order_model)
            self.cleanup.callback(disconnect_receivers, self.order_model)

    @property
    def kind(self) -> Kind:
        return ORDER_TIMEOUT

    @property
    def model(self) -> Any:
        return self.order_model

    def _make(self, count: int, moment: datetime) -> list[Any]:
        orders = self.model.objects.bulk_create([self.model(expires_at=moment) for _ in range(count)])
        schedule(orders)
        return list(orders)

    def settle(self, row: Any) -> None:
        set_state(row, "paid")

    def acted(self, rows: Sequence[Any]) -> int:
        return int(self.model._base_manager.filter(
            pk__in=[row.pk for row in rows], **{self.model.TIMEOUT_STATUS_FIELD: self.model.TIMEOUT_CLOSED_STATUS},
        ).count())

    def effects(self, rows: Sequence[Any]) -> list[int]:
        """``order_expired`` deliveries committed (the shop's ``record_expiry``)."""
        return _counted(Expiry.objects.filter(model=self.label), "order_id", rows)

    def on_each_row(self, hook: RowHook) -> None:
        def receiver(sender: Any, order: Any, **kwargs: Any) -> None:
            hook(order)

        _connect(self.cleanup, order_expired, receiver)

    def refuse_in_batch(self, row: Any) -> None:
        def release_in_bulk(sender: Any, orders: list[Any], **kwargs: Any) -> None:
            if row.pk in {order.pk for order in orders}:
                raise RuntimeError(f"the bulk stock release refused a batch holding order {row.pk}")

        _connect(self.cleanup, orders_expired, release_in_bulk)

    @contextmanager
    def stalled(self, tmp_path: Path) -> Iterator[Stall]:
        inside = tmp_path / "inside-the-close"
        yield Stall(env={"SHOP_STALL_FILE": str(inside)}, inside=inside.exists)


class KeysCloseCase(CloseCase):
    """The order close of a shop whose receivers take only keys (``order_keys_expired``): no
    ``order_expired`` or ``orders_expired`` receiver, so each batch is locked as tuples, closed
    by its UPDATE, and no instance is built (issue 28). Its receiver, one per batch, records an
    ``Expiry`` per key, as ``record_expiry`` does per order."""

    receivers_per_batch: ClassVar[bool] = True

    def __init__(self, settings: Any, clock: Callable[[], datetime], monkeypatch: Any) -> None:
        super().__init__(settings, clock, monkeypatch)
        self.id = "order-close-keys"  # type: ignore[misc]
        for signal in (order_expired, orders_expired):
            kept = signal.receivers[:]
            signal.receivers.clear()
            signal.sender_receivers_cache.clear()
            self.cleanup.callback(_restore_receivers, signal, kept)
        _connect(self.cleanup, order_keys_expired, record_expiry_keys)

    @property
    def env(self) -> dict[str, str]:
        return {"SHOP_RECORD_EXPIRIES": "0", "SHOP_NOTICES": "0", "SHOP_RECORD_EXPIRY_KEYS": "1"}

    def effects(self, rows: Sequence[Any]) -> list[int]:
        """``order_keys_expired`` deliveries committed, a row per key (the shop's ``record_expiry_keys``)."""
        return _counted(Expiry.objects.filter(model=self.label), "order_id", rows)

    def on_each_row(self, hook: RowHook) -> None:
        def receiver(sender: Any, keys: list[Any], **kwargs: Any) -> None:
            for key in keys:
                hook(SimpleNamespace(pk=key))  # a key is all such a receiver has of an order

        _connect(self.cleanup, order_keys_expired, receiver)

    def refuse_in_batch(self, row: Any) -> None:
        def refuse(sender: Any, keys: list[Any], **kwargs: Any) -> None:
            if row.pk in keys:
                raise RuntimeError(f"the keys' receiver refused a batch holding order {row.pk}")

        _connect(self.cleanup, order_keys_expired, refuse)


class ReminderCase(Case):
    """The reminders: one, ``LEAD_SECONDS`` before each unpaid order's deadline."""

    id = "remind"
    scanned_when_overdue = False
    log_line = r"order_timeout reminders claimed=\d+ sent=(\d+)"

    def __init__(self, settings: Any, clock: Callable[[], datetime], monkeypatch: Any) -> None:
        super().__init__(settings, clock, monkeypatch)
        settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "REMINDERS": [LEAD_SECONDS]}

    @property
    def kind(self) -> Kind:
        return REMINDERS

    @property
    def env(self) -> dict[str, str]:
        return {"ORDER_TIMEOUT_REMINDERS": str(LEAD_SECONDS)}

    def key(self, row: Any) -> Any:
        return (row.pk, LEAD_MS)

    def moment(self, row: Any) -> datetime:
        return row.expires_at - timedelta(milliseconds=LEAD_MS)

    def _make(self, count: int, moment: datetime) -> list[Any]:
        # The reminder's moment is ``moment``; the order's deadline a minute later, still ahead.
        orders = Order.objects.bulk_create([Order(expires_at=moment + timedelta(seconds=LEAD_SECONDS))
                                            for _ in range(count)])
        schedule(orders)
        return list(orders)

    def settle(self, row: Any) -> None:
        set_state(row, "paid")

    def acted(self, rows: Sequence[Any]) -> int:
        return int(Reminder.objects.filter(order_model=self.label, order_id__in=[str(row.pk) for row in rows],
                                           outcome=Reminder.Outcome.SENT).count())

    def effects(self, rows: Sequence[Any]) -> list[int]:
        """``deadline_approaching`` deliveries committed (the shop's ``record_reminder``)."""
        return _counted(ReminderEmail.objects.filter(model=self.label), "order_id", rows)

    def given_up(self, row: Any) -> bool:
        return Reminder.objects.filter(order_model=self.label, order_id=str(row.pk),
                                       outcome=Reminder.Outcome.FAILED).exists()

    def restored(self, result: ScanResult) -> int:
        return result.reminders_restored

    def scan_acted(self, result: ScanResult) -> int:
        return 0  # the scan's figures have no count of reminders sent: it sends none

    def on_each_row(self, hook: RowHook) -> None:
        def receiver(sender: Any, order: Any, **kwargs: Any) -> None:
            hook(order)

        _connect(self.cleanup, deadline_approaching, receiver)

    def refuse_in_batch(self, row: Any) -> None:
        """The act's one INSERT of the batch's reminder records fails: the table refuses this
        order's record (a CHECK constraint, a real database error)."""
        table = Reminder._meta.db_table
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER TABLE {table} ADD CONSTRAINT refuse_order_{int(row.pk)} "
                           f"CHECK (order_id <> '{int(row.pk)}')")

        def drop() -> None:
            with connection.cursor() as cursor:
                cursor.execute(f"ALTER TABLE {table} DROP CONSTRAINT refuse_order_{int(row.pk)}")

        self.cleanup.callback(drop)

    @contextmanager
    def stalled(self, tmp_path: Path) -> Iterator[Stall]:
        inside = tmp_path / "inside-the-reminder"
        yield Stall(env={"SHOP_REMINDER_STALL_FILE": str(inside)}, inside=inside.exists)


class DeclaredCase(Case):
    """A timer the shop declared: its act is the kind's UPDATE and its ``fire()``."""

    # Its receiver is one fire() for the batch, not one per row.
    receivers_per_batch: ClassVar[bool] = True
    # The rows' state once acted on.
    acted_q: ClassVar[Q]

    def logged_acts(self, log: str) -> int:
        line = rf"order_timeout {re.escape(self.name)} claimed=\d+ acted=(\d+)"
        return sum(int(n) for n in re.findall(line, log))

    def _make(self, count: int, moment: datetime) -> list[Any]:
        rows = self._create(count, moment)
        self.kind.schedule(rows)
        return rows

    def _create(self, count: int, moment: datetime) -> list[Any]:
        raise NotImplementedError

    def acted(self, rows: Sequence[Any]) -> int:
        return int(self.model._base_manager.filter(self.acted_q, pk__in=[row.pk for row in rows]).count())

    def _wrap_fire(self, before: Callable[[list[Any]], None]) -> None:
        """The timer's ``fire``, with ``before(rows)`` first (the registered instance's, for the test)."""
        kind = self.kind
        fire = kind.fire

        def fired(rows: list[Any], now: datetime) -> None:
            before(rows)
            fire(rows, now)

        self.monkeypatch.setattr(kind, "fire", fired)

    def on_each_row(self, hook: RowHook) -> None:
        def each(rows: list[Any]) -> None:
            for row in rows:
                hook(row)

        self._wrap_fire(each)

    def refuse_in_batch(self, row: Any) -> None:
        def refuse(rows: list[Any]) -> None:
            if row.pk in {each.pk for each in rows}:
                raise RuntimeError(f"{self.name}: fire() refused a batch holding row {row.pk}")

        self._wrap_fire(refuse)


class ReservationCase(DeclaredCase):
    """``reservation-lapses``: a held reservation is released and gives its stock back."""

    id = name = "reservation-lapses"
    acted_q = Q(state="released", released_at__isnull=False)
    act_writes = StockRecord._meta.db_table

    def _create(self, count: int, moment: datetime) -> list[Any]:
        # A stock record each, so each reservation's stock is counted on its own.
        stock = StockRecord.objects.bulk_create([StockRecord(num_in_stock=1, num_allocated=1)
                                                 for _ in range(count)])
        checkout = Checkout.objects.create()
        return list(StockReservation.objects.bulk_create([
            StockReservation(stockrecord=record, checkout=checkout, expires_at=moment) for record in stock]))

    def settle(self, row: Any) -> None:
        StockReservation.objects.filter(pk=row.pk).update(state="used")  # the checkout completed

    def effects(self, rows: Sequence[Any]) -> list[int]:
        """Units of stock given back to each reservation's record."""
        allocated = dict(StockRecord.objects.filter(pk__in=[row.stockrecord_id for row in rows])
                         .values_list("pk", "num_allocated"))
        return [1 - allocated[row.stockrecord_id] for row in rows]


class CompletionCase(DeclaredCase):
    """``complete-after-delivery``: a delivered order with no open return completes."""

    id = name = "complete-after-delivery"
    acted_q = Q(status="Complete")
    act_writes = OrderStatusChange._meta.db_table

    def _create(self, count: int, moment: datetime) -> list[Any]:
        return list(ShopOrder.objects.bulk_create([ShopOrder(status="Delivered", completes_at=moment)
                                                   for _ in range(count)]))

    def settle(self, row: Any) -> None:
        Return.objects.create(order=row)  # the customer opened a return

    def effects(self, rows: Sequence[Any]) -> list[int]:
        """Status-change rows written by its ``fire()``."""
        return _counted(OrderStatusChange.objects.filter(old_status="Delivered", new_status="Complete"),
                        "order_id", rows)


class PlainOrderCase(DeclaredCase):
    """``plain-order-payment``: deadlines in the app's own table; a pending order is cancelled."""

    id = name = "plain-order-payment"
    acted_q = Q(status="cancelled")
    act_writes = Deadline._meta.db_table

    def moment(self, row: Any) -> datetime:
        return Deadline.objects.get(timer=self.name, object_id=str(row.pk)).expires_at

    def _make(self, count: int, moment: datetime) -> list[Any]:
        orders = list(PlainOrder.objects.bulk_create([PlainOrder() for _ in range(count)]))
        for order in orders:
            self.kind.set_deadline(order, moment)
        return orders

    def settle(self, row: Any) -> None:
        PlainOrder.objects.filter(pk=row.pk).update(status="paid")  # the other system took the payment

    def effects(self, rows: Sequence[Any]) -> list[int]:
        """Its act writes nothing beside the row (no ``fire()``): the row is its one effect, and
        exactly once is what the consumers' own counts say (the tests add those up too)."""
        cancelled = set(PlainOrder.objects.filter(self.acted_q, pk__in=[row.pk for row in rows])
                        .values_list("pk", flat=True))
        return [int(row.pk in cancelled) for row in rows]


def _close_of(order_model: str) -> Callable[..., Case]:
    def build(settings: Any, clock: Callable[[], datetime], monkeypatch: Any) -> Case:
        return CloseCase(settings, clock, monkeypatch, order_model=order_model)

    return build


# By the id a test names it with: ``test_...[reservation-lapses]``.
CASES: dict[str, Callable[..., Case]] = {
    "order-close-Order": _close_of("order_timeout.Order"),
    "order-close-ShopOrder": _close_of("shop.ShopOrder"),
    "order-close-keys": KeysCloseCase,
    ReminderCase.id: ReminderCase,
    ReservationCase.id: ReservationCase,
    CompletionCase.id: CompletionCase,
    PlainOrderCase.id: PlainOrderCase,
}
EVERY_KIND = list(CASES)
# Giving up writes a dead letter that staff requeue or act on now, for every kind but the
# reminders: they record the reminder failed (nobody need send a late reminder).
DEAD_LETTER_KINDS = [name for name in EVERY_KIND if name != ReminderCase.id]
# The cheap parametrisations run the order close on both models; the slow ones on Order only.
ONE_MODEL_EACH = [name for name in EVERY_KIND if name != "order-close-ShopOrder"]


# -- small helpers -----------------------------------------------------------------------------


def _counted(rows: Any, field_name: str, of: Sequence[Any]) -> list[int]:
    """For each of ``of``, how many of ``rows`` name it in ``field_name``."""
    names = [str(row.pk) for row in of]
    found: dict[str, int] = {}
    for value in rows.filter(**{f"{field_name}__in": names}).values_list(field_name, flat=True):
        found[str(value)] = found.get(str(value), 0) + 1
    return [found.get(name, 0) for name in names]


def _restore_receivers(signal: Any, receivers: list[Any]) -> None:
    signal.receivers[:] = receivers
    signal.sender_receivers_cache.clear()


def _connect(cleanup: ExitStack, signal: Any, receiver: Callable[..., None]) -> None:
    signal.connect(receiver, weak=False)
    cleanup.callback(signal.disconnect, receiver)


@contextmanager
def writes_blocked(table: str) -> Iterator[None]:
    """Another session lets ``table`` be read but not written until the block ends (a table lock:
    PostgreSQL's SHARE mode, MariaDB's LOCK TABLES ... READ)."""
    from .conftest import finish, time_left, wait_for

    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            if connection.vendor == "postgresql":
                with transaction.atomic(), connection.cursor() as cursor:
                    cursor.execute(f"LOCK TABLE {table} IN SHARE MODE")
                    locked.set()
                    release.wait(time_left())
            else:
                with connection.cursor() as cursor:
                    cursor.execute(f"LOCK TABLES {table} READ")
                    try:
                        locked.set()
                        release.wait(time_left())
                    finally:
                        cursor.execute("UNLOCK TABLES")
        finally:
            connection.close()

    holder = threading.Thread(target=hold, name=f"a session keeping {table} from being written")
    holder.start()
    try:
        wait_for(lambda: locked.is_set() or not holder.is_alive())
        assert locked.is_set(), f"{table} could not be locked"
        yield
    finally:
        release.set()
        finish(holder)


def waiting_to_write() -> bool:
    """Whether a session of the test database waits for a table lock (``writes_blocked``)."""
    if connection.vendor == "postgresql":
        return lock_waits() > 0
    with connection.cursor() as cursor:
        cursor.execute("SELECT COUNT(*) FROM information_schema.PROCESSLIST "
                       "WHERE DB = DATABASE() AND STATE LIKE %s", ["Waiting for table%"])
        return bool(cursor.fetchone()[0])
