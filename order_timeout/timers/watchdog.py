"""Leaving a process whose only thread is stuck in a receiver, for its supervisor to restart.

No thread can be stopped from outside. Once the database has ended the stuck
transaction (its row locks are gone) and the work is handed on, the process
is the only thing left holding the thread: it exits with ``EXIT_STUCK``
(``EX_TEMPFAIL``: "try again"), as gunicorn replaces a silent worker.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NoReturn

# The exit status of run_timeout_consumer and order_timeout_compensate when a
# receiver keeps their thread for good.
EXIT_STUCK = 75

# The least time between the end of a stuck transaction and the verdict that its
# receiver is stuck: work that merely overran comes back within milliseconds (its
# next statement fails on the ended session); the floor keeps a short lease on a
# busy machine from reading that as stuck.
MIN_STUCK_SECONDS = 1.0


def stuck_after(lease_seconds: float) -> float:
    """Seconds from the give-up to the verdict: a third of a lease, at least a second."""
    return max(lease_seconds / 3, MIN_STUCK_SECONDS)


def exit_stuck() -> NoReturn:
    logging.shutdown()  # flush the CRITICAL line that said why
    os._exit(EXIT_STUCK)


class Watchdog:
    """Calls ``on_overrun`` from a thread of its own once ``seconds`` pass without a ``pet()``.

    Work that makes progress pets it (a slow chunk of a thousand healthy
    orders never trips it); work stuck in one place does not.
    """

    def __init__(self, seconds: float, on_overrun: Callable[[], None]) -> None:
        self.seconds = seconds
        self.on_overrun = on_overrun
        self._petted_at = time.monotonic()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="order-timeout-watchdog", daemon=True)

    def pet(self) -> None:
        self._petted_at = time.monotonic()

    def _watch(self) -> None:
        while True:
            left = self._petted_at + self.seconds - time.monotonic()
            if left <= 0:
                self.on_overrun()
                return
            if self._done.wait(left):
                return


@contextmanager
def watchdog(seconds: float, on_overrun: Callable[[], None]) -> Iterator[Watchdog]:
    """A ``Watchdog`` over the block: ``on_overrun`` runs if it goes ``seconds`` without a pet."""
    dog = Watchdog(seconds, on_overrun)
    dog._thread.start()
    try:
        yield dog
    finally:
        dog._done.set()
