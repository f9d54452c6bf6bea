"""The slow receivers workload: healthy receivers too slow for a whole batch within BATCH_TIME_LIMIT.

``ORDERS`` orders fall due at one instant on two consumers started for this
workload alone (``--batch-size`` ``BATCH``, BATCH_TIME_LIMIT ``TIME_LIMIT``),
whose shop receiver of ``order_expired`` takes ``DELAY`` an order
(testproject/shop/receivers.py, SHOP_DELAY_SECONDS: an ERP that answers slowly,
but answers). A batch of 200 then needs 4 s of receivers, twice the limit: the
lease guard gives it up (its session ended, its work rolled back, its members
handed to the next claim). A consumer that claimed as much again would give
every batch up; one that claims what fits gives up one. The closers write each
commit record as it commits (BENCH_RECORD_EAGER=1, ``recorder``). The wait
lasts until no order is unpaid and no member is leased, or ``CAP_SECONDS``
after the deadline at most.

What is counted:

- drain: the last close's commit - the deadline; the receivers' own time:
  ``ORDERS`` x ``DELAY`` / the consumers (what they need if nothing else took
  time), and the ratio of the two (the target: at most 2);
- given up: each consumer's WARNING lines of the lease guard's "giving it up"
  (order_timeout/timers/leases.py) in its stderr file, where its console
  handler writes WARNINGs at any verbosity (``-v 0`` included); and the least
  it then claimed, from the batch sizes' "claiming at most N" lines
  (order_timeout/timers/sizing.py: none before it);
- twice: orders whose close was recorded committed twice; never: still unpaid
  when the wait ended.
"""

from __future__ import annotations

import re
import time
from datetime import timedelta
from typing import Any

from django.utils import timezone

from .recorder import first_commits, read_commits
from .systems import Ours
from .workloads import make_orders

ORDERS = 600
BATCH = 200
# Seconds: each order's receiver, and BATCH_TIME_LIMIT.
DELAY = 0.02
TIME_LIMIT = 2.0
# Seconds after the deadline at which the wait ends, drained or not.
CAP_SECONDS = 60.0
# Seconds from both consumers beating to the deadline (the orders are made and scheduled meanwhile).
LEAD_SECONDS = 1.0
# Seconds to wait for both consumers to beat before the orders are made.
STARTUP_CAP_SECONDS = 30.0
# Seconds between two looks at the database while waiting.
POLL = 0.1

# The lease guard's line for a batch given up for time, and the batch sizes' line for a smaller claim.
GIVEN_UP = "giving it up"
CLAIMING = re.compile(r"claiming at most (\d+) from now on")


def slow_receivers(system: Ours) -> dict[str, Any]:
    """Start ``system``'s consumers (a fresh instance, not started) with the slow receivers, make
    the orders due at one instant, wait, stop them and count (module docstring)."""
    began = time.monotonic()
    system.record_dir.mkdir(parents=True, exist_ok=True)
    system.batch = str(BATCH)
    system.phase_env = {"BENCH_RECORD_EAGER": "1", "SHOP_RECORD_EXPIRIES": "1", "SHOP_DELAY_SECONDS": str(DELAY),
                        "ORDER_TIMEOUT_BATCH_TIME_LIMIT": str(TIME_LIMIT)}
    startup, system.startup_seconds = system.startup_seconds, 0.0
    system.start()
    system.startup_seconds = startup
    consumers = len(system.procs)
    try:
        ready_s = _await_beats(consumers)
        deadline = timezone.now() + timedelta(seconds=LEAD_SECONDS + ORDERS * system.enqueue_seconds * 1.5)
        orders = make_orders([deadline] * ORDERS, system.model)
        system.enqueue(orders)
        low, high = orders[0].pk, orders[-1].pk
        unpaid = system.model.objects.filter(system.model.unpaid_q(), pk__gte=low, pk__lte=high)
        time.sleep(max(0.0, (deadline - timezone.now()).total_seconds()))
        give_up = time.monotonic() + CAP_SECONDS
        never = unpaid.count()
        while (never or system.in_flight()) and time.monotonic() < give_up:
            time.sleep(POLL)
            never = unpaid.count()
        waited = (timezone.now() - deadline).total_seconds()
    finally:
        system.stop()
    commits = [(pk, at) for pk, at in read_commits(system.record_dir) if low <= pk <= high]
    logs = [log.read_text(errors="replace") for log in system.logs]
    return {**tally(ORDERS, deadline.timestamp(), commits, never, logs, DELAY),
            "batch": BATCH, "delay_s": DELAY, "time_limit_s": TIME_LIMIT, "cap_s": CAP_SECONDS,
            "consumers_ready_s": round(ready_s, 2), "waited_s": round(waited, 2),
            "took_s": round(time.monotonic() - began, 1), "errors": system.errors}


def _await_beats(consumers: int) -> float:
    """Seconds until ``consumers`` consumers beat on the close's queue (each names itself in its
    consumers set on its first beat), at most ``STARTUP_CAP_SECONDS``: a consumer still starting
    when the orders fall due would leave them all to the other, and the drain would measure that."""
    from order_timeout.queue import TimeoutQueue

    queue = TimeoutQueue.from_settings()
    began = time.monotonic()
    while time.monotonic() - began < STARTUP_CAP_SECONDS:
        if queue.client.zcard(queue.shards[0].keys.consumers) >= consumers:
            break
        time.sleep(POLL)
    return time.monotonic() - began


def tally(orders: int, deadline: float, commits: list[tuple[int, float]], never: int, logs: list[str],
          delay: float) -> dict[str, Any]:
    """The counts of one run, all due at ``deadline``, from its commit records, the rows still
    unpaid (``never``) and each consumer's stderr (``logs``, one per consumer)."""
    first, twice = first_commits(commits)
    latest = max(first.values()) - deadline if first else None
    drain = latest if not never and latest is not None else None
    receivers = orders * delay / len(logs)
    return {
        "orders": orders, "closed": orders - never, "never": never, "twice": len(twice),
        "unrecorded": max(0, orders - never - len(first)),
        "drain_s": round(drain, 2) if drain is not None else None,
        "latest_s": round(latest, 2) if latest is not None else None,
        "receivers_s": round(receivers, 2),
        "ratio": round(drain / receivers, 2) if drain is not None else None,
        "given_up": [given_up(log) for log in logs],
        "least_claim": [least_claim(log) for log in logs],
    }


def given_up(log: str) -> int:
    """The batches a consumer gave up for time: the lease guard's WARNING lines in its stderr."""
    return sum(1 for line in log.splitlines() if "WARNING" in line and GIVEN_UP in line)


def least_claim(log: str) -> int | None:
    """The fewest members a consumer went on to claim after a batch given up (None: never fewer)."""
    sizes = [int(size) for size in CLAIMING.findall(log)]
    return min(sizes) if sizes else None
