"""A consumer's share of the fleet's housekeeping: a thread that asks, every few seconds, whether
the compensation scan or the prune is due, and runs it when this consumer's turn comes first
(scans/turns.py), so that no promise needs one process (Celery beat) that nothing watches.

A thread, not chunks between batches: the scan's chunks are a database's work (keyset reads, row
locks), during which the GIL is free, so the claims and closes of the consumer's own loop go on
beside it; its database connections are its own (Django's are per thread), and its Redis round trips
share the queue's pool. The scan acts on the rows no consumer handles, through the same lifecycle, so
a close it makes is the one a consumer would have made.
"""

from __future__ import annotations

import logging
import random
import threading
import time

from django.db import close_old_connections

from ..conf import settings
from ..redaction import one_line
from .turns import run_prune, run_scan

logger = logging.getLogger("order_timeout")

# Seconds between two looks at whose turn it is: a tenth of the shortest interval, within these.
SHORTEST_LOOK, LONGEST_LOOK = 1.0, 30.0
# The share of the wall clock the scan's walk takes in a consumer: after each chunk it rests three
# times as long as the chunk took, so the closes beside it find the CPU, the database and the
# interpreter's lock free most of the time. Measured (docs/benchmarks.md, "Closes first"): unpaced,
# a scan over a million open rows doubled the steady closes' p99 on two cores; at 0.5, 0.25 and 0.1
# it cost them 1.2-1.3x, so a slower pace buys little and lengthens the scan (at 0.25, about a
# minute for a million rows; its interval is minutes).
PACE = 0.25


def look_every() -> float:
    intervals = [settings.COMPENSATION_INTERVAL] + ([settings.PRUNE_INTERVAL] if settings.PRUNE_INTERVAL else [])
    return min(max(min(intervals) / 10, SHORTEST_LOOK), LONGEST_LOOK)


class Housekeeper:
    """Started by a consumer (``run_timeout_consumer`` without ``--no-housekeeping``); stopped with it.

    ``exit_when_stuck``: a receiver stuck for good in the scan's thread ends the process, as one
    stuck in a batch does (its supervisor starts it again; the scan's lock lapses, and another
    consumer goes on with it).
    """

    def __init__(self, stop: threading.Event, *, exit_when_stuck: bool = False) -> None:
        self.stop = stop
        self.exit_when_stuck = exit_when_stuck
        self.thread = threading.Thread(target=self._loop, name="order-timeout-housekeeping", daemon=True)
        # When this process last ran the scan without its lock (Redis unreachable): once an interval.
        self._lockless_at: float | None = None

    def start(self) -> None:
        self.thread.start()

    def close(self, timeout: float = 5.0) -> None:
        """Wait a little for a run in hand to stop between two chunks (the stop is set already)."""
        if self.thread.is_alive():
            self.thread.join(timeout)

    def _loop(self) -> None:
        # Soon after the start (a fleet started with the job due runs it at once: one of them), spread
        # so that consumers started together do not all ask at the same instant.
        self.stop.wait(random.uniform(0, SHORTEST_LOOK))
        while not self.stop.is_set():
            self.look_once()
            self.stop.wait(look_every() * random.uniform(0.8, 1.2))

    def look_once(self) -> None:
        """Run what is due; a failure is logged, never raised: it must not stop the closes."""
        try:
            self.run_due()
        except Exception as exc:
            # One line; the traceback at DEBUG (docs/operations.md, "Log lines to alert on").
            logger.error("housekeeping failed (%s: %s); asking again in %.0fs",
                         type(exc).__name__, one_line(exc), look_every())
            logger.debug("housekeeping failed", exc_info=True)
        finally:
            close_old_connections()

    def run_due(self) -> None:
        """Run the scan, then the prune, each if it is this process's turn."""
        lockless = (self._lockless_at is None
                    or time.monotonic() - self._lockless_at >= settings.COMPENSATION_INTERVAL)
        scanned = run_scan("consumer", stop=self.stop, exit_when_stuck=self.exit_when_stuck, lockless=lockless,
                           pace=PACE)
        if scanned is not None and not scanned.locked:
            self._lockless_at = time.monotonic()
        if not self.stop.is_set():
            run_prune("consumer", budget=settings.COMPENSATION_INTERVAL / 2, stop=self.stop)
