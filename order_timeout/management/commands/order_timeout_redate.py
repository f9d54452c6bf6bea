"""``manage.py order_timeout_redate``: ask DEADLINE_POLICY again for the open orders' deadlines."""

from __future__ import annotations

import json
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser

from order_timeout.exceptions import OrderTimeoutError
from order_timeout.scans.redate import Redate, RedatePlan, rows_filter
from order_timeout.timers.kind import Declared, Kind
from order_timeout.timers.registry import ORDER_TIMEOUT, registry

from ..progress import terminal_progress
from .run_timeout_consumer import batch_size


class Command(BaseCommand):
    help = ("Re-date unpaid orders from DEADLINE_POLICY (after a payment window changed), or a declared "
            "timer's rows from its deadline_for() (--timer): every one, or those --where names, a chunk "
            "per transaction; rows locked elsewhere are skipped and counted. Says what it would do with "
            "--dry-run.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--where", action="append", default=[], metavar="LOOKUP=VALUE",
                            help="Only the orders this names, as a queryset filter (repeatable, all must "
                                 "hold): --where channel__slug=web, --where payment_method__in=card,wallet.")
        parser.add_argument("--timer", metavar="NAME", default=None,
                            help="A declared timer's rows instead, re-dated from its deadline_for() "
                                 "(order_timeout_status lists the timers).")
        parser.add_argument("--chunk", type=batch_size, default=None,
                            help="Orders locked and re-dated per transaction (default: COMPENSATION_CHUNK).")
        parser.add_argument("--dry-run", action="store_true", help="Report what would change; change nothing.")
        parser.add_argument("--json", action="store_true", help="One JSON object, for machines.")

    def handle(self, *args: Any, **options: Any) -> None:
        timer = None
        if options["timer"] is not None:
            try:
                timer = registry.get(options["timer"])
            except LookupError as exc:
                names = ", ".join(repr(declared.name) for declared in registry.declared()) or "none"
                raise CommandError(f"--timer: {exc} (declared: {names}).") from exc
            if timer is ORDER_TIMEOUT:
                timer = None  # the order close: DEADLINE_POLICY
        with terminal_progress(self.stdout, wanted=not options["json"]) as progress:
            try:
                redate = Redate(where=rows_filter(options["where"]), chunk_size=options["chunk"], timer=timer,
                                progress=progress)
                plan = redate.plan() if options["dry_run"] else redate.run()
            except (ValueError, ImproperlyConfigured, OrderTimeoutError) as exc:
                raise CommandError(str(exc)) from exc
        self.stdout.write(json.dumps(plan.as_dict(), default=str) if options["json"] else summary(plan, timer=timer))


def pending_rows(timer: Kind) -> str:
    """A timer's rows in words: "pending stock reservations of timer reservation-lapses"."""
    return f"pending {timer.model._meta.verbose_name_plural} of timer {timer.name}"


def acted_on_at_once(timer: Kind | None) -> str:
    """What becomes of rows scheduled past their deadline, naming what runs for them: the order
    close's ``order_expired``, or the timer's own ``values`` and ``fire()``."""
    if timer is None:
        return "the consumer closes them as soon as they are scheduled (order_expired fires for each)"
    receiver = (f"{type(timer.declaration).__name__}.fire() runs for them"
                if isinstance(timer, Declared) and timer.declares_fire else "")
    if timer.values and receiver:
        acts = f"its values are written and {receiver}"
    elif receiver:
        acts = receiver
    else:
        acts = f"its values are written: {', '.join(timer.values)}"
    return f"the consumer acts on them as soon as they are scheduled (timer {timer.name}: {acts})"


def summary(plan: RedatePlan, what: str | None = None, *, timer: Kind | None = None) -> str:
    """A plan in words, for people; ``timer``: a declared timer's re-date (None: the orders')."""
    would = "would" if plan.dry_run else "did"
    what = what or ("open orders" if timer is None else pending_rows(timer))
    lines = [f"{plan.examined} {what} looked at; {plan.changed} {'would change' if plan.dry_run else 'changed'} "
             f"({plan.later} later, {plan.earlier} earlier, {plan.never} never expire, {plan.dated} dated), "
             f"{plan.unchanged} unchanged."]
    if plan.earliest is not None:
        lines.append(f"New deadlines from {plan.earliest:%Y-%m-%d %H:%M:%S %Z} to {plan.latest:%Y-%m-%d %H:%M:%S %Z}.")
    if plan.overdue_at_once:
        lines.append(f"{plan.overdue_at_once} {'would be' if plan.dry_run else 'are'} overdue at once: "
                     f"{acted_on_at_once(timer)}.")
    if plan.busy:
        lines.append(f"{plan.busy} were locked by another transaction and left as they were: run it again.")
    if plan.dead_letters:
        lines.append(f"{plan.dead_letters} wait as open dead letters and were left to staff.")
    if plan.failed:
        source = "The policy" if timer is None else f"{type(timer).__name__}.deadline_for()"
        lines.append(f"{source} failed for {plan.failed}, left as they were ({would} not guess): "
                     + "; ".join(plan.failures))
    return "\n".join(lines)
