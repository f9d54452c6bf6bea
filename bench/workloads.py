"""The workloads: idle, steady, burst (per system), and the claim and create micro-measures."""

from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.db import connection, transaction
from django.db.models.signals import post_save
from django.utils import timezone
from django_redis import get_redis_connection

from order_timeout.models import Order
from order_timeout.queue import TimeoutQueue
from order_timeout.scheduling import order_saved
from order_timeout.timers.members import now_score

from . import gc_pauses
from .broker import broker_backlog, flush_broker
from .measure import ClientCommands, Counters, process_tree, redis_memory, rss_bytes, summary
from .ownership import keep_mark
from .recorder import read_commits
from .systems import System


@dataclass(frozen=True)
class Sizes:
    steady_rate: int
    steady_seconds: float
    burst: int
    idle: int
    celery_idle: int
    idle_seconds: float
    cap_seconds: float
    claim_sizes: tuple[int, ...]
    create_samples: int
    bulk_schedule: int
    # Seconds between the end of production and the first deadline, at least.
    lead_seconds: float
    # The crash workload (bench/crash.py): orders due at one instant (several of our batches of 500,
    # so the killed consumer holds one); most seconds it waits after the kill (a row still closing
    # or holding orders in flight; the others stop sooner); LEASE_SECONDS of our consumers there
    # (None: the default, 30 s).
    crash: int
    crash_cap_seconds: float
    crash_lease_seconds: float | None
    # Due orders one consumer closes in the harness's process, timed part by part (bench/parts.py).
    parts: int


FULL = Sizes(steady_rate=1000, steady_seconds=60, burst=100_000, idle=1_000_000, celery_idle=20_000,
             idle_seconds=10, cap_seconds=90, claim_sizes=(10_000, 100_000, 1_000_000),
             create_samples=2000, bulk_schedule=1_000_000, lead_seconds=2, crash=20_000,
             crash_cap_seconds=120, crash_lease_seconds=None, parts=20_000)
QUICK = Sizes(steady_rate=200, steady_seconds=2, burst=1_000, idle=10_000, celery_idle=300,
              idle_seconds=1.5, cap_seconds=15, claim_sizes=(10_000, 100_000), create_samples=150,
              bulk_schedule=20_000, lead_seconds=1, crash=2_000, crash_cap_seconds=20,
              crash_lease_seconds=2, parts=2_000)


def reset() -> None:
    """Empty the orders tables (and every table keyed by an order: TRUNCATE reuses the ids, and
    a payment or a sent reminder left over would hold or silence a new order with its id; the
    shop's expiry records, which the slow receivers workload writes), the queue's Redis database
    and Celery's broker database."""
    from order_timeout.models import DeadLetter, Notice, QueueEpoch, Reminder
    from testproject.shop.models import Expiry, OrderPayment, OrderStatusChange, ReminderEmail, ShopOrder

    # QueueEpoch too: the queues start new (set up by the first consumer), not lost by Redis.
    tables = [model._meta.db_table for model in (Order, ShopOrder, OrderStatusChange, OrderPayment, Reminder,
                                                 ReminderEmail, DeadLetter, Notice, QueueEpoch, Expiry)]
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(f"TRUNCATE TABLE {', '.join(tables)} CASCADE")
        else:
            cursor.execute("SET FOREIGN_KEY_CHECKS = 0")
            for table in tables:
                cursor.execute(f"TRUNCATE TABLE {table}")
            cursor.execute("SET FOREIGN_KEY_CHECKS = 1")
    client = get_redis_connection("order_timeout")
    client.flushdb()
    keep_mark(client)
    flush_broker()


def make_orders(deadlines: list[datetime], model: Any = Order) -> list[Any]:
    orders: list[Any] = []
    for start in range(0, len(deadlines), 5000):
        orders += model.objects.bulk_create(
            [model(expires_at=deadline) for deadline in deadlines[start:start + 5000]])
    return orders


def keep_statistics(model: Any) -> None:
    """The planner's statistics of the tables a workload just filled, as a live shop's database
    keeps them (PostgreSQL's autovacuum, InnoDB's recalculation): the orders' table was emptied
    and filled a moment ago, and with the statistics of an empty one PostgreSQL planned the
    hold's statement as a scan of the whole orders and payments tables for each batch (7.4 ms a
    batch of 500, 1.6 ms with statistics). Before the workload's deadline, for every row."""
    from testproject.shop.models import OrderPayment, Payment

    tables = ", ".join(table._meta.db_table for table in (model, OrderPayment, Payment))
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {tables}" if connection.vendor == "postgresql" else f"ANALYZE TABLE {tables}")
        if cursor.description:
            cursor.fetchall()


@dataclass
class Phase:
    """One timed workload on one system: what was asked, and the counters around it."""

    kind: str
    orders: int
    start: datetime
    pk_range: tuple[int, int]
    expires: dict[int, datetime] = field(default_factory=dict)
    production_s: float = 0.0
    production_overran_s: float = 0.0
    db_queries: int = 0
    redis_commands: int = 0
    finished: bool = False
    slowest_script_us: int | None = None
    # The slowest script calls: (time, µs, script name or sha), for finding a tail's cause.
    slow_scripts: list[tuple[float, int, str]] = field(default_factory=list)
    waited_s: float = 0.0
    # Orders held by a payment in flight (OursHeld): they stay open, and are counted apart.
    held: set[int] = field(default_factory=set)
    # CPU seconds (user + system) the closers' processes spent while it ran.
    cpu_s: float | None = None
    # The notices rows (bench/notices.py): the orders closed, what reached the sink, what the row
    # still held when the wait for them ended, that wait, and the closers' CPU through it.
    closed_pks: set[int] | None = None
    received: list[tuple[str, float]] = field(default_factory=list)
    notices_pending: int = 0
    notices_waited_s: float = 0.0
    cpu_through_notices_s: float | None = None
    # Wall times (time.time()) of the counters' start and stop: the closers' garbage collections
    # that began between them are the workload's (bench/gc_pauses.py).
    window: tuple[float, float] = (0.0, 0.0)


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds of these processes and theirs, so far (/proc, clock ticks)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in {tree_pid for root in pids for tree_pid in process_tree(root)}:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / ticks


def idle(system: System, sizes: Sizes) -> dict[str, Any]:
    """Nothing due, many pending: what the closers cost while they wait."""
    client = get_redis_connection("order_timeout")
    # A Celery task per pending order, published one by one (to a broker that confirms each, for
    # "broker"): the smaller count.
    count = sizes.celery_idle if system.memory in ("worker", "broker") else sizes.idle
    memory, rss = redis_memory(client), sum(rss_bytes(pid) for pid in system.memory_pids())
    system.hold_far_future(count)
    # Wait until the worker has pulled every message (its broker queue is empty).
    settle = time.monotonic() + 30
    while system.memory == "worker" and broker_backlog() and time.monotonic() < settle:
        time.sleep(0.2)
    time.sleep(min(1.0, sizes.idle_seconds))
    memory_after, rss_after = redis_memory(client), sum(rss_bytes(pid) for pid in system.memory_pids())
    with ClientCommands(client) as watched:
        # The monitor is open before the counters start, so its own setup is not counted.
        counters = Counters(client).start()
        time.sleep(sizes.idle_seconds)
        queries, commands = counters.stop()
    sent = max(0, watched.sent - 2)  # the two INFO calls of the counters
    return {
        "redis_round_trips_per_s": sent / sizes.idle_seconds,
        "redis_commands_run_per_s": (sent + watched.in_scripts) / sizes.idle_seconds,
        "pending": count if system.memory != "table" else 0,
        "redis_bytes_per_pending": (memory_after - memory) / count,
        "worker_bytes_per_pending": (rss_after - rss) / count,
        "db_queries_per_s": queries / sizes.idle_seconds,
        "redis_commands_per_s": commands / sizes.idle_seconds,
        "processes": system.processes,
    }


def timed(system: System, kind: str, offsets: list[float], sizes: Sizes) -> Phase:
    """Create orders due at start + offset, let the system close them, count what it cost."""
    start = timezone.now() + timedelta(
        seconds=sizes.lead_seconds + len(offsets) * system.enqueue_seconds * 1.5)
    if system.delivers_notices:
        system.sink.clear()
    began = time.monotonic()
    orders = make_orders([start + timedelta(seconds=offset) for offset in offsets], system.model)
    held = system.hold(orders) if kind == "burst" else set()
    system.enqueue(orders)
    phase = Phase(kind=kind, orders=len(orders) - len(held), start=start,
                  pk_range=(orders[0].pk, orders[-1].pk),
                  expires={o.pk: o.expires_at for o in orders if o.pk not in held}, held=held)
    phase.production_s = time.monotonic() - began
    keep_statistics(system.model)
    phase.production_overran_s = max(0.0, (timezone.now() - start).total_seconds())

    client = get_redis_connection("order_timeout")
    client.config_set("slowlog-log-slower-than", 1000)
    client.config_set("slowlog-max-len", 100_000)  # keep every slow call, not the last 128
    client.slowlog_reset()
    wait = (start - timezone.now()).total_seconds() - 0.2
    if wait > 0:
        time.sleep(wait)
    counters = Counters(client).start()
    window_opened = time.time()
    cpu_before = cpu_seconds(system.pids())
    polls = 0
    last = start + timedelta(seconds=max(offsets))
    deadline = time.monotonic() + max(0.0, (last - timezone.now()).total_seconds()) + sizes.cap_seconds
    unpaid = unpaid_left(system, phase)
    while time.monotonic() < deadline:
        time.sleep(0.25)
        if timezone.now() < last:
            continue
        polls += 1
        if not unpaid.exists():
            phase.finished = True
            break
    counters.own_queries += polls
    phase.cpu_s = cpu_seconds(system.pids()) - cpu_before
    phase.db_queries, phase.redis_commands = counters.stop()
    phase.window = (window_opened, time.time())
    if system.delivers_notices:
        _await_notices(system, phase, sizes, cpu_before)
    phase.waited_s = (timezone.now() - start).total_seconds()
    names = script_names()
    scripts = [(entry["start_time"], entry["duration"],
                names.get(entry["command"].split(b" ")[1].decode(), "eval"))
               for entry in client.slowlog_get(100_000)
               if entry["command"].split(b" ")[0].lower() in (b"evalsha", b"eval")]
    phase.slowest_script_us = max(duration for _, duration, _ in scripts) if scripts else None
    phase.slow_scripts = sorted(scripts, key=lambda entry: -entry[1])[:10]
    client.config_set("slowlog-max-len", 128)
    return phase


def unpaid_left(system: System, phase: Phase) -> Any:
    """What the harness polls for until it is gone: the workload's unpaid orders, less those the
    system holds. The same statement whatever the burst holds (``System.without_held``): it is
    asked every 0.25 s while the closers run, on the same machine."""
    low, high = phase.pk_range
    model = system.model
    return system.without_held(model.objects.filter(model.unpaid_q(), pk__gte=low, pk__lte=high))


def _await_notices(system: System, phase: Phase, sizes: Sizes, cpu_before: float) -> None:
    """After the closes (their counters stopped): wait for their notices, at most ``cap_seconds``
    more, and keep what reached the sink (bench/notices.py)."""
    from . import notices

    low, high = phase.pk_range
    model = system.model
    closed = system.without_held(model.objects.filter(pk__gte=low, pk__lte=high).exclude(model.unpaid_q()))
    phase.notices_waited_s = notices.await_deliveries(system.sink, set(closed.values_list("pk", flat=True)), low,
                                                      high, system.notices_pending,
                                                      notices.WAIT_CAPS * sizes.cap_seconds)
    phase.cpu_through_notices_s = cpu_seconds(system.pids()) - cpu_before
    phase.notices_pending = system.notices_pending()
    phase.received = system.sink.received()
    # Read again: a row whose closes outlasted their wait closed more orders during this one.
    phase.closed_pks = set(closed.values_list("pk", flat=True))


def script_names() -> dict[str, str]:
    """SHA1 -> name of this project's scripts, to name the slow ones."""
    import hashlib

    from order_timeout.queue import SCRIPT_NAMES, load_script_source

    return {hashlib.sha1(load_script_source(name).encode()).hexdigest(): name for name in SCRIPT_NAMES}


def steady_offsets(sizes: Sizes) -> list[float]:
    count = int(sizes.steady_rate * sizes.steady_seconds)
    return [i / sizes.steady_rate for i in range(count)]


def burst_offsets(sizes: Sizes) -> list[float]:
    return [0.0] * sizes.burst


def results(phase: Phase, system: System) -> dict[str, Any]:
    """Lateness and throughput from the commit records the closers wrote on exit."""
    commits: dict[int, list[float]] = {}
    held_closed = 0
    for pk, at in read_commits(system.record_dir):
        if pk in phase.held:
            held_closed += 1
        elif phase.pk_range[0] <= pk <= phase.pk_range[1]:
            commits.setdefault(pk, []).append(at)
    closed = len(commits)
    first_commits = [min(times) for times in commits.values()]
    notices = _notices(phase, commits, closed)
    lateness_ms = [(min(times) - phase.expires[pk].timestamp()) * 1000 for pk, times in commits.items()]
    # From the deadline, not the first commit, so the first batch counts too.
    span = (max(first_commits) - phase.start.timestamp()) if closed else 0.0
    drain = span if closed else None
    return {
        "orders": phase.orders,
        "closed": closed,
        "closed_twice": sum(1 for times in commits.values() if len(times) > 1),
        "held": len(phase.held),
        # Orders closed while their payment was in flight: must be none.
        "held_closed": held_closed,
        "drained": closed == phase.orders,
        "lateness_ms": summary(lateness_ms),
        "lateness_samples": sorted(lateness_ms)[:: max(1, len(lateness_ms) // 2000)],
        "closes_per_s": closed / span if span else None,
        "drain_s": drain if closed == phase.orders else None,
        "cpu_ms_per_close": 1000 * phase.cpu_s / closed if closed and phase.cpu_s is not None else None,
        "db_queries_per_close": phase.db_queries / closed if closed else None,
        "redis_commands_per_close": phase.redis_commands / closed if closed else None,
        "slowest_script_ms": phase.slowest_script_us / 1000 if phase.slowest_script_us else None,
        "slow_scripts": [{"at": at, "us": us, "script": name} for at, us, name in phase.slow_scripts],
        "late_outliers": _outliers(commits, phase),
        "db_queries": phase.db_queries,
        "redis_commands": phase.redis_commands,
        "production_s": phase.production_s,
        "production_overran_s": phase.production_overran_s,
        "watched_s": phase.waited_s,
        **({"notices": notices} if notices else {}),
        "gc": gc_pauses.tally(gc_pauses.read(system.record_dir), *phase.window),
    }


def _notices(phase: Phase, commits: dict[int, list[float]], closed: int) -> dict[str, Any] | None:
    """The notices of a notices row's workload (bench/notices.py), its wait and CPU included."""
    if phase.closed_pks is None:
        return None
    from . import notices

    counted = notices.tally(phase.closed_pks, {pk: min(times) for pk, times in commits.items()}, phase.received,
                            *phase.pk_range, pending=phase.notices_pending)
    cpu = phase.cpu_through_notices_s
    return {**counted, "waited_s": round(phase.notices_waited_s, 2),
            "cpu_ms_per_order": 1000 * cpu / closed if closed and cpu is not None else None}


def _outliers(commits: dict[int, list[float]], phase: Phase, count: int = 10) -> list[dict[str, Any]]:
    """The latest closes: deadline, commit time and lateness, to line up with slow scripts and logs."""
    late = sorted(((min(times) - phase.expires[pk].timestamp(), pk, min(times))
                   for pk, times in commits.items()), reverse=True)[:count]
    return [{"pk": pk, "deadline": phase.expires[pk].timestamp(), "committed": at,
             "late_ms": round(lateness * 1000, 1)} for lateness, pk, at in late]


def claim_latency(sizes: Sizes, batch: int = 200, rounds: int = 30) -> dict[str, Any]:
    """Round trip of one claim of ``batch`` due members as the pending set grows."""
    queue = TimeoutQueue.from_settings()
    client = queue.client
    far = now_score(timezone.now()) + 3_600_000
    out: dict[str, Any] = {}
    for size in sizes.claim_sizes:
        client.flushdb()
        keep_mark(client)
        for start in range(0, size, 10_000):
            queue.schedule({f"f{i}": far for i in range(start, min(size, start + 10_000))}, only_missing=True)
        client.config_resetstat()
        timings = []
        for round_ in range(rounds):
            now = now_score(timezone.now())
            queue.schedule({f"d{round_}-{i}": now - 1 for i in range(batch)})
            began = time.perf_counter()
            claim = queue.shards[0].claim(now, batch, now + 30_000, f"bench:{round_}")
            timings.append((time.perf_counter() - began) * 1000)
            queue.ack(claim.token, claim.members)
        stats = client.info("commandstats").get("cmdstat_evalsha", {})
        out[str(size)] = {"round_trip_ms": summary(timings), "server_us_per_call": stats.get("usec_per_call")}
    client.flushdb()
    keep_mark(client)
    return out


def create_overhead(systems: list[System], samples: int) -> dict[str, Any]:
    """Time a system adds to one order's create transaction (commit and on_commit work included).

    Each sample runs every variant once, in a shuffled order, and the added
    time is the difference from the bare create of the same sample: a noisy
    moment on the machine then lands on both sides of the subtraction.
    """

    def one(enqueue: Any) -> float:
        began = time.perf_counter()
        with transaction.atomic():
            order = Order.objects.create(expires_at=timezone.now() + timedelta(hours=1))
            enqueue(order)
        return (time.perf_counter() - began) * 1000

    def bare(order: Order) -> None:
        pass

    variants = {"bare": bare} | {s.name: s.enqueue_on_commit for s in systems}
    added: dict[str, list[float]] = {name: [] for name in variants if name != "bare"}
    bare_times: list[float] = []
    shuffle = random.Random(4).shuffle
    for _ in range(samples):
        names = list(variants)
        shuffle(names)
        times = {}
        for name in names:
            # Only "ours" keeps the app's post_save receiver, which schedules the order.
            if name != "ours":
                post_save.disconnect(order_saved, sender=Order, dispatch_uid="order_timeout.order_timeout.order.saved")
            try:
                times[name] = one(variants[name])
            finally:
                post_save.connect(order_saved, sender=Order, dispatch_uid="order_timeout.order_timeout.order.saved")
        bare_times.append(times["bare"])
        for name in added:
            added[name].append(times[name] - times["bare"])
    return {name: {"added_p50_ms": summary(diffs)["p50"], "added_p99_ms": summary(diffs)["p99"]}
            for name, diffs in added.items()} | {"bare_create_ms": summary(bare_times)}
