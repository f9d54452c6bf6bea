"""A shop's web process in the rolling-upgrade test, run by either release.

Orders come in at a steady rate through ``Order.objects.create()`` (the per-save path: each is
scheduled after its commit), each due a few seconds later by the database's clock. By turn, some
are paid well before their deadline, some as it passes (a payment racing the close), the rest
are left to close; the doomed ones (``rolling_receivers``) are never paid. Every order and every
payment's answer is a JSON line on stdout, each payment with the database's clock just before
and just after it, for the test to judge. SIGTERM stops it between two steps, as a web process
stops taking requests.
"""

from __future__ import annotations

import heapq
import json
import os
import random
import signal
import threading
import time
from datetime import UTC, datetime, timedelta
from types import FrameType
from typing import Any

import django

RATE = float(os.environ.get("ROLLING_ORDERS_PER_SECOND", "8"))
# Seconds from an order's creation to its deadline: LEAD, and up to half as much again.
LEAD = float(os.environ.get("ROLLING_LEAD_SECONDS", "2"))
# Seconds either side of its deadline a racing payment comes.
RACE = 0.05
PLANS = ["early", "race", "leave", "race", "leave", "early", "race", "leave", "leave", "race"]


def say(**fields: Any) -> None:
    print(json.dumps(fields, default=str), flush=True)


def database_now() -> datetime:
    """The database's clock: the one that judges an order due."""
    from django.db import connection

    sql = "SELECT clock_timestamp()" if connection.vendor == "postgresql" else "SELECT UTC_TIMESTAMP(6)"
    with connection.cursor() as cursor:
        cursor.execute(sql)
        moment: datetime = cursor.fetchone()[0]
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def pay(pk: int) -> None:
    """Pay as a payment callback does; say what ``mark_paid()`` answered, and when."""
    from order_timeout.exceptions import OrderClosed
    from order_timeout.models import Order

    order = Order.objects.get(pk=pk)
    began = database_now()
    try:
        answer = "paid" if order.mark_paid() else "settled"
    except OrderClosed:
        answer = "refused"
    say(event="payment", pk=pk, answer=answer, began=began, ended=database_now())


def place(turn: int, payments: list[tuple[float, int]]) -> None:
    """One order, due LEAD to 1.5 LEAD seconds from now; its payment planned by its turn."""
    from rolling_receivers import doomed

    from order_timeout.models import Order

    lead = LEAD * random.uniform(1, 1.5)
    deadline = database_now() + timedelta(seconds=lead)
    order = Order.objects.create(expires_at=deadline)
    plan = "doomed" if doomed(order.pk) else PLANS[turn % len(PLANS)]
    say(event="order", pk=order.pk, deadline=deadline, plan=plan)
    if plan == "early":
        heapq.heappush(payments, (time.monotonic() + lead / 2, order.pk))
    elif plan == "race":
        heapq.heappush(payments, (time.monotonic() + lead + random.uniform(-RACE, RACE), order.pk))


def main() -> None:
    django.setup()
    stop = threading.Event()

    def stop_soon(signum: int, frame: FrameType | None) -> None:
        # Not stop.set() here: the main thread may hold the Event's lock inside wait().
        threading.Thread(target=stop.set, daemon=True).start()

    signal.signal(signal.SIGTERM, stop_soon)
    payments: list[tuple[float, int]] = []
    turn, next_order = 0, time.monotonic()
    say(event="started", pid=os.getpid())
    while not stop.is_set():
        now = time.monotonic()
        if payments and payments[0][0] <= now:
            pay(heapq.heappop(payments)[1])
        elif now >= next_order:
            place(turn, payments)
            turn, next_order = turn + 1, next_order + 1 / RATE
        else:
            stop.wait(min(next_order, payments[0][0] if payments else next_order) - now)
    say(event="stopped")


if __name__ == "__main__":
    main()
