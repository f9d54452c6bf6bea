"""The crash workload: kill a closer mid-burst, start it again at once, count what it cost.

``sizes.crash`` orders fall due at one instant, on closers started for this
workload alone, which write each commit record the moment it commits
(BENCH_RECORD_EAGER=1, see ``recorder``): the records of a process killed with
SIGKILL survive it. Once a third of the orders is closed (and ``System.busy``:
ours, once each consumer holds leased members), closer 0 and every process below it
(a Celery worker's pool) get SIGKILL, and its command runs
again at once, as a supervisor (systemd ``Restart=always``) would. The wait
then lasts until no order is unpaid and the system holds nothing in flight
(``System.in_flight``; ours: no member still leased, so the takeover that could
close one twice has run); or until nothing is in flight and nothing has closed
for the closer's start-up time plus ``STALL`` (the restarted closer has had
time to start and look: what is left is not coming back); or
``sizes.crash_cap_seconds`` after the kill at most. Our consumers run with
``sizes.crash_lease_seconds`` as LEASE_SECONDS (the quick run's short one keeps
CI fast; the full run keeps the default, 30 s).

What is counted:

- closed: the orders the database shows closed at the end;
- never: the orders still unpaid when the wait ends (a system that would get
  them back later than the cap, Celery an hour later, counts them here);
- twice: the orders whose ``order_expired`` receivers committed twice (recorded twice);
- late: the closes committed more than the late bound after the deadline. The bound
  is when the burst would have drained at the pace it closed before the kill, plus
  ``LATE_MARGIN``: what the crash cost beyond what the burst itself needs (a killed
  batch waiting out its lease, a restart while no one else closes);
- unrecorded: closed in the database with no record (killed between the commit and
  the record's write): counted closed, left out of the lateness;
- for a notices row (``System.delivers_notices``, bench/notices.py), its notices: one
  expected per order closed, delivered, duplicated, still pending and lost, and their
  lateness after the commit. Such a row may name more than one closer to kill
  (``System.crash_victims``: the Celery peer's worker as well as a closer), each in a
  crash burst of its own.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

from django.utils import timezone

from .measure import summary
from .recorder import first_commits, read_commits
from .systems import System
from .workloads import Sizes, make_orders

# The share of the burst closed when the closer is killed.
SHARE = 1 / 3
# Seconds past the pace before the kill after which a close counts as late.
LATE_MARGIN = 1.0
# Seconds between two looks at the database before the kill: a batch of ours takes tens of ms.
POLL = 0.005
# Seconds with no close and nothing in flight, past a closer's start-up, that end the wait.
STALL = 1.0


def crash(system: System, sizes: Sizes, victim: int = 0, freeze: bool = False,
          lose_redis: bool = False) -> dict[str, Any]:
    """Burst, kill closer ``victim`` once a third is closed, restart it, wait, count (module docstring);
    ``freeze``: SIGSTOP it instead, never restarted, thawed once the wait ends; ``lose_redis``:
    empty the system's Redis instead (``System.lose_redis``), no closer touched.

    ``system`` is a fresh instance, not started: its closers are started here with the eager
    records, and stopped at the end."""
    began = time.monotonic()
    system.record_dir.mkdir(exist_ok=True)
    system.phase_env = {"BENCH_RECORD_EAGER": "1"}
    if sizes.crash_lease_seconds:
        system.phase_env["ORDER_TIMEOUT_LEASE_SECONDS"] = str(sizes.crash_lease_seconds)
    # The orders are made while the closers start (start() returns at once), due once both are done.
    startup, system.startup_seconds = system.startup_seconds, 0.0
    deadline = timezone.now() + timedelta(seconds=max(
        startup, sizes.lead_seconds + sizes.crash * system.enqueue_seconds * 1.5))
    if system.delivers_notices:
        system.sink.clear()
    system.start()
    system.startup_seconds = startup
    closed_pks: set[int] = set()
    pending = 0
    try:
        orders = make_orders([deadline] * sizes.crash, system.model)
        system.enqueue(orders)
        low, high = orders[0].pk, orders[-1].pk
        unpaid = system.model.objects.filter(system.model.unpaid_q(), pk__gte=low, pk__lte=high)
        wait = (deadline - timezone.now()).total_seconds()
        give_up = time.monotonic() + max(wait, 0.0) + sizes.crash_cap_seconds
        time.sleep(max(wait, 0.0))
        left = len(orders)
        while time.monotonic() < give_up:
            left = unpaid.count()
            if not left or (left <= len(orders) * (1 - SHARE) and system.busy(victim)):
                break
            time.sleep(POLL)
        closed_at_kill = len(orders) - left
        killed_at = time.time()
        if lose_redis:
            system.lose_redis()
        elif freeze:
            system.freeze_one(victim)
        else:
            system.restart_one(victim)
        never = _wait(system, unpaid, sizes.crash_cap_seconds)
        waited = time.time() - killed_at
        if system.delivers_notices:
            closed_pks = set(system.model.objects.filter(pk__gte=low, pk__lte=high)
                             .exclude(system.model.unpaid_q()).values_list("pk", flat=True))
            pending = system.notices_pending()
    finally:
        system.stop()
    commits = [(pk, at) for pk, at in read_commits(system.record_dir) if low <= pk <= high]
    counted = tally(len(orders), deadline.timestamp(), commits, never, killed_at, closed_at_kill)
    if system.delivers_notices:
        from .notices import tally as notices_tally

        first, _twice = first_commits(commits)
        counted["notices"] = notices_tally(closed_pks, first, system.sink.received(), low, high, pending=pending)
    return {**counted, "victim": victim,
            "waited_after_kill_s": round(waited, 2), "cap_s": sizes.crash_cap_seconds,
            "lease_s": sizes.crash_lease_seconds, "took_s": round(time.monotonic() - began, 1)}


def _wait(system: System, unpaid: Any, cap: float) -> int:
    """Wait after the kill (module docstring); the orders still unpaid at its end."""
    began = time.monotonic()
    left, progressed = unpaid.count(), began
    while left or system.in_flight():
        if time.monotonic() - began >= cap:
            break
        time.sleep(0.1)
        now, before, left = time.monotonic(), left, unpaid.count()
        if left < before:
            progressed = now
        elif now - progressed > system.startup_seconds + STALL and not system.in_flight():
            break
    return left


def tally(orders: int, deadline: float, commits: list[tuple[int, float]], never: int, killed_at: float,
          closed_at_kill: int) -> dict[str, Any]:
    """The counts of one crash burst, all due at ``deadline``, from its commit records and the rows."""
    first, twice = first_commits(commits)
    closed = orders - never
    killed_after = killed_at - deadline
    pace = closed_at_kill / killed_after if closed_at_kill and killed_after > 0 else None
    bound = orders / pace + LATE_MARGIN if pace else None
    lateness = [at - deadline for at in first.values()]
    return {
        "orders": orders, "closed": closed, "never": never, "twice": len(twice),
        "late": sum(1 for late in lateness if late > bound) if bound is not None else None,
        "late_bound_s": round(bound, 2) if bound is not None else None,
        "latest_s": round(max(lateness), 2) if lateness else None,
        "lateness_ms": summary([late * 1000 for late in lateness]),
        "unrecorded": max(0, closed - len(first)),
        "killed_after_s": round(killed_after, 3), "closed_at_kill": closed_at_kill,
    }
