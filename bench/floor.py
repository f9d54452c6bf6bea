"""The floor: the least work that closes a due order through the same MariaDB (or PostgreSQL) and Redis.

    python -m bench.floor

A hand-written closer with nothing else: one Lua claim of a batch
(ZRANGEBYSCORE + ZREM, no lease, nothing kept for a crash), then one
``UPDATE ... WHERE id IN (...) AND status = 'unpaid' AND expires_at <= now``
and one COMMIT per batch through the database driver (no ORM, no row read,
no signal, no retry, no clock of its own), and a sleep until the next score,
at most ``IDLE_POLL`` (it has no wake-up: a short poll stands in for one),
when nothing is due. It promises nothing; it tells what this machine's
servers allow, so our rows can be read as ratios to it.

It closes the rows of the model ``ORDER_TIMEOUT['ORDER_MODEL']`` names, with that
model's own status values: the app's ``Order`` for the floor row, the shop's
``ShopOrder`` ('Pending' -> 'Cancelled') for floor_shop. With
BENCH_FLOOR_STATUS_CHANGES=1 (floor_shop) it also does, between its UPDATE and its
COMMIT, what the shop's batch receiver does for the same rows
(testproject/shop/receivers.py ``write_status_changes``): the one INSERT of the
batch's ``OrderStatusChange`` rows that its ``bulk_create`` has Django send, the
same statement with the same columns and values (``StatusChanges``), through the
driver. Our shop-batch row is then held to what is left: the app's share.

Its commit times go to BENCH_RECORD_DIR in the recorder's format (at exit; as they commit
with BENCH_RECORD_EAGER=1, as the recorder does).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.stopping import stop_on_sigterm

FLOOR_KEY = "bench:floor:zset"
BATCH = 500
# Longest idle sleep: new members may fall due before the head it slept for.
IDLE_POLL = 0.01
CLAIM = """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
if #due > 0 then redis.call('ZREM', KEYS[1], unpack(due)) end
return due
"""
# "1": write the shop's status-change rows after the UPDATE (floor_shop's closers, bench/systems.py).
STATUS_CHANGES_ENV = "BENCH_FLOOR_STATUS_CHANGES"
stopping = threading.Event()


@dataclass(frozen=True)
class StatusChanges:
    """The INSERT of a batch's status-change rows as the shop's ``orders_expired`` receiver has
    Django send it (``OrderStatusChange.objects.bulk_create``): multi-row VALUES, on PostgreSQL
    one array a column through UNNEST (for more than one row, as Django's compiler does), the
    new ids returned where the database can (as ``bulk_create`` asks for them)."""

    table: str
    columns: str
    # Each column's array cast for UNNEST, as Django writes them (``varchar[]``, not ``varchar(100)[]``).
    casts: tuple[str, ...]
    returning: str
    unnest: bool
    # How Django sends a datetime to this database (a naive UTC string on MariaDB).
    adapt: Callable[[datetime], Any]

    @classmethod
    def of(cls, connection: Any) -> StatusChanges:
        from testproject.shop.models import OrderStatusChange

        opts = OrderStatusChange._meta
        # bulk_create's fields: every concrete one but the generated key.
        fields = [field for field in opts.concrete_fields if field is not opts.pk]
        assert [field.column for field in fields] == ["order_id", "old_status", "new_status", "date_created"]
        quote = connection.ops.quote_name
        table = quote(opts.db_table)
        returning = (f" RETURNING {table}.{quote(opts.pk.column)}"
                     if connection.features.can_return_rows_from_bulk_insert else "")
        return cls(table=table, columns=", ".join(quote(field.column) for field in fields),
                   casts=tuple((field.db_type(connection) or "").split("(")[0] for field in fields),
                   returning=returning, unnest=connection.vendor == "postgresql",
                   adapt=connection.ops.adapt_datetimefield_value)

    def statement(self, pks: Sequence[int], old: str, new: str, at: datetime) -> tuple[str, list[Any]]:
        """The INSERT of these orders' rows (``old`` -> ``new``, written at ``at``) and its parameters."""
        created = self.adapt(at)
        if self.unnest and len(pks) > 1:
            arrays = ", ".join(f"(%s)::{cast}[]" for cast in self.casts)
            count = len(pks)
            return (f"INSERT INTO {self.table} ({self.columns}) SELECT * FROM UNNEST({arrays}){self.returning}",
                    [list(pks), [old] * count, [new] * count, [created] * count])
        rows = ", ".join(["(%s, %s, %s, %s)"] * len(pks))
        return (f"INSERT INTO {self.table} ({self.columns}) VALUES {rows}{self.returning}",
                [value for pk in pks for value in (pk, old, new, created)])

    def write(self, cursor: Any, pks: Sequence[int], old: str, new: str) -> None:
        cursor.execute(*self.statement(pks, old, new, datetime.now(UTC)))
        if self.returning:
            cursor.fetchall()  # the new ids, read as bulk_create reads them


@dataclass(frozen=True)
class Closer:
    """The floor's statements on one order model and one database, written once at start."""

    table: str
    pk: str
    status: str
    unpaid: str
    closed: str
    now_sql: str
    # The shop's status-change rows after the UPDATE (None: the floor row writes none).
    changes: StatusChanges | None = None

    @classmethod
    def of(cls, model: Any, connection: Any, status_changes: bool = False) -> Closer:
        (unpaid,) = model.TIMEOUT_UNPAID_STATUSES  # one: it is each status-change row's old status
        return cls(table=model._meta.db_table, pk=model._meta.pk.column,
                   status=model._meta.get_field(model.TIMEOUT_STATUS_FIELD).column, unpaid=unpaid,
                   closed=model.TIMEOUT_CLOSED_STATUS,
                   now_sql="UTC_TIMESTAMP(6)" if connection.vendor == "mysql" else "STATEMENT_TIMESTAMP()",
                   changes=StatusChanges.of(connection) if status_changes else None)

    def update(self, pks: Sequence[int]) -> tuple[str, list[Any]]:
        """The close: what our close writes (``closing_values``), on the due unpaid ones of ``pks``."""
        return (f"UPDATE {self.table} SET {self.status} = %s, closed_at = {self.now_sql}, close_reason = 'timeout' "
                f"WHERE {self.pk} IN ({', '.join(['%s'] * len(pks))}) AND {self.status} = %s "
                f"AND expires_at <= {self.now_sql}", [self.closed, *pks, self.unpaid])

    def close(self, cursor: Any, pks: list[int]) -> list[int] | None:
        """The UPDATE, then the status-change rows of the orders it closed: ``pks``, or None when it
        closed fewer (one paid meanwhile) and which is not known; the caller rolls back and calls
        ``close_locked``. Never in the benchmark's workloads, whose claimed orders are all due."""
        cursor.execute(*self.update(pks))
        if self.changes is None:
            return pks
        if cursor.rowcount != len(pks):
            return None
        self.changes.write(cursor, pks, self.unpaid, self.closed)
        return pks

    def close_locked(self, cursor: Any, pks: list[int]) -> list[int]:
        """The same, the due unpaid ones of ``pks`` locked and read first: the rows it closes."""
        assert self.changes is not None
        cursor.execute(f"SELECT {self.pk} FROM {self.table} WHERE {self.pk} IN ({', '.join(['%s'] * len(pks))}) "
                       f"AND {self.status} = %s AND expires_at <= {self.now_sql} FOR UPDATE", [*pks, self.unpaid])
        due = [int(row[0]) for row in cursor.fetchall()]
        if due:
            cursor.execute(*self.update(due))
            self.changes.write(cursor, due, self.unpaid, self.closed)
        return due


def main() -> None:
    import django

    django.setup()
    from django.db import connection
    from django_redis import get_redis_connection

    from order_timeout import get_order_model

    from . import recorder

    eager = recorder.eager()
    client = get_redis_connection("order_timeout")
    claim = client.register_script(CLAIM)
    closer = Closer.of(get_order_model(), connection, os.environ.get(STATUS_CHANGES_ENV) == "1")
    commits: list[tuple[int, float]] = []
    stop_on_sigterm(stopping)
    connection.ensure_connection()
    raw = connection.connection
    raw.autocommit(False) if connection.vendor == "mysql" else setattr(raw, "autocommit", False)
    cursor = raw.cursor()
    print("ready", flush=True)
    while not stopping.is_set():
        due = claim(keys=[FLOOR_KEY], args=[int(time.time() * 1000), BATCH])
        if not due:
            head = client.zrange(FLOOR_KEY, 0, 0, withscores=True)
            wait = (head[0][1] / 1000 - time.time()) if head else IDLE_POLL
            stopping.wait(min(max(wait, 0.0), IDLE_POLL))
            continue
        pks = closer.close(cursor, [int(member) for member in due])
        if pks is None:
            raw.rollback()
            pks = closer.close_locked(cursor, [int(member) for member in due])
        raw.commit()
        at = time.time()
        if eager:  # the crash workload: records that outlive a SIGKILL
            recorder.append([(pk, at) for pk in pks])
        else:
            commits += [(pk, at) for pk in pks]
    directory = os.environ.get("BENCH_RECORD_DIR")
    if directory and commits:
        with (Path(directory) / f"commits-{os.getpid()}.txt").open("a") as out:
            out.write("".join(f"{pk} {at:.6f}\n" for pk, at in commits))


if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    main()
