"""The traditional closer as a process: ``python -m bench.peers.sweeper LIMIT [PERIOD]``.

At every multiple of PERIOD seconds on the wall clock (a cron job each minute, or a shop's
Celery beat entry), one run: select up to LIMIT unpaid orders past their deadline, oldest
deadline first, and close each in a transaction of its own (``bench.closers.close_one``: the
row lock, the status re-check, ``order_expired``). One batch per run: what is left waits for
the next run, as Saleor's ``expire_orders_task`` and pretix's ``expire_orders`` leave it.
Stops on SIGTERM after the order in hand.
"""

from __future__ import annotations

import os
import sys
import threading
import time

from bench.stopping import stop_on_sigterm

stopping = threading.Event()


def sweep(limit: int) -> int:
    """One run: close up to ``limit`` overdue orders; how many it selected."""
    from django.db import close_old_connections
    from django.utils import timezone

    from bench.closers import close_one
    from order_timeout.models import Order, Status

    close_old_connections()  # as a Celery task or a cron command starts: no dead connection reused
    pks = list(Order.objects.filter(status=Status.UNPAID, expires_at__lte=timezone.now())
               .order_by("expires_at").values_list("pk", flat=True)[:limit])
    for pk in pks:
        if stopping.is_set():
            break
        close_one(pk)
    return len(pks)


def main(limit: int, period: float) -> None:
    import django
    from django.db import DatabaseError

    django.setup()
    stop_on_sigterm(stopping)
    print("ready", flush=True)
    while not stopping.wait(period - time.time() % period):
        try:
            sweep(limit)
        except DatabaseError as exc:  # a cron job that fails runs again next time
            print(f"sweep failed: {exc!r}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    main(int(sys.argv[1]), float(sys.argv[2]) if len(sys.argv) > 2 else 60.0)
