"""The seeds' "traditional approach" at the cadence shops run it: a sweep of the table every minute.

pretix runs its ``expire_orders`` from its periodic tasks, Saleor its ``expire_orders_task``
from Celery beat every few minutes, a batch per run. A row at Saleor's batch of 100 and one at
500: the limit, not the close, decides how fast a backlog drains (500 closes take about a
second of the minute), and the period decides how late an order is (up to a period). The
closer is ``bench/peers/sweeper.py``.
"""

from __future__ import annotations

import sys

from ..systems import System
from . import PEER_LIMITS


class Sweep(System):
    """Every 60 s on the clock, up to 100 overdue unpaid orders, oldest deadline first, each
    closed in a transaction of its own (``close_one``: the close every baseline shares, so the
    rows differ in scheduling only; Saleor writes one UPDATE per batch, pretix a transaction
    per order, and at 100 or 500 a minute the transaction is not what limits either).

    Documented settings: the period (a minute) and the batch (100). Nothing is kept outside the
    orders table, so a crash of the sweeper loses nothing: an order it was closing rolls back
    and is found again by the next run after a restart, late by up to a period plus the
    backlog ahead of it; there is no broker to lose. A 100,000-order burst drains at 100 a
    minute in about 1,000 minutes: the harness stops watching at its cap and reports what was
    closed by then.
    """

    name, label = "sweep_60s", "seeds' traditional approach: sweep the table every 60 s, 100 per run"
    closers = "1 process (cron-style, each minute on the clock), 100 per run, 1 tx per order"
    crash_note = ("A crash loses nothing: the table is the only store (no broker to lose). An order being "
                  "closed when the sweeper dies rolls back and is closed by the first run after a restart, "
                  "late by up to a period (60 s) plus the backlog ahead of it at 100 a run.")
    processes = 1
    memory = "table"
    full_only = True
    limits = PEER_LIMITS
    # Idle, it runs one query a minute (0.017/s): a 10 s idle window would show 0 or 0.1, by luck.
    workloads = ("steady", "burst")
    measures_create = False  # it adds nothing to the create transaction, as polling adds nothing
    # Seconds between runs, and orders closed per run at most.
    period = 60.0
    limit = 100

    def commands(self) -> list[list[str]]:
        return [[sys.executable, "-m", "bench.peers.sweeper", str(self.limit), str(self.period)]]


class Sweep500(Sweep):
    """The same sweep with 500 orders per run: five times the drain rate, the same lateness floor."""

    name, label = "sweep_60s_500", "seeds' traditional approach: sweep the table every 60 s, 500 per run"
    closers = "1 process (cron-style, each minute on the clock), 500 per run, 1 tx per order"
    crash_note = Sweep.crash_note.replace("at 100 a run", "at 500 a run")
    limit = 500


SYSTEMS = (Sweep, Sweep500)
