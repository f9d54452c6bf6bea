"""The benchmark's own closers stop on SIGTERM even when it comes while their loop waits.

Seen once in a benchmark run and once in CI: a floor closer "exited badly" with nothing on
its stderr. Its SIGTERM handler set the loop's Event while the main thread, interrupted inside
``stopping.wait()``, held the Event's lock (not reentrant): it hung until the harness
SIGKILLed it 60 s later.
"""

from __future__ import annotations

import signal
import threading

from bench.stopping import sigterm_handler


def test_a_sigterm_that_comes_while_the_loop_holds_the_events_lock_still_stops_it():
    stopping = threading.Event()
    handle = sigterm_handler(stopping)

    def signal_arrives_inside_wait() -> None:
        with stopping._cond:  # what wait() holds at the moment the signal is handled
            handle(signal.SIGTERM, None)

    handled = threading.Thread(target=signal_arrives_inside_wait, daemon=True)
    handled.start()
    handled.join(timeout=5)

    assert not handled.is_alive() and stopping.wait(timeout=5)
