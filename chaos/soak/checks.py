"""The soak's invariants, counted in the database (and at the webhook's target) once it settled.

The fault runs' global checks first (``chaos.invariants.global_checks``: no paid order closed, no
payment lost or refused wrongly, no close committed twice or without its order closed, none
before its deadline, no open dead letter of a settled order), then what a long run adds: every
order came to an end and none stayed open past the scan's bound at any sample, every closed
order's notice reached the target, the reminders went out once and in time, and the processes
and the harness did what the plan said. None of these is a timing: a slow machine makes the soak
slower, never failed. The prune deletes the app's notices and reminders as the run goes, so
these checks read what the prune leaves alone: the target's record, the shop's own
``ReminderEmail`` rows, the harness's ``Delivery`` and ``Payment`` rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection
from django.db.models import Count

from order_timeout import get_order_model
from order_timeout.models import DeadLetter, Notice
from testproject.shop.models import ReminderEmail

from .. import invariants
from ..models import Delivery, Payment, Role
from ..story import Check
from .plan import FAILING


@dataclass
class Run:
    """What the run itself saw, for the checks that are not in the database."""

    sigkills: tuple[int, int]  # (sent, planned)
    sigterms: tuple[int, int]
    unexpected_exits: list[str]
    failed_ticks: list[str]
    ticks: int
    harness_errors: list[str]
    harness_error_count: int
    open_past_bound: list[int]  # per sample
    late_reminders: list[int]  # per sample
    bound: float
    settled: bool
    stopped_at: datetime


def _count(sql: str, params: list[Any]) -> int:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return int(cursor.fetchone()[0] or 0)


def _as_text(expression: str) -> str:
    return f"CAST({expression} AS {'TEXT' if connection.vendor == 'postgresql' else 'CHAR'})"


def came_to_an_end(stopped_at: datetime) -> int:
    """Unpaid orders due before the consumers stopped that no open dead letter holds."""
    model = get_order_model()
    open_ = set(model._base_manager.filter(model.unpaid_q(), expires_at__lt=stopped_at).values_list("pk", flat=True))
    held = {int(pk) for pk in DeadLetter.objects.filter(resolved_at__isnull=True, timer="",
                                                       order_model=model._meta.label)
            .values_list("order_id", flat=True)}
    return len(open_ - held)


def notice_checks(sink: Any) -> tuple[list[Check], dict[str, Any]]:
    """Every closed order's webhook notice accepted by the target, and no other."""
    model = get_order_model()
    closed = set(model._base_manager.filter(**{model.TIMEOUT_STATUS_FIELD: model.TIMEOUT_CLOSED_STATUS})
                 .values_list("pk", flat=True))
    accepted = sink.accepted_orders()
    lost, strays = closed - accepted, accepted - closed
    pending = Notice.objects.filter(state=Notice.State.PENDING).count()
    letters = DeadLetter.objects.filter(timer="notices").count()
    checks = [
        Check("every closed order's notice reached the target", not lost,
              f"{len(lost)} of {len(closed)} never accepted, e.g. {sorted(lost)[:3]}"),
        Check("no notice of an order that was not closed", not strays and not sink.strays,
              f"{len(strays)} orders not closed, {sink.strays} keys of no order: "
              f"{sorted(strays)[:3]} {sink.stray_keys}"),
        Check("no notice left pending", pending == 0, f"{pending} pending"),
        Check("no notice dead-lettered", letters == 0, f"{letters} dead letters of notices"),
        Check("every request signed (SHOP_WEBHOOK_SECRET)", sink.unsigned == 0, f"{sink.unsigned} not signed"),
    ]
    facts = {"notices accepted (repeats)": f"{len(accepted)} ({sink.repeats})",
             "requests to the target (cut short by a kill)": f"{sink.received} ({sink.cut_short})"}
    return checks, facts


def reminder_checks(late_reminders: list[int]) -> list[Check]:
    """The shop's reminder e-mails (one row per delivery, in the reminder's transaction, kept), and
    the app's records of them as each sample found them (the prune deletes them as the run goes)."""
    label = get_order_model()._meta.label
    emails = ReminderEmail.objects.filter(model=label)
    twice = (emails.values("order_id", "seconds_left", "deadline").annotate(n=Count("id")).filter(n__gt=1)
             .count())
    late = max(late_reminders, default=0)
    e, p = ReminderEmail._meta.db_table, Payment._meta.db_table
    after_payment = _count(f"SELECT COUNT(*) FROM {e} e JOIN {p} p ON e.order_id = {_as_text('p.order_id')} "
                           f"WHERE e.model = %s AND p.outcome = %s AND e.written_at > p.answered_at",
                           [label, Payment.Outcome.PAID])
    return [
        Check("no reminder delivered twice (order, reminder, deadline)", twice == 0, f"{twice} delivered twice"),
        Check("no reminder sent at or after its deadline (the app's record, the database's clock, at every sample)",
              late == 0, f"up to {late} at a sample"),
        Check("no reminder delivered after its order's payment committed", after_payment == 0,
              f"{after_payment} after mark_paid() returned True"),
    ]


def run_checks(run: Run) -> list[Check]:
    """What the processes and the harness did, against the plan."""
    worst = max(run.open_past_bound, default=0)
    left = came_to_an_end(run.stopped_at)
    return [
        Check("every order due came to an end: closed, paid, or held by an open dead letter",
              run.settled and left == 0,
              f"{left} unpaid orders without an open dead letter" + ("" if run.settled else
                                                                      " (the harness stopped waiting)")),
        Check(f"no order open past the scan's bound ({run.bound:.0f} s) at any sample", worst == 0,
              f"up to {worst} at a sample"),
        Check("consumers were SIGKILLed and SIGTERMed as planned",
              run.sigkills[0] == run.sigkills[1] and run.sigterms[0] == run.sigterms[1],
              f"SIGKILL {run.sigkills[0]} of {run.sigkills[1]}, SIGTERM {run.sigterms[0]} of {run.sigterms[1]}"),
        Check("no consumer exited but those the harness stopped", not run.unexpected_exits,
              "; ".join(run.unexpected_exits)),
        Check("every beat tick ran to its end", not run.failed_ticks and run.ticks > 0,
              f"{run.ticks} ticks; failed: {'; '.join(run.failed_ticks)}"),
        Check("the harness's own threads met no error", run.harness_error_count == 0,
              f"{run.harness_error_count} errors: {'; '.join(run.harness_errors)}"),
    ]


def judge(run: Run, sink: Any) -> tuple[list[Check], dict[str, Any]]:
    """Every check, and the facts worth a line: closes' lateness, payments, deliveries."""
    notices, facts = notice_checks(sink)
    checks = [*invariants.global_checks(invariants.Tables()), *run_checks(run), *notices,
              *reminder_checks(run.late_reminders)]
    facts |= lateness()
    return checks, facts


def lateness() -> dict[str, Any]:
    """Seconds from each order's deadline to its close's delivery (the database's clock): p50,
    p99, max, of the orders whose close never failed (the others wait for staff). A figure,
    never a check."""
    model = get_order_model()
    pk = model._meta.pk
    assert pk is not None
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT d.delivered_at, o.expires_at FROM {Delivery._meta.db_table} d "
                       f"JOIN {model._meta.db_table} o ON o.{pk.column} = d.order_id "
                       f"JOIN {Role._meta.db_table} r ON r.order_id = d.order_id WHERE r.cohort <> %s", [FAILING])
        late = sorted((delivered - due).total_seconds() for delivered, due in cursor.fetchall())
    if not late:
        return {}

    def at(share: float) -> float:
        return late[min(len(late) - 1, int(share * len(late)))]

    return {"closes never failed": len(late), "their close after the deadline, p50 / p99 / max (s)":
            f"{at(0.5):.2f} / {at(0.99):.2f} / {late[-1]:.2f}"}
