"""The soak's shop: orders at a steady rate, and the payments some of them get.

Orders are created as the fault runs create them (``chaos.orders.create_orders``: the rows,
their ``Role`` and ``schedule()`` in one transaction), a fifth of a second's worth at a time,
each due ``Plan.lead`` seconds on. The rate holds over the run whatever a slow moment costs: each
tick creates what the run owes by then. A few orders are paid before their deadline (some
before their reminder, some after), a few at it (racing the close: paid, or refused and
refunded), through ``mark_paid()``, each answer recorded (``chaos.models.Payment``).
"""

from __future__ import annotations

import heapq
import random
import threading
import time
from collections import Counter
from datetime import datetime, timedelta

from django.db import connection
from django.utils import timezone

from order_timeout import get_order_model

from .. import orders
from ..models import Payment, Role
from .plan import FAILING, NEVER_PAID, PAID_AT_DEADLINE, PAID_EARLY, Plan

TICK = 0.2
# Errors of the harness's own threads kept for the report (the first few say enough).
KEPT_ERRORS = 5


class Errors:
    """What went wrong in the harness's threads: counted, the first few kept."""

    def __init__(self) -> None:
        self.count = 0
        self.first: list[str] = []
        self._lock = threading.Lock()

    def add(self, where: str, exc: BaseException) -> None:
        with self._lock:
            self.count += 1
            if len(self.first) < KEPT_ERRORS:
                self.first.append(f"{where}: {type(exc).__name__}: {exc}")


class PaymentDesk:
    """Pays each order at its planned moment, from a thread of its own."""

    def __init__(self, errors: Errors) -> None:
        self.errors = errors
        self.outcomes: Counter[str] = Counter()
        self._plan: list[tuple[datetime, int]] = []
        self._wake = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="soak-payments", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def plan(self, moment: datetime, pk: int) -> None:
        with self._wake:
            heapq.heappush(self._plan, (moment, pk))
            self._wake.notify()

    def planned(self) -> int:
        with self._wake:
            return len(self._plan)

    def stop(self) -> None:
        """Pay what is planned (the latest within a lead of the stream's end), then stop."""
        with self._wake:
            self._stopping = True
            self._wake.notify()
        self._thread.join()

    def _next(self) -> int | None:
        """The next order whose moment has come; None once stopping with nothing left."""
        with self._wake:
            while True:
                if self._plan:
                    wait = (self._plan[0][0] - timezone.now()).total_seconds()
                    if wait <= 0:
                        return heapq.heappop(self._plan)[1]
                elif self._stopping:
                    return None
                else:
                    wait = 1.0
                self._wake.wait(wait)

    def _run(self) -> None:
        model = get_order_model()
        try:
            while (pk := self._next()) is not None:
                try:
                    outcome = orders.pay(model._base_manager.get(pk=pk))
                    Payment.objects.create(order_id=pk, outcome=outcome, answered_at=timezone.now())
                    self.outcomes[outcome] += 1
                except Exception as exc:  # the harness's failure: counted, reported, and it goes on
                    self.errors.add(f"paying order {pk}", exc)
        finally:
            connection.close()


class OrderStream:
    """``plan.rate`` orders a second, in cohorts, from a thread of its own, until ``stop()``."""

    def __init__(self, plan: Plan, payments: PaymentDesk, errors: Errors) -> None:
        self.plan = plan
        self.payments = payments
        self.errors = errors
        self.created = 0
        self.by_cohort: Counter[str] = Counter()
        self.last_deadline: datetime | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-stream", daemon=True)
        self.began = 0.0

    def start(self) -> None:
        self.began = time.monotonic()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _cohort(self) -> str:
        draw, plan = random.random(), self.plan
        for share, cohort in ((plan.failing, FAILING), (plan.paid_early, PAID_EARLY),
                              (plan.paid_at_deadline, PAID_AT_DEADLINE)):
            if draw < share:
                return cohort
            draw -= share
        return NEVER_PAID

    def _run(self) -> None:
        try:
            while not self._stop.wait(TICK):
                owed = int(self.plan.rate * (time.monotonic() - self.began)) - self.created
                if owed > 0:
                    try:
                        self._create(owed)
                    except Exception as exc:
                        self.errors.add("creating orders", exc)
                        time.sleep(1)
        finally:
            connection.close()

    def _create(self, count: int) -> None:
        now = timezone.now()
        due: dict[str, list[datetime]] = {}
        for _ in range(count):
            deadline = now + timedelta(seconds=random.uniform(*self.plan.lead))
            due.setdefault(self._cohort(), []).append(deadline)
        for cohort, deadlines in due.items():
            behaviours: dict[int, str] | None = (dict.fromkeys(range(len(deadlines)), str(Role.Behaviour.RAISE))
                                                 if cohort == FAILING else None)
            created = orders.create_orders(deadlines, NEVER_PAID if cohort == FAILING else cohort, behaviours)
            self.created += len(created.ids)
            self.by_cohort[cohort] += len(created.ids)
            self.last_deadline = max(filter(None, [self.last_deadline, created.last_deadline]))
            for pk, deadline in zip(created.ids, deadlines, strict=True):
                if cohort == PAID_EARLY:
                    self.payments.plan(now + (deadline - now) * random.uniform(0.05, 0.95), pk)
                elif cohort == PAID_AT_DEADLINE:
                    self.payments.plan(deadline + timedelta(seconds=random.uniform(-0.2, 0.2)), pk)
