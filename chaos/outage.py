"""A payment provider's outage as staff meet it: the close paused, then resumed giving the time back.

Staff run ``order_timeout_pause`` and ``order_timeout_resume --give-back`` in the harness's own
process (``call_command``), as the harness runs its other staff actions (the soak's requeue and
close-now through the admin's service functions): each does exactly what the command does for a
shop. What the database then says is judged here: nothing closed while the close was paused
(save a batch claimed before the pause), and each deadline inside the pause moved later by
exactly the pause's length, its order closed once and not before its new deadline.
"""

from __future__ import annotations

import io
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from django.core.management import call_command
from django.db import connection
from django.db.models import Count
from django.utils import timezone

from order_timeout import get_order_model
from order_timeout.conf import settings
from order_timeout.models import Pause
from order_timeout.timers.pausing import open_pauses, resume
from order_timeout.timers.registry import ORDER_TIMEOUT

from . import bounds, orders
from .consumers import ConsumerPool
from .models import Delivery, Payment
from .story import Check
from .tuning import Tuning

# The order close, by the name staff pause it under.
CLOSE_TIMER = ORDER_TIMEOUT.label
# What the log of a consumer that learned of the close's pause says (consumer._pauses_changed).
PAUSED_HERE = f"Paused here: {CLOSE_TIMER}"
# What every consumer logs once started, before its first claim (and its first look at the pauses).
STARTED = "Timeout consumer running"


def reach(t: Tuning) -> bounds.Bound:
    """How long after its commit a pause may take to stop every close: the pause's flags are set
    once it commits, and the next claim of any consumer claims nothing; a batch claimed before
    finishes (within the slack). A close judged (``closed_at``) after that, while still paused, is
    a pause that did not hold."""
    return bounds.Bound("a pause stopping every claim, the batches in hand finished", bounds.SLACK,
                        f"the batches in hand: slack {bounds.SLACK:g}")


def resumed(t: Tuning) -> bounds.Bound:
    """From the resume's commit (or a given-back order's new deadline, if later): the resume
    reaches every consumer as the pause did, then the normal path closes what is due."""
    told = t.heartbeat_seconds * 4 / 3
    return bounds.Bound("resumed: every consumer told, then the normal path", told + bounds.NORMAL + bounds.SLACK,
                        f"HEARTBEAT + HEARTBEAT/3 {told:.1f} + normal {bounds.NORMAL:g} + slack {bounds.SLACK:g}",
                        from_heal=True)


def database_now() -> datetime:
    """The database server's clock: the one ``closed_at`` is written by (the lock that judged it)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT UTC_TIMESTAMP(6)")
        value = cursor.fetchone()[0]
    return value.replace(tzinfo=UTC)


@dataclass
class Staff:
    """The close's pause and resume, as staff type them; what each printed, and when it committed
    by the database's clock (read right after the pause returned, right before the resume ran)."""

    reason: str
    pause: Pause | None = None
    # The database's clock just after the pause committed, and just before the resume began.
    paused_by_db: datetime | None = None
    resuming_by_db: datetime | None = None
    # The harness's clock once the resume returned: the heal the resumed cohorts are measured from.
    resumed_at: datetime | None = None
    said: list[str] = field(default_factory=list)

    def pause_close(self) -> Pause:
        self.said.append(_command("order_timeout_pause", "--timer", CLOSE_TIMER, "--reason", self.reason))
        self.paused_by_db = database_now()
        self.pause = Pause.objects.get(open_for=CLOSE_TIMER)
        return self.pause

    def resume_close(self, *, give_back: bool) -> Pause:
        assert self.pause is not None
        self.resuming_by_db = database_now()
        self.said.append(_command("order_timeout_resume", *(["--give-back"] if give_back else [])))
        self.resumed_at = timezone.now()
        self.pause.refresh_from_db()
        return self.pause


@contextmanager
def staff(reason: str) -> Iterator[Staff]:
    """Staff for one scenario. Whatever happens, no pause outlives it (the next scenario's consumers
    would claim nothing): one still open at the end is resumed, without a give-back."""
    if open_pauses():
        resume(sorted(open_pauses()))
    hands = Staff(reason)
    try:
        yield hands
    finally:
        if open_pauses():
            resume(sorted(open_pauses()))


def _command(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue().strip()


# -- a consumer killed during the pause ------------------------------------------------------------


def kill_and_see_it_paused(pool: ConsumerPool, logs: Path, timeout: float = 30.0) -> tuple[bool, bool]:
    """SIGKILL consumer 0, wait for the supervisor's new one to start and make its first look at the
    pauses; (it was restarted, it said the close is paused here). Its log is appended to at every
    start, so only what follows its last start line counts."""
    log = logs / f"{pool.name}-0.log"
    starts = _read(log).count(STARTED)
    if not pool.kill_pid(pool.pids()[0]):
        return False, False
    give_up = time.monotonic() + timeout
    restarted = paused = False
    while time.monotonic() < give_up and not paused:
        text = _read(log)
        restarted = text.count(STARTED) > starts
        paused = restarted and PAUSED_HERE in text.rsplit(STARTED, 1)[1]
        time.sleep(0.1)
    return restarted, paused


def _read(log: Path) -> str:
    return log.read_text(errors="replace") if log.exists() else ""


# -- what the database says ----------------------------------------------------------------------


def pause_checks(hands: Staff, before: dict[int, datetime], paid_while_paused: set[int],
                 t: Tuning) -> tuple[list[Check], dict[str, Any]]:
    """The pause held, and the give-back gave each deadline inside it exactly the pause's length.

    ``before``: every order's deadline as created; ``paid_while_paused``: the orders paid during the
    pause (settled before the give-back, so not given anything). An order is given time when its
    deadline fell in [paused_at, resumed_at + GIVE_BACK_GRACE) and it was still unpaid and open at
    the resume (``closed_at`` before ``resumed_at``: closed before the pause reached its consumer).
    """
    pause, model = hands.pause, get_order_model()
    assert pause is not None and pause.resumed_at is not None
    assert hands.paused_by_db is not None and hands.resuming_by_db is not None
    held_from = hands.paused_by_db + timedelta(seconds=reach(t).seconds)
    rows = {pk: (deadline, closed_at, status) for pk, deadline, closed_at, status in model._base_manager.filter(
        pk__in=list(before)).values_list("pk", "expires_at", "closed_at", model.TIMEOUT_STATUS_FIELD)}
    deliveries = dict(Delivery.objects.filter(order_id__in=list(before)).values_list("order_id")
                      .annotate(n=Count("id")))
    while_paused = sorted(pk for pk, (_due, closed, _s) in rows.items()
                          if closed is not None and held_from <= closed <= hands.resuming_by_db)
    before_reach = [closed for _due, closed, _s in rows.values()
                    if closed is not None and pause.paused_at <= closed < held_from]

    # Owed whatever the pause row says it gave: its length, from its start to the resume.
    given = pause.resumed_at - pause.paused_at
    until = pause.resumed_at + timedelta(seconds=settings.GIVE_BACK_GRACE)
    wrong_shift: list[str] = []
    closed_early_or_twice: list[int] = []
    owed = 0
    for pk, original in before.items():
        deadline, closed, status = rows[pk]
        pending = (pause.paused_at <= original < until and pk not in paid_while_paused
                   and not (closed is not None and closed < pause.resumed_at))
        if deadline - original != (given if pending else timedelta(0)):
            wrong_shift.append(f"{pk}: moved {(deadline - original).total_seconds():+.6f} s, "
                               f"owed {(given if pending else timedelta(0)).total_seconds():+.6f} s")
        if pending:
            owed += 1
            if status == model.TIMEOUT_CLOSED_STATUS and (closed is None or closed < deadline
                                                          or deliveries.get(pk, 0) != 1):
                closed_early_or_twice.append(pk)
    # Answered (the harness's clock, after mark_paid() returned) before the deadline, yet refused.
    refused_in_time = sum(1 for order_id, answered in Payment.objects.filter(outcome=Payment.Outcome.REFUND)
                          .values_list("order_id", "answered_at") if answered < rows[order_id][0])
    length = (pause.resumed_at - pause.paused_at).total_seconds()
    checks = [
        Check(f"no order closed while the close was paused, once the pause reached every consumer "
              f"({reach(t).formula} after its commit, to the resume; the database's clock)", not while_paused,
              f"{len(while_paused)} closed then, e.g. {while_paused[:5]}"),
        Check("the give-back moved each deadline inside the pause (or GIVE_BACK_GRACE after it) of an order "
              "still open by exactly the pause's length, and no other", not wrong_shift,
              f"{len(wrong_shift)} orders: {'; '.join(wrong_shift[:3])}"),
        Check("each order given time back and closed was closed once, at or after its new deadline",
              not closed_early_or_twice, f"{len(closed_early_or_twice)} were not, e.g. {closed_early_or_twice[:5]}"),
        Check("the pause counts the rows it gave time back to", pause.given_back_rows == owed,
              f"the pause says {pause.given_back_rows}, {owed} were owed it"),
        Check("the time given back is the pause's length, from its start to the resume",
              pause.given_back_seconds is not None and abs(pause.given_back_seconds - length) < 1e-6,
              f"given back {pause.given_back_seconds} s, paused {length:.6f} s"),
        Check("no payment refused before its (new) deadline", not refused_in_time,
              f"{refused_in_time} payments answered OrderClosed before the order's deadline"),
    ]
    facts: dict[str, Any] = {
        "paused (s, given back to each deadline inside)": round(length, 3),
        "orders given the time back": pause.given_back_rows,
        "closed after the pause was written, by a batch claimed before it (latest, s after it)":
            f"{len(before_reach)} ({max((c - pause.paused_at).total_seconds() for c in before_reach):.2f})"
            if before_reach else 0,
        "what staff saw": " | ".join(hands.said),
    }
    return checks, facts


def pay_now(pks: list[int]) -> None:
    """Pay these orders now, as the payment provider's callbacks would (the answers recorded)."""
    now = timezone.now()
    orders.pay_at(dict.fromkeys(pks, now), threads=4)
