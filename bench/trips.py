"""``python -m bench.trips``: the round trips a batch costs, to the database and to Redis, for each
row's batch shape, counted on the wire (bench/roundtrips.py).

For each row of ``SHAPES``, in this process: a few batches' worth of orders,
made as the harness makes them (its held tenth, ``System.hold``; its reminders,
``System.enqueue``), a consumer with the row's closers' settings and receivers
(bench/shapes.py), the database connection and the queue's Redis behind
counting proxies, and each batch, its claim then its processing
(``Consumer.claim``, ``Consumer.process``), counted on its own. The claim of a
batch carries the last batch's ack, as a running consumer's does, so each
phase's first batch (which carries none and, the first time, opens the
connections) is left out, and its last ack, told on its own as before a
sleep, is counted apart. The reminders row has two phases, its reminders a
second before the deadline and then its closes. The notices row's batches are
its closes (each writing its notices); the deliveries come a lease later, in
batches of their own, and are not counted. Counts, not times: the proxies
hold each answer back.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .systems import System

# The batch shapes probed: the plain close, a held tenth, a reminder per order, an order_expired
# receiver per order, a notice per close.
SHAPES = ("ours", "ours_held", "ours_reminders", "ours_per_order", "ours_notices")
# Batches counted in each phase (after the one left out).
BATCHES = 3
# Seconds from the orders' making to their first member falling due: what making and enqueueing
# them may take; a reminders row's batches then have their reminder's lead before the closes.
MAKING = 2.0
# The queue's Redis through the proxy: a cache alias of the probe's own.
PROXY_ALIAS = "bench_trips"
DEFAULT_PORTS = {"mysql": 3306, "postgresql": 5432}


def measure(rows: list[str], batches: int = BATCHES, batch_size: int | None = None) -> dict[str, Any]:
    """Each of ``rows`` that has a shape here (``SHAPES``), on an emptied database and Redis."""
    from .workloads import reset

    out = {}
    try:
        for row in (row for row in SHAPES if row in rows):
            reset()
            out[row] = probe(row, batches, batch_size)
    finally:
        reset()
    return out


def probe(row: str, batches: int = BATCHES, batch_size: int | None = None) -> dict[str, Any]:
    """``row``'s batches, each with its round trips, phase by phase; ``error`` says why a phase is
    not what the row's closers see (its batches outlasted the time its kind had)."""
    from django.utils import timezone

    from .shapes import order_timeout_settings
    from .systems import SYSTEMS
    from .workloads import keep_statistics, make_orders

    system = SYSTEMS[row](Path())
    size = batch_size or int(getattr(system, "batch", 500))
    lead = max(order_timeout_settings(type(system)).get("REMINDERS", [0.0]))
    due = timezone.now() + timedelta(seconds=MAKING)
    deadline = due + timedelta(seconds=lead)
    orders = make_orders([deadline] * ((batches + 1) * size), system.model)
    system.hold(orders)
    keep_statistics(system.model)
    system.enqueue(orders)
    _load_scripts()
    phases = [("reminders", due, deadline), ("closes", deadline, None)] if lead else [("closes", deadline, None)]
    with _counted(type(system)) as (database, redis):
        consumer = _consumer(system, size)
        result: dict[str, Any] = {"batch_size": size, "phases": []}
        for name, starts, ends in phases:
            _sleep_until(starts)
            phase = _phase(consumer, len(orders), database, redis)
            if ends is not None and timezone.now() >= ends:
                result["error"] = f"its {name} outlasted the {lead:g} s they had before the deadline"
            result["phases"].append({"phase": name, **phase})
    return result


def _consumer(system: Any, size: int) -> Any:
    """A consumer as the row's closers build theirs (their settings are in force), its connections
    open: the database's clock read, the queue's Redis asked, the saves' Redis client too."""
    from order_timeout.consumer import Consumer
    from order_timeout.queue import TimeoutQueue
    from order_timeout.scheduling import order_kinds

    consumer = Consumer(model=system.model, batch_size=size, kinds=order_kinds())
    consumer.sync_clock()
    consumer.queue.client.ping()
    TimeoutQueue.for_saves().client.ping()
    return consumer


def _phase(consumer: Any, members: int, database: Any, redis: Any) -> dict[str, Any]:
    """Claim and process until ``members`` were claimed; each batch's trips but the first's, the
    empty claims' (a lane not due yet), and the last ack's, told on its own."""
    claimed, empty = 0, {"claims": 0, "database": 0, "redis": 0}
    counted: list[dict[str, Any]] = []
    first = True
    while claimed < members and empty["claims"] < 10:
        database.reset()
        redis.reset()
        now = consumer.clock()
        claim = consumer.claim(now)
        if not claim.members:
            empty = {"claims": empty["claims"] + 1, "database": empty["database"] + database.reset(),
                     "redis": empty["redis"] + redis.reset()}
            time.sleep(0.05)
            continue
        consumer.process(claim, now)
        claimed += len(claim.members)
        batch = {"kind": consumer.kind_of(claim)[0].label, "members": len(claim.members),
                 "database": database.reset(), "redis": redis.reset()}
        if not first:
            counted.append(batch)
        first = False
    database.reset()
    redis.reset()
    consumer.flush_acks()
    return {"claimed": claimed, "batches": counted, "empty_claims": empty,
            "last_ack": {"database": database.reset(), "redis": redis.reset()}}


def _load_scripts() -> None:
    """Every queue script in Redis's cache: a first EVALSHA refused (NOSCRIPT) would cost a batch a
    trip the next run does not pay."""
    from django_redis import get_redis_connection

    from order_timeout.conf import settings
    from order_timeout.queue import SCRIPT_NAMES, load_script_source

    client = get_redis_connection(settings.REDIS_ALIAS)
    for name in SCRIPT_NAMES:
        client.script_load(load_script_source(name))


@contextmanager
def _counted(system: type[System]) -> Iterator[tuple[Any, Any]]:
    """The row's closers' settings and receivers (bench/shapes.py), with the database connection
    and the queue's Redis behind counting proxies."""
    from .shapes import reproduced

    with reproduced(system), behind_proxies() as proxies:
        yield proxies


@contextmanager
def behind_proxies() -> Iterator[tuple[Any, Any]]:
    """Django's database connection and the queue's Redis (``REDIS_ALIAS``, through an alias of its
    own: every client built from the settings inside) through ``RoundTrips`` proxies."""
    from django.conf import settings
    from django.db import connection
    from django.test import override_settings
    from django_redis import get_redis_connection

    from order_timeout.conf import settings as order_settings

    from .roundtrips import RoundTrips

    alias = order_settings.REDIS_ALIAS
    target = get_redis_connection(alias).connection_pool.connection_kwargs
    if "host" not in target:
        raise RuntimeError(f"CACHES[{alias!r}] is not one Redis server on TCP: the probe counts one")
    kept = {"HOST": connection.settings_dict["HOST"], "PORT": connection.settings_dict["PORT"]}
    with (RoundTrips(kept["HOST"] or "127.0.0.1", int(kept["PORT"] or DEFAULT_PORTS[connection.vendor])) as database,
          RoundTrips(target["host"], int(target["port"])) as redis):
        credentials = f"{target.get('username') or ''}:{target['password']}@" if target.get("password") else ""
        location = f"redis://{credentials}127.0.0.1:{redis.port}/{target.get('db', 0)}"
        caches = {**settings.CACHES, PROXY_ALIAS: {**settings.CACHES[alias], "LOCATION": location}}
        connection.close()
        connection.settings_dict.update(HOST="127.0.0.1", PORT=str(database.port))
        try:
            with override_settings(CACHES=caches,
                                   ORDER_TIMEOUT={**settings.ORDER_TIMEOUT, "REDIS_ALIAS": PROXY_ALIAS}):
                yield database, redis
        finally:
            connection.close()
            connection.settings_dict.update(kept)


def _sleep_until(moment: datetime) -> None:
    from django.utils import timezone

    # A little past it: the database decides what is due, by its own clock.
    wait = (moment - timezone.now()).total_seconds() + 0.05
    if wait > 0:
        time.sleep(wait)


def rows_of(trips: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Each row's phases as the report writes them: the batches' members, their round trips each
    (database / Redis), the last ack's; keyed by the row and its batches' kind."""
    out = {}
    for row, probed in trips.items():
        for phase in probed["phases"]:
            batches = phase["batches"]
            kinds = sorted({batch["kind"] for batch in batches}) or [phase["phase"]]
            trips_each = [f"{batch['database']} / {batch['redis']}" for batch in batches]
            out[f"{row}: {', '.join(kinds)}"] = {
                "members": ", ".join(str(count) for count in sorted({batch["members"] for batch in batches})) or "-",
                "each": (f"{trips_each[0]} (each of {len(batches)})" if len(set(trips_each)) == 1
                         else ", ".join(trips_each) or "-"),
                "last_ack": f"{phase['last_ack']['database']} / {phase['last_ack']['redis']}",
                "error": probed.get("error") or ""}
    return out


# What the table's numbers are, for the report and for ``python -m bench.trips``.
ABOUT = ("Round trips per batch (database / Redis), counted on the wire by a proxy in front of each server "
         "(bench/roundtrips.py): one consumer in the harness's process, as each row's closers run it "
         "(bench/shapes.py), batch after batch, each batch's claim (which carries the last batch's ack) and "
         "its processing; each phase's first batch is left out (no ack to carry), and its last ack, told on "
         "its own as before a sleep, is counted apart. The notices row's batches are its closes; their "
         "deliveries, a lease later, are not counted.")


def lines(trips: dict[str, Any]) -> list[str]:
    """The table of the report (bench/report.py) and of ``python -m bench.trips``."""
    if not trips:
        return []
    out = ["| row: batches of | members a batch | round trips per batch (database / Redis) "
           "| the last ack, on its own (database / Redis) |", "|---|---|---|---|"]
    for name, row in rows_of(trips).items():
        error = f" **{row['error']}**" if row["error"] else ""
        out.append(f"| {name}{error} | {row['members']} | {row['each']} | {row['last_ack']} |")
    return out


def main(argv: list[str]) -> int:
    """Probe the shapes on DATABASE_URL and REDIS_URL, which it empties: the benchmark's own only."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    # The harness's process, as bench/__main__.py sets it: no timer, notice or record of the shop's own.
    for name in ("SHOP_RECORD_EXPIRIES", "SHOP_TIMERS", "SHOP_NOTICES"):
        os.environ[name] = "0"
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    parser = argparse.ArgumentParser(prog="python -m bench.trips", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default=",".join(SHAPES), help="Comma-separated rows (default: every shape).")
    parser.add_argument("--batches", type=int, default=BATCHES)
    parser.add_argument("--batch-size", type=int, help="Members a claim takes (default: the row's, 500).")
    parser.add_argument("--json", action="store_true", help="Print the counts as JSON, not as a table.")
    args = parser.parse_args(argv)
    if not connection.settings_dict["NAME"].endswith("_bench") or os.environ.get("BENCH_OK") != "1":
        print("Refusing to run: it empties the database and Redis it is given. Point DATABASE_URL at a "
              "database whose name ends in _bench and REDIS_URL at a Redis database of the benchmark's, "
              "and set BENCH_OK=1 (scripts/bench does this for python -m bench).", file=sys.stderr)
        return 2
    call_command("migrate", verbosity=0)
    trips = measure(args.rows.split(","), args.batches, args.batch_size)
    print(json.dumps(trips, indent=2) if args.json else "\n".join([ABOUT, "", *lines(trips)]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
