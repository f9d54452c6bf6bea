"""Where a close's time goes, per order, part by part, and what promise each part buys.

One consumer, in this process, closes a burst of due orders (the burst row's
work, without the second consumer), and each part of the path is timed where
it runs: the lifecycle's functions and the driver's statements are wrapped,
and each wrapper counts its own time less that of the wrapped parts inside it
(exclusive time, so the parts add up to the whole). The floor's three steps
(``bench/floor.py``: one Lua claim, one UPDATE, one COMMIT per batch) are timed
the same way on the same rows, so each part reads against what the least
possible close spends. Wall time per order: a statement's part includes the
server's work for it. The wrappers themselves cost about 0.2 us per call (a
call per order for the per-order signal, a few per batch for the rest).
"""

from __future__ import annotations

import gc
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

# Each part, and the promise (or the shop's work) it is there for.
PROMISES = {
    "claim (Lua, into the lease set)": "a crashed consumer loses nothing: members are leased, not deleted",
    "locking SELECT (statement)": "the row is re-checked under its lock, by the database's clock: a paid "
                                  "order is never closed, a payment before the deadline never refused",
    "rows read under the lock": "the re-check's columns; the model's instances only for a receiver that "
                                "takes them (order_expired, orders_expired)",
    "conditions (holds, settled)": "a payment in flight holds its order (one statement per batch)",
    "UPDATE (statement)": "the close itself (the floor does the same)",
    "order_expired per order": "the shop's per-order receivers (ours_per_order: the benchmark's recorder)",
    "batch receivers": "orders_expired / order_keys_expired, in the same transaction (the benchmark's recorder of "
                       "keys; ours_notices: notify_many() but its INSERT, and the notices' members a lease late)",
    "INSERT (statement)": "the shop's own rows (ours_shop_batch: its status changes) or the notices' (ours_notices: "
                          "a notice exists exactly when its close committed)",
    "transaction (BEGIN, COMMIT)": "receivers commit with the close or roll back with it",
    "ack (Redis)": "exactly once: the lease is released only by its holder, after the commit",
    "lifecycle bookkeeping": "outcomes sorted (busy, held, not due, failed) for retries and metrics",
}
FLOOR_PARTS = ("floor: claim (Lua ZRANGEBYSCORE + ZREM)", "floor: UPDATE", "floor: COMMIT")


class Parts:
    """Exclusive time per part, from wrapped callables."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self._children: list[float] = []
        self._undo: list[Callable[[], None]] = []

    def timed(self, part: str | Callable[..., str], function: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            name = part(*args, **kwargs) if callable(part) else part
            began = time.perf_counter()
            self._children.append(0.0)
            try:
                return function(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - began
                self.seconds[name] += elapsed - self._children.pop()
                if self._children:
                    self._children[-1] += elapsed

        return run

    def wrap(self, owner: Any, name: str, part: str | Callable[..., str]) -> None:
        original = owner.__dict__[name]
        setattr(owner, name, self.timed(part, original))
        self._undo.append(lambda: setattr(owner, name, original))

    def unwrap(self) -> None:
        while self._undo:
            self._undo.pop()()


def _statement_part(sql: str) -> str:
    head = sql.lstrip().split(None, 1)[0].upper()
    if head == "SELECT":
        return "locking SELECT (statement)" if "FOR UPDATE" in sql else "conditions (holds, settled)"
    if head in ("UPDATE", "INSERT"):
        return f"{head} (statement)"
    return "transaction (BEGIN, COMMIT)"


@contextmanager
def _wrapped(parts: Parts) -> Iterator[None]:
    from django.db.backends.base.base import BaseDatabaseWrapper
    from django.db.backends.utils import CursorWrapper

    from order_timeout.db import locks
    from order_timeout.queue.shards import Shard
    from order_timeout.timers import closes, kind, lifecycle, receivers

    parts.wrap(CursorWrapper, "execute", lambda cursor, sql, *args, **kwargs: _statement_part(sql))
    for name in ("commit", "set_autocommit"):
        parts.wrap(BaseDatabaseWrapper, name, "transaction (BEGIN, COMMIT)")
    parts.wrap(Shard, "claim", "claim (Lua, into the lease set)")
    parts.wrap(lifecycle.Lifecycle, "_settle", "ack (Redis)")
    parts.wrap(locks, "lock_orders", "rows read under the lock")
    parts.wrap(receivers, "run_receiver", "order_expired per order")
    parts.wrap(receivers, "run_batch_receiver", "batch receivers")
    parts.wrap(lifecycle.Lifecycle, "process", "lifecycle bookkeeping")
    # The kinds import these by name: where they are called from must see the wrapped ones.
    rebound = {"lock_orders": locks, "run_receiver": receivers, "run_batch_receiver": receivers}

    def follow() -> None:
        for module in (closes, kind):
            for name, source in rebound.items():
                if hasattr(module, name):
                    setattr(module, name, getattr(source, name))

    follow()
    try:
        yield
    finally:
        parts.unwrap()
        follow()


def _due_orders(model: Any, count: int) -> list[Any]:
    from .workloads import make_orders, reset

    reset()
    return make_orders([timezone.now() - timedelta(seconds=5)] * count, model)


def ours(count: int, *, model_label: str = "order_timeout.Order", hold: bool = False,
         batch_receivers: bool = False, notices: bool = False, per_order: bool = False) -> dict[str, float]:
    """Microseconds per closed order, by part, for one consumer closing ``count`` due orders.

    ``notices``: the shop's ``orders_expired`` receiver writes a webhook notice per order, as in the
    ``ours_notices`` row; this consumer serves the close alone, so the parts are the close's (the
    notices' INSERT is its batch receiver's part), not their delivery."""
    from django.apps import apps
    from django.conf import settings
    from django.test import override_settings

    from order_timeout import schedule
    from order_timeout.consumer import Consumer
    from order_timeout.signals import order_expired, order_keys_expired
    from order_timeout.timers.registry import ORDER_TIMEOUT

    from . import recorder
    from .workloads import keep_statistics

    model = apps.get_model(model_label)
    orders = _due_orders(model, count)
    held = 0
    if hold:
        from testproject.shop.models import OrderPayment

        OrderPayment.objects.bulk_create([OrderPayment(order=order) for order in orders[::10]])
        held = len(orders[::10])
    keep_statistics(model)
    with transaction.atomic():
        for start in range(0, len(orders), 5000):
            schedule(orders[start:start + 5000])
    # A consumer holds no burst of instances: these would slow every garbage collection of the run.
    del orders
    gc.collect()
    overrides = {**settings.ORDER_TIMEOUT, "ORDER_MODEL": model_label}
    if hold:
        overrides["HOLD_CONDITION"] = "testproject.shop.payments.in_flight"
    parts = Parts()
    # The benchmark's recorder as the row's closers run it: the batch's keys, or (per_order) an
    # order_expired receiver per order.
    signal, record = (order_expired, recorder.on_expired) if per_order else (order_keys_expired,
                                                                            recorder.on_keys_expired)
    signal.connect(record, dispatch_uid="bench.parts.recorder")
    with (override_settings(ORDER_TIMEOUT=overrides), _shop_receivers(batch_receivers), _notices(notices),
          _connection_kept()):
        consumer = Consumer(model=model, batch_size=500, kinds=[ORDER_TIMEOUT] if notices else None)
        consumer.sync_clock()
        with _wrapped(parts):
            began = time.perf_counter()
            # The consumer's loop, as a closer runs it (each batch's ack with the next claim), until
            # nothing is due.
            consumer.run(once=True)
            total = time.perf_counter() - began
    signal.disconnect(dispatch_uid="bench.parts.recorder")
    recorder._commits.clear()
    closed = count - held
    parts.seconds["lifecycle bookkeeping"] += total - sum(parts.seconds.values())
    return {part: round(1e6 * parts.seconds.get(part, 0.0) / closed, 2) for part in PROMISES} | {
        "total": round(1e6 * total / closed, 2)}


@contextmanager
def _connection_kept() -> Iterator[None]:
    """The database connection kept from batch to batch, as the closers keep theirs
    (``CONN_MAX_AGE=600``, bench/systems.py), not opened again for each."""
    before = connection.settings_dict["CONN_MAX_AGE"]
    connection.close()
    connection.settings_dict["CONN_MAX_AGE"] = 600
    try:
        yield
    finally:
        connection.close()
        connection.settings_dict["CONN_MAX_AGE"] = before


@contextmanager
def _shop_receivers(batch: bool) -> Iterator[None]:
    """The shop model's receivers as its benchmark row runs them (status-change rows, no stock)."""
    from order_timeout.signals import order_expired, orders_expired
    from testproject.shop.models import ShopOrder
    from testproject.shop.receivers import release_stock, write_status_change, write_status_changes

    order_expired.disconnect(release_stock, sender=ShopOrder, dispatch_uid="shop.release_stock")
    if batch:
        order_expired.disconnect(write_status_change, sender=ShopOrder, dispatch_uid="shop.write_status_change")
        orders_expired.connect(write_status_changes, sender=ShopOrder, dispatch_uid="shop.write_status_changes")
    try:
        yield
    finally:
        orders_expired.disconnect(write_status_changes, sender=ShopOrder, dispatch_uid="shop.write_status_changes")
        order_expired.connect(write_status_change, sender=ShopOrder, dispatch_uid="shop.write_status_change")
        order_expired.connect(release_stock, sender=ShopOrder, dispatch_uid="shop.release_stock")


@contextmanager
def _notices(on: bool) -> Iterator[None]:
    """The ``ours_notices`` row's receiver in this process: the shop's ``notify_expired``, writing the
    webhook notice alone (SHOP_EMAIL_NOTICES=0), to a handler declared here for the harness's sink."""
    if not on:
        yield
        return
    import os

    from order_timeout.notices import handlers
    from order_timeout.notices.ready import webhook
    from order_timeout.signals import orders_expired
    from testproject.shop.receivers import notify_expired

    from .notices import HANDLER
    from .sink import shared

    declared = HANDLER not in handlers.names()
    if declared:
        handlers.declare(HANDLER, webhook(shared().url), timeout=5)
    email, os.environ["SHOP_EMAIL_NOTICES"] = os.environ.get("SHOP_EMAIL_NOTICES"), "0"
    orders_expired.connect(notify_expired, dispatch_uid="bench.parts.notify_expired")
    try:
        yield
    finally:
        orders_expired.disconnect(dispatch_uid="bench.parts.notify_expired")
        if email is None:
            os.environ.pop("SHOP_EMAIL_NOTICES", None)
        else:
            os.environ["SHOP_EMAIL_NOTICES"] = email
        if declared:
            handlers.forget(HANDLER)


def floor(count: int) -> dict[str, float]:
    """The floor's three steps, per order, on ``count`` due orders (``bench/floor.py``'s SQL)."""
    from django_redis import get_redis_connection

    from order_timeout.models import Order
    from order_timeout.timers.members import deadline_score

    from .floor import BATCH, CLAIM, FLOOR_KEY, Closer

    orders = _due_orders(Order, count)
    client = get_redis_connection("order_timeout")
    for start in range(0, len(orders), 5000):
        client.zadd(FLOOR_KEY, {str(o.pk): deadline_score(o.expires_at) for o in orders[start:start + 5000]})
    claim = client.register_script(CLAIM)
    closer = Closer.of(Order, connection)
    seconds: dict[str, float] = defaultdict(float)
    connection.ensure_connection()
    raw = connection.connection
    raw.autocommit(False) if connection.vendor == "mysql" else setattr(raw, "autocommit", False)
    cursor = raw.cursor()
    try:
        while True:
            began = time.perf_counter()
            due = claim(keys=[FLOOR_KEY], args=[int(time.time() * 1000), BATCH])
            claimed = time.perf_counter()
            seconds[FLOOR_PARTS[0]] += claimed - began
            if not due:
                break
            pks = [int(member) for member in due]
            cursor.execute(*closer.update(pks))
            updated = time.perf_counter()
            seconds[FLOOR_PARTS[1]] += updated - claimed
            raw.commit()
            seconds[FLOOR_PARTS[2]] += time.perf_counter() - updated
    finally:
        raw.autocommit(True) if connection.vendor == "mysql" else setattr(raw, "autocommit", True)
        connection.close()
    return {part: round(1e6 * seconds[part] / count, 2) for part in FLOOR_PARTS} | {
        "total": round(1e6 * sum(seconds.values()) / count, 2)}


ROWS: dict[str, dict[str, Any]] = {
    "ours": {},
    "ours_per_order": {"per_order": True},
    "ours_held": {"hold": True},
    "ours_shop_batch": {"model_label": "shop.ShopOrder", "batch_receivers": True},
    "ours_notices": {"notices": True},
}


def measure(count: int) -> dict[str, dict[str, float]]:
    """Each row's parts, and the floor's, each run twice (the second figures are kept: the first
    warms the buffer pool and the interpreter)."""
    out: dict[str, dict[str, float]] = {}
    for _ in range(2):
        out["floor"] = floor(count)
        for row, options in ROWS.items():
            out[row] = ours(count, **options)
    from .workloads import reset

    reset()
    return out
