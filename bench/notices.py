"""The notices rows: one webhook per closed order, to the harness's sink (bench/sink.py).

A row that sends a notice per close says so with ``System.notice_key`` (the
``Idempotency-Key`` its order's webhook carries). After the closes have
drained, the harness waits for the deliveries (``await_deliveries``), then
counts them against what the database shows closed (``tally``):

- expected: the orders closed, one notice each;
- delivered: those whose key reached the sink at least once;
- duplicates: deliveries past the first of a key (at least once allows them; each carries the
  key its first did, or it would not be counted as one);
- pending: notices the row still holds when the wait ends (a notice row not yet delivered, a
  task still in the broker): late, not lost;
- lost: expected, never delivered, and not pending: nothing will ever send them;
- lateness: the first arrival at the sink - the close's COMMIT (the commit records,
  BENCH_RECORD_AT_COMMIT), p50 / p99 / max.
"""

from __future__ import annotations

import time
from typing import Any

from .measure import summary
from .sink import Sink

# Seconds with nothing reaching the sink, and the row holding nothing, that end the wait.
QUIET = 1.0
# The wait for the notices after the closes lasts at most this many times the workload's cap
# (``Sizes.cap_seconds``: 90 s in the full run): a burst's notices drain after its closes, at
# their own pace, and the figure is how late they come, not whether they beat the closes' cap.
WAIT_CAPS = 3
# The handler of the shop's webhook notice (testproject/shop/notices.py), and its order model's
# label: the shop's notify_expired keys each notice "{handler}:{label}:{pk}".
HANDLER = "order-expired-webhook"
LABEL = "order_timeout.order"


def key_of(pk: int) -> str:
    return f"{HANDLER}:{LABEL}:{pk}"


def pk_of(key: str) -> int | None:
    head, _, tail = key.rpartition(":")
    return int(tail) if head == f"{HANDLER}:{LABEL}" and tail.isdigit() else None


def arrivals(received: list[tuple[str, float]], low: int, high: int) -> tuple[dict[int, list[float]], int]:
    """Each order's arrival times (within ``low``..``high``), and the requests of no such order."""
    found: dict[int, list[float]] = {}
    strays = 0
    for key, at in received:
        pk = pk_of(key)
        if pk is None or not low <= pk <= high:
            strays += 1
            continue
        found.setdefault(pk, []).append(at)
    return found, strays


def tally(closed: set[int], committed: dict[int, float], received: list[tuple[str, float]], low: int, high: int,
          pending: int = 0) -> dict[str, Any]:
    """The counts of one workload's notices (module docstring): ``closed`` the orders the database
    shows closed, ``committed`` each one's commit time (those with a record), ``received`` what the
    sink recorded, ``pending`` what the row still held when the wait ended."""
    found, strays = arrivals(received, low, high)
    delivered = closed & found.keys()
    missing = len(closed) - len(delivered)
    lateness = [(min(found[pk]) - committed[pk]) * 1000 for pk in delivered if pk in committed]
    return {
        "expected": len(closed),
        "delivered": len(delivered),
        "duplicates": sum(len(times) - 1 for times in found.values()),
        "duplicated_orders": sum(1 for times in found.values() if len(times) > 1),
        "pending": min(pending, missing),
        "lost": max(0, missing - pending),
        # Notices of orders the database does not show closed (a rolled-back close's): must be none.
        "unasked": len(found.keys() - closed),
        "strays": strays,
        "lateness_ms": summary(lateness),
        "lateness_samples": sorted(lateness)[:: max(1, len(lateness) // 2000)],
    }


def await_deliveries(sink: Sink, closed: set[int], low: int, high: int, pending: Any, cap_seconds: float) -> float:
    """Wait until every order of ``closed`` has its notice at the sink; or until the row holds
    nothing (``pending()`` is 0) and the sink has been quiet for ``QUIET``; or ``cap_seconds``. The
    seconds waited."""
    began, looked_at = time.monotonic(), -1
    while time.monotonic() - began < cap_seconds:
        # The cheap count first: the keys are read only once enough requests came, and again
        # only when more came (duplicates make the count run ahead of the keys).
        count = sink.count()
        if count >= len(closed) and count != looked_at:
            looked_at = count
            if closed <= arrivals(sink.received(), low, high)[0].keys():
                break
        last = sink.last_arrival()
        if (last is None or time.time() - last > QUIET) and time.monotonic() - began > QUIET and not pending():
            break
        time.sleep(0.1)
    return time.monotonic() - began
