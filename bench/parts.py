"""Where a close's time goes, per claimed member, part by part, and what promise each part buys.

One consumer, in this process, closes a burst of due orders as a row's
closers would (the burst row's work, without the second consumer), and each
part of the path is timed where it runs: the lifecycle's functions and the
driver's statements are wrapped, and each wrapper counts its own time less
that of the wrapped parts inside it (exclusive time, so the parts add up to
the whole). The floor's three steps (``bench/floor.py``: one Lua claim, one
UPDATE, one COMMIT per batch) are timed the same way on the same rows, so each
part reads against what the least possible close spends. Wall time per
claimed member (the floor closes every order it claims): a statement's part
includes the server's work for it. The wrappers themselves cost about 0.2 us
per call (a call per order for the per-order signal, a few per batch for the
rest). The rows run in alternated rounds, and each part is its median
(``measure``).
"""

from __future__ import annotations

import functools
import gc
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.db import connection
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
    """The part a query is: by its first statement past a ``BEGIN`` (a batch's two round trips send
    ``BEGIN; SELECT ... FOR UPDATE; ...`` and ``UPDATE ...; COMMIT``, db/two_trips.py)."""
    statements = [statement for statement in sql.split("; ")
                  if statement.lstrip().split(None, 1)[0].upper() not in ("BEGIN", "START")]
    sql = statements[0] if statements else sql
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


def ours(row: str, count: int) -> dict[str, float]:
    """Microseconds per claimed member, by part, for one consumer closing ``count`` due orders as
    ``row``'s closers do (bench/shapes.py: its settings and receivers; its held tenth, ``System.hold``).

    Per claimed member: a held order is claimed, locked and read like the others and then not
    closed, so per closed order the held row's claim, lock and read would be spread over fewer
    orders than the plain row's. The total per closed order is kept too, as ``total_per_closed``.
    The notices row's consumer serves the close alone: its parts are the close's (the notices'
    INSERT is its batch receiver's part), not their delivery."""
    from order_timeout.consumer import Consumer
    from order_timeout.scheduling import order_kinds

    from .shapes import reproduced
    from .systems import SYSTEMS
    from .workloads import keep_statistics

    system = SYSTEMS[row](Path())
    model = system.model
    orders = _due_orders(model, count)
    system.hold(orders)
    keep_statistics(model)
    system.enqueue(orders)  # as the harness does, before the closers' settings
    # A consumer holds no burst of instances: these would slow every garbage collection of the run.
    del orders
    gc.collect()
    parts = Parts()
    with reproduced(type(system)):
        consumer = Consumer(model=model, batch_size=int(getattr(system, "batch", 500)), kinds=order_kinds())
        consumer.sync_clock()
        with _wrapped(parts):
            began = time.perf_counter()
            # The consumer's loop, as a closer runs it (each batch's ack with the next claim), until
            # nothing is due.
            stats = consumer.run(once=True)
            total = time.perf_counter() - began
    claimed, closed = stats.claimed, stats.closed
    parts.seconds["lifecycle bookkeeping"] += total - sum(parts.seconds.values())
    return {part: round(1e6 * parts.seconds.get(part, 0.0) / claimed, 2) for part in PROMISES} | {
        "total": round(1e6 * total / claimed, 2), "total_per_closed": round(1e6 * total / closed, 2),
        "claimed": claimed, "closed": closed}


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


# The rows whose parts are measured (when the run has them), in the report's order.
ROWS = ("ours", "ours_per_order", "ours_held", "ours_shop_batch", "ours_notices")


def measure(count: int, rows: list[str], rounds: int = 3) -> dict[str, dict[str, float]]:
    """The floor's parts and each of ``rows``' (``ROWS``), in alternated rounds (floor, A, B, floor,
    A, B, ...) after one round that is thrown away (it warms the buffer pool and the interpreter):
    each part's median over the rounds, so a slow moment of the machine lands in one round of every
    row rather than in every round of one."""
    from .workloads import reset

    runs: dict[str, Callable[[], dict[str, float]]] = {"floor": lambda: floor(count)}
    runs |= {row: functools.partial(ours, row, count) for row in ROWS if row in rows}
    try:
        return alternated(runs, rounds)
    finally:
        reset()


def alternated(runs: dict[str, Callable[[], dict[str, float]]], rounds: int,
               warm_up: int = 1) -> dict[str, dict[str, float]]:
    """Each of ``runs`` once a round, in turn, ``warm_up`` + ``rounds`` rounds; of the last
    ``rounds``, each figure's median, and how many rounds it is the median of."""
    kept: dict[str, list[dict[str, float]]] = {name: [] for name in runs}
    for number in range(warm_up + rounds):
        for name, run in runs.items():
            figures = run()
            if number >= warm_up:
                kept[name].append(figures)
    return {name: {figure: statistics.median(each[figure] for each in measured) for figure in measured[0]}
            | {"rounds": len(measured)} for name, measured in kept.items()}
