"""How the benchmark's own closers (the floor, the seeds' designs, the sweeper) stop on SIGTERM.

The harness stops every closer with SIGTERM and waits for its commit records.
A handler that called ``stopping.set()`` itself could hang the closer for good:
it runs in the main thread, which may be inside ``stopping.wait()`` holding the
Event's lock, and that lock is not reentrant. The harness then SIGKILLed it
after 60 s and counted "a closer exited badly" with nothing on its stderr (a
floor closer, once in a benchmark run and once in CI). The consumer's command
does the same (``run_timeout_consumer``: a thread sets its stop).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType


def sigterm_handler(stopping: threading.Event) -> Callable[[int, FrameType | None], None]:
    """A handler that sets ``stopping`` from a thread of its own, once the handler has returned."""

    def handle(signum: int, frame: FrameType | None) -> None:
        threading.Thread(target=stopping.set, daemon=True).start()

    return handle


def stop_on_sigterm(stopping: threading.Event) -> None:
    """From now on, SIGTERM sets ``stopping`` (the closer's loop ends at its next turn)."""
    signal.signal(signal.SIGTERM, sigterm_handler(stopping))
