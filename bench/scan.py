"""``python -m bench.scan [--rows N] [--out DIR]``: the keyset walk's cost, chunk by chunk, on a large table.

The compensation scan and the drift count walk every unpaid row in
``(expires_at, pk)`` order (``order_timeout/db/walk.py``). A walk whose chunk
query gives the planner no start on the ``(status, expires_at)`` index costs
more with every chunk; this measures the first, middle and last chunks of both
walks over ``--rows`` unpaid orders, with the walk as it is ("after") and with
the OR-only predicate it had before ("before"), and checks the target: the last
chunk costs at most twice the first. ``--report DIR`` prints the databases'
results side by side.

Run through ``scripts/bench --scan``, which points DATABASE_URL at a database
of the benchmark's own (``order_timeout_bench``) and REDIS_URL at Redis
database 10; both are emptied here.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType
from typing import Any
from unittest import mock

from . import standalone

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")

ROOT = Path(__file__).resolve().parent.parent
FULL_ROWS = 1_000_000
# The target: a walk's cost must not grow with its position in the table.
MAX_LAST_TO_FIRST = 2.0
# Each position's cost is the median of this many chunks there: one chunk costs a few
# milliseconds, and a single one says as much about the machine's noise as about the walk.
WINDOW = 10
# Rows inserted per statement, so no transaction holds a million rows' undo.
INSERT_SLICE = 200_000
# Three orders to a deadline (one a millisecond): ties everywhere, and a chunk of 500 ends inside one.
PER_DEADLINE = 3

Walk = Callable[..., Iterator[list[tuple[Any, datetime]]]]


def old_rows_by_deadline(queryset: Any, size: int, *, field: str = "expires_at",
                         key: str = "pk") -> Iterator[list[tuple[Any, datetime]]]:
    """The walk before the lower bound, for the "before" rows only: the OR alone."""
    from django.db.models import Q

    ordered = queryset.order_by(field, key).values_list(key, field)
    after: tuple[datetime, Any] | None = None
    while True:
        page = ordered
        if after is not None:
            page = page.filter(Q(**{f"{field}__gt": after[0]}) | Q(**{field: after[0], f"{key}__gt": after[1]}))
        rows = list(page[:size])
        if not rows:
            return
        yield rows
        after = (rows[-1][1], rows[-1][0])


@dataclass
class Measured:
    """One walk by one caller: what each chunk's query cost, and which rows came back in what order."""

    caller: str
    walk: str
    chunk_ms: list[float]
    rows: int = 0
    fingerprint: str = ""
    total_s: float = 0.0

    def at(self, position: str) -> float:
        """The median cost of ``WINDOW`` chunks at the start, middle or end of the walk."""
        n = len(self.chunk_ms)
        width = max(1, min(WINDOW, n // 3))
        start = {"first": 0, "middle": max(0, n // 2 - width // 2), "last": n - width}[position]
        return statistics.median(self.chunk_ms[start:start + width])

    def costliest(self) -> float:
        """The costliest ``WINDOW`` chunks in a row, wherever they are (a plan may change near the end)."""
        width = max(1, min(WINDOW, len(self.chunk_ms) // 3))
        return max(statistics.median(self.chunk_ms[start:start + width])
                   for start in range(len(self.chunk_ms) - width + 1))

    def summary(self) -> dict[str, Any]:
        first, last = self.at("first"), self.at("last")
        return {"caller": self.caller, "walk": self.walk, "chunks": len(self.chunk_ms), "rows": self.rows,
                "first_ms": first, "middle_ms": self.at("middle"), "last_ms": last, "costliest_ms": self.costliest(),
                "last_to_first": last / first, "total_s": self.total_s, "fingerprint": self.fingerprint}


def walkers() -> list[ModuleType]:
    """The app's modules that walk with ``keyset.rows_by_deadline`` (each imported it by name)."""
    from order_timeout.db import walk as keyset

    return [module for name, module in list(sys.modules.items())
            if name.startswith("order_timeout") and module is not keyset
            and getattr(module, "rows_by_deadline", None) is keyset.rows_by_deadline]


@contextmanager
def timing(walk: Walk, measured: Measured) -> Iterator[None]:
    """Run the app's own code with ``walk`` as its walk, timing each chunk's fetch.

    The callers are timed as they run (the scan's lock renewals and Redis
    look-ups, the drift count's ``missing``); the chunk figures are the fetches
    alone, the query the keyset decides.
    """
    digest = hashlib.blake2b(digest_size=8)

    def timed(queryset: Any, size: int, **how: Any) -> Iterator[list[tuple[Any, datetime]]]:
        chunks = walk(queryset, size, **how)
        while True:
            began = time.perf_counter()
            rows = next(chunks, None)
            if rows is None:
                return
            measured.chunk_ms.append((time.perf_counter() - began) * 1000)
            measured.rows += len(rows)
            digest.update(",".join(str(pk) for pk, _ in rows).encode())
            yield rows

    patches = [mock.patch.object(module, "rows_by_deadline", timed) for module in walkers()]
    if not patches:
        raise RuntimeError("no module of the app walks with keyset.rows_by_deadline: nothing to time")
    began = time.perf_counter()
    with ExitStack() as stack:
        for patch in patches:
            stack.enter_context(patch)
        yield
    measured.total_s = time.perf_counter() - began
    measured.fingerprint = digest.hexdigest()


# -- the table: a million unpaid orders, overdue, and known to Redis -----------------------------


def empty_tables() -> None:
    """Empty the orders table and what refers to it (the benchmark's own database only)."""
    from django.db import connection

    from order_timeout.models import DeadLetter, Order
    from testproject.shop.models import OrderPayment

    tables = [model._meta.db_table for model in (Order, OrderPayment, DeadLetter)]
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(f"TRUNCATE TABLE {', '.join(tables)} RESTART IDENTITY CASCADE")
            return
        cursor.execute("SET FOREIGN_KEY_CHECKS = 0")
        for table in tables:
            cursor.execute(f"TRUNCATE TABLE {table}")
        cursor.execute("SET FOREIGN_KEY_CHECKS = 1")


def insert_orders(rows: int, first_deadline: datetime, per_deadline: int) -> None:
    """``rows`` unpaid orders, ``per_deadline`` to each deadline (a millisecond apart) in the order
    they were placed, from one INSERT ... SELECT over the database's own number generator per slice."""
    from django.db import connection, transaction

    from order_timeout.models import Order

    table = Order._meta.db_table
    columns = "status, expires_at, closed_at, close_reason, created_at"
    with connection.cursor() as cursor:
        for start in range(1, rows + 1, INSERT_SLICE):
            end = min(start + INSERT_SLICE - 1, rows)
            with transaction.atomic():
                if connection.vendor == "postgresql":
                    cursor.execute(
                        f"INSERT INTO {table} ({columns}) SELECT 'unpaid', %s + (g / {per_deadline}) "
                        f"* interval '1 millisecond', NULL, '', now() FROM generate_series(%s, %s) g",
                        [first_deadline, start, end])
                else:
                    # MariaDB's SEQUENCE engine: seq_1_to_N is a table of the numbers 1..N.
                    cursor.execute(
                        f"INSERT INTO {table} ({columns}) SELECT 'unpaid', TIMESTAMPADD(MICROSECOND, "
                        f"(seq DIV {per_deadline}) * 1000, %s), NULL, '', UTC_TIMESTAMP(6) "
                        f"FROM seq_{start}_to_{end}", [first_deadline.replace(tzinfo=None)])
        cursor.execute(f"ANALYZE {table}" if connection.vendor == "postgresql" else f"ANALYZE TABLE {table}")
        if connection.vendor != "postgresql":
            cursor.fetchall()


def schedule_all() -> None:
    """Every order's member in Redis at its deadline: a healthy queue, so the drift count finds none."""
    from order_timeout.models import Order
    from order_timeout.queue import TimeoutQueue
    from order_timeout.timers.members import deadline_score, order_member

    queue = TimeoutQueue.from_settings()
    batch: dict[str, int] = {}
    for pk, expires_at in Order._base_manager.values_list("pk", "expires_at").iterator(chunk_size=20_000):
        if expires_at is not None:
            batch[order_member(Order, pk)] = deadline_score(expires_at)
        if len(batch) == 50_000:
            queue.schedule(batch)
            batch = {}
    queue.schedule(batch)


# -- the two callers --------------------------------------------------------------------------


def scan_walk(walk: Walk, name: str, chunk: int) -> Measured:
    """The close scan as it runs (a dry run, so the rows stay for the next walk)."""
    from order_timeout.scans import compensation

    measured = Measured("compensation scan", name, [])
    with timing(walk, measured):
        result = compensation.compensate(dry_run=True, chunk_size=chunk)
    assert result.examined == measured.rows, (result.examined, measured.rows)
    return measured


def drift_walk(walk: Walk, name: str, chunk: int) -> Measured:
    from django.conf import settings
    from django.test import override_settings

    from order_timeout.models import Order
    from order_timeout.queue import TimeoutQueue
    from order_timeout.reporting import health

    measured = Measured("count_drift", name, [])
    with (override_settings(ORDER_TIMEOUT={**settings.ORDER_TIMEOUT, "COMPENSATION_CHUNK": chunk}),
          timing(walk, measured)):
        drift = health.count_drift(Order, TimeoutQueue.from_settings())
    assert drift == 0, f"{drift} orders missing from Redis"
    return measured


def measure(rows: int, chunk: int, per_deadline: int) -> list[Measured]:
    from order_timeout.db.walk import rows_by_deadline

    empty_tables()
    began = time.perf_counter()
    insert_orders(rows, datetime.now(UTC) - timedelta(days=30), per_deadline)
    schedule_all()
    print(f"  {rows:,} unpaid orders inserted and scheduled in {time.perf_counter() - began:.0f} s", flush=True)
    drift_walk(rows_by_deadline, "warm-up", chunk)  # the table and its index in memory for everyone
    results = []
    for caller in (scan_walk, drift_walk):
        for name, walk in (("before", old_rows_by_deadline), ("after", rows_by_deadline)):
            print(f"  {caller.__name__}, {name} ...", flush=True)
            results.append(caller(walk, name, chunk))
    empty_tables()
    return results


# -- the report -------------------------------------------------------------------------------


def database_name() -> str:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT VERSION()")
        version = str(cursor.fetchone()[0])
    return f"PostgreSQL {version.split()[1]}" if connection.vendor == "postgresql" else f"MariaDB {version}"


def commit() -> str:
    """The commit measured, as the docs name a run."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    changed = git("status", "--porcelain", "--untracked-files=no")
    return git("rev-parse", "--short", "HEAD") + (" with uncommitted changes" if changed else "")


def by_caller(result: dict[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    """caller -> walk ("before", "after") -> its row."""
    callers: dict[str, dict[str, dict[str, Any]]] = {}
    for row in result["rows"]:
        callers.setdefault(row["caller"], {})[row["walk"]] = row
    return callers


def same_rows(result: dict[str, Any]) -> bool:
    """Both walks of each caller returned the same rows in the same order."""
    return all(walks["before"]["fingerprint"] == walks["after"]["fingerprint"]
               for walks in by_caller(result).values())


def failures(result: dict[str, Any]) -> list[str]:
    """What the run says is wrong: walks that return different rows, an "after" walk that grows."""
    found = [] if same_rows(result) else [f"{result['database']}: the walks returned different rows"]
    for caller, mine in by_caller(result).items():
        if mine["after"]["last_to_first"] > MAX_LAST_TO_FIRST:
            found.append(f"{result['database']}, {caller}: the last chunk costs "
                         f"{mine['after']['last_to_first']:.2f}x the first (target: at most "
                         f"{MAX_LAST_TO_FIRST:g}x)")
    return found


def markdown(results: list[dict[str, Any]]) -> str:
    lines = [
        f"Chunk cost: the median of {WINDOW} chunks' fetch (query and rows) at the start, the middle "
        f"and the end of the walk, and the costliest {WINDOW} in a row anywhere. Target: the last chunk "
        f"costs at most {MAX_LAST_TO_FIRST:g}x the first.",
        "",
        "| database | walk of | predicate | rows | chunks | first chunk (ms) | middle (ms) | last chunk (ms) "
        "| last ÷ first | target | costliest stretch (ms) | ÷ first | whole walk (s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for result in results:
        for row in result["rows"]:
            met = "met" if row["last_to_first"] <= MAX_LAST_TO_FIRST else "missed"
            predicate = "before: the OR alone" if row["walk"] == "before" else "after: `expires_at >=` first"
            lines.append(
                f"| {result['database']} | {row['caller']} | {predicate} | {row['rows']:,} | {row['chunks']:,} "
                f"| {row['first_ms']:.2f} | {row['middle_ms']:.2f} | {row['last_ms']:.2f} "
                f"| {row['last_to_first']:.2f}x | {met} | {row['costliest_ms']:.2f} "
                f"| {row['costliest_ms'] / row['first_ms']:.2f}x | {row['total_s']:.1f} |")
    first = results[0]
    lines += ["", f"Run: {first['commit']}, {first['date']}, chunk {first['chunk']}, "
                  f"{first.get('per_deadline', PER_DEADLINE):,} orders to a deadline, "
                  f"{first['cpus']} CPUs ({first['cpu']}); the same rows in the same order before and after: "
                  + ("yes" if all(same_rows(result) for result in results) else "NO")]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scan", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=FULL_ROWS,
                        help=f"Unpaid orders in the table (default {FULL_ROWS:,}; fewer for a quick run).")
    parser.add_argument("--chunk", type=int, default=500, help="Rows per chunk (COMPENSATION_CHUNK's default).")
    parser.add_argument("--per-deadline", type=int, default=PER_DEADLINE,
                        help=f"Orders sharing each deadline (default {PER_DEADLINE}; thousands: a deadline "
                             "policy that gives a whole day's orders one deadline).")
    parser.add_argument("--out", type=Path, default=Path("bench/out/scan"))
    parser.add_argument("--report", action="store_true",
                        help="Only print the results already in --out, every database side by side.")
    args = parser.parse_args(argv)
    if args.report:
        return standalone.report(args.out, markdown, failures)

    import django

    django.setup()
    from django.core.management import call_command
    from django_redis import get_redis_connection

    from . import ownership

    # It empties its tables and its Redis database: never let it near anything else.
    refused = standalone.refusal("--scan")
    if refused:
        print(f"Refusing to run: {refused}", file=sys.stderr)
        return 2
    call_command("migrate", verbosity=0)
    database = database_name()
    print(f"{database}: the keyset walk over {args.rows:,} rows", flush=True)
    results = measure(args.rows, args.chunk, args.per_deadline)
    client = get_redis_connection("order_timeout")
    client.flushdb()
    ownership.keep_mark(client)
    result = {"database": database, "commit": commit(), "date": datetime.now(UTC).date().isoformat(),
              "chunk": args.chunk, "per_deadline": args.per_deadline, "cpus": os.cpu_count(), "cpu": cpu_model(),
              "rows": [measured.summary() for measured in results],
              # Every chunk's figure, for a plot or a second look at a tail.
              "chunk_ms": {f"{m.caller}, {m.walk}": [round(ms, 3) for ms in m.chunk_ms] for m in results}}
    return standalone.write(args.out, result, markdown, failures)


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "?"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
