"""The order close: an unpaid order whose payment deadline passed is closed, ``order_expired`` fires.

Declared like any timer, on ``ORDER_MODEL`` (read from the settings each
time, so a project's own model is the one closed). What it says beyond a
plain declaration: the row's own status decides (``awaits_payment``, no
subquery), a hold that ran past ``MAX_HOLD`` closes with its own reason, and
its receivers are the app's two signals. Its Redis keys are those of every
release (``{prefix}:pending``), its members the plain primary key.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from functools import partial
from typing import Any

from django.db import connections
from django.db.models import Model, Q

from ..conf import settings
from ..db.keys import KeysIn
from ..db.locks import LockedOrders, lock_orders
from ..db.templates import Statement
from ..db.two_trips import update
from ..models import HOLD_EXPIRED_REASON, TIMEOUT_REASON, TimeoutOrderMixin
from ..ordermodel import get_order_model
from ..queue.keys import CLOSE
from ..reporting import wording as words
from ..signals import order_expired, order_keys_expired, orders_expired
from .kind import Kind
from .outcome import Due, Key, Outcome
from .receivers import run_batch_receiver, run_receiver

# How the mixin reads an order's status: a model that says it its own way gets instances.
_READING_THE_STATUS = ("awaits_payment", "is_unpaid", "timeout_status")


class OnOrderModel(Kind):
    """A kind the app declares on the order model: ``ORDER_MODEL`` (read each time, so a test or a
    shop may point it elsewhere), or the model given; its rows pending while unpaid, held by
    ``HOLD_CONDITION``, whose fit the consumer checks once (E013) for every such kind."""

    def __init__(self, model: Any = None) -> None:
        self._model = model
        # (ORDER_MODEL, its model) as last looked up: the lifecycle asks for the model per member.
        self._order_model: tuple[str, Any] = ("", None)
        super().__init__()

    @property
    def model(self) -> Any:  # type: ignore[override]
        if self._model is not None:
            return self._model
        label, model = self._order_model
        if label != settings.ORDER_MODEL:
            self._order_model = (settings.ORDER_MODEL, get_order_model())
            model = self._order_model[1]
        return model

    @property
    def pending(self) -> Q:  # type: ignore[override]
        return self.model.unpaid_q()

    def hold_condition(self) -> Q | None:
        return settings.hold_condition()

    def settled_condition(self) -> Q | None:
        return settings.settled_condition()

    def validate(self) -> None:
        pass  # HOLD_CONDITION, SETTLED_CONDITION: check E013, and validate_conditions() when a consumer starts

    def reads_its_status_its_own_way(self) -> bool:
        """Whether the model overrides how the mixin reads its status (``awaits_payment``, ...):
        then only its instances can say whether an order is unpaid (it may read any field)."""
        model = self.model
        return any(getattr(model, name) is not getattr(TimeoutOrderMixin, name, None) for name in _READING_THE_STATUS)

    def lock(self, manager: Any, pks: Any, also: Sequence[Statement] = ()) -> LockedOrders:
        """The rows, their deadlines and (rows locked as tuples) which are unpaid; ``also``, what the
        judge reads of other tables (``lock_orders``)."""
        model = self.model
        status = model.TIMEOUT_STATUS_FIELD
        locked = lock_orders(manager, pks, hold=self.hold_condition(), settled=self.settled_condition(),
                             columns=None if self.takes_instances() else (status, "expires_at"), also=also)
        locked.deadlines = locked.values("expires_at")
        if not locked.instances:
            # As TimeoutOrderMixin.awaits_payment reads it (takes_instances() made sure it is that
            # one; a row with no deadline is settled whatever its status).
            unpaid = model.TIMEOUT_UNPAID_STATUSES
            locked.pending = {pk for pk, value in locked.values(status).items() if value in unpaid}
        return locked

    def is_pending(self, row: Any, locked: LockedOrders) -> bool:
        # The row's own status, read in Python: no subquery per batch.
        return bool(row.awaits_payment)

    def waits(self, row: Any) -> bool:
        return bool(row.awaits_payment)


class OrderTimeout(OnOrderModel):
    name = ""
    queue_name = CLOSE
    @property
    def wording(self) -> words.Wording:
        return words.CLOSES

    def describe(self, key: Key) -> str:
        return f"order={key}"

    def takes_instances(self) -> bool:
        """Instances for a model whose receivers take them (``order_expired``, ``orders_expired``),
        or whose way of reading its status is its own; otherwise the batch is its keys, its
        status and its deadline."""
        model = self.model
        return (order_expired.has_listeners(model) or orders_expired.has_listeners(model)
                or self.reads_its_status_its_own_way())

    def acts_in_two_trips(self) -> bool:
        """A batch locked as tuples, whose keys nobody asks for: its UPDATEs are all its act."""
        return not self.takes_instances() and not order_keys_expired.has_listeners(self.model)

    def judge(self, keys: Any, locked: LockedOrders, outcome: Outcome) -> list[Due]:
        """The due orders; each instance told its close reason, and a batch locked as tuples
        given it in place of the row (the reason is all its act reads of a row)."""
        due = super().judge(keys, locked, outcome)
        held = locked.held
        if not locked.instances:
            if not held:
                return [(key, TIMEOUT_REASON) for key, _row in due]
            return [(key, HOLD_EXPIRED_REASON if key in held else TIMEOUT_REASON) for key, _row in due]
        for key, order in due:
            # Due while still held: its hold ran past MAX_HOLD.
            order._timeout_close_reason = HOLD_EXPIRED_REASON if key in held else TIMEOUT_REASON
        return due

    def act(self, due: list[Due], now: datetime, progress: Any = None) -> None:
        """One UPDATE per close reason, ``order_expired`` per order, ``orders_expired`` per batch,
        ``order_keys_expired`` per batch: each only when it has receivers."""
        if not isinstance(due[0][1], Model):
            self._act_on_keys(dict(due), now, progress)
            return
        orders = [order for _key, order in due]
        model = type(orders[0])
        manager = model._base_manager.db_manager(self.using)
        by_reason: dict[str, list[Any]] = {}
        for order in orders:
            by_reason.setdefault(order._timeout_close_reason, []).append(order)
        values = {reason: model.closing_values(now, reason) for reason in by_reason}
        # Locked and judged due by the database's clock: neither status nor deadline can move now.
        for reason, group in by_reason.items():
            manager.filter(model.unpaid_q(), KeysIn([order.pk for order in group])).update(**values[reason])
        previous_statuses: dict[Key, Any] = {}
        connection = connections[self.using]
        # Asked once a batch (a receiver connected while the consumer runs hears the next one):
        # with none for this model, no send per order, and no batch of copies to hand over.
        per_order = order_expired.has_listeners(model)
        per_batch = orders_expired.has_listeners(model)
        for order in orders:
            previous = previous_statuses[order.pk] = order.timeout_status
            order._apply_close(values[order._timeout_close_reason])
            if per_order:
                run_receiver(order.pk, connection,
                             partial(order_expired.send, sender=model, order=order, previous_status=previous))
            if progress is not None:
                progress()
        if per_batch:
            # A batch receiver that raises fails the whole batch; acting then gives each order a
            # batch of its own.
            run_batch_receiver(partial(orders_expired.send, sender=model, orders=orders,
                                       previous_statuses=previous_statuses))
        self._send_keys(model, {order.pk: order._timeout_close_reason for order in orders})

    def _act_on_keys(self, reasons: dict[Key, str], now: datetime, progress: Any) -> None:
        """The batch no receiver takes instances of: the UPDATEs, and its keys to whoever asks."""
        model = self.model
        manager = model._base_manager.db_manager(self.using)
        kinds_of_close = set(reasons.values())
        for reason in kinds_of_close:
            keys = list(reasons) if len(kinds_of_close) == 1 else [key for key, its in reasons.items() if its == reason]
            # Sent with the COMMIT where the batch takes two round trips, at once otherwise.
            update(manager.filter(model.unpaid_q(), KeysIn(keys)), model.closing_values(now, reason))
        self._send_keys(model, reasons)
        if progress is not None:
            progress()

    @staticmethod
    def _send_keys(model: Any, reasons: dict[Key, str]) -> None:
        if order_keys_expired.has_listeners(model):
            run_batch_receiver(partial(order_keys_expired.send, sender=model, keys=list(reasons),
                                       reasons=reasons))
