"""``manage.py order_timeout_backfill``: deadlines for unpaid orders that have none (adoption), or a
column timer's pending rows put in its queue (``--timer``)."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser

from order_timeout.exceptions import OrderTimeoutError
from order_timeout.scans.backfill import Backfill, BackfillPlan, TimerBackfill, TimerBackfillPlan
from order_timeout.scans.compensation import Progress
from order_timeout.scans.redate import Redate
from order_timeout.timers.kind import Kind
from order_timeout.timers.registry import registry

from ..progress import terminal_progress
from .order_timeout_redate import acted_on_at_once, pending_rows, summary
from .run_timeout_consumer import seconds


class Command(BaseCommand):
    help = ("Give unpaid orders without a deadline one: now + --in seconds, their own "
            "--from-field + --timeout, or what DEADLINE_POLICY answers for each (--policy). "
            "Or put a declared timer's pending rows in its queue at their deadlines (--timer). "
            "Says what it will do with --dry-run.")

    def add_arguments(self, parser: CommandParser) -> None:
        source = parser.add_mutually_exclusive_group(required=True)
        source.add_argument("--in", dest="in_seconds", type=seconds, metavar="SECONDS",
                            help="Every such order's deadline becomes now + SECONDS.")
        source.add_argument("--from-field", metavar="FIELD",
                            help="Each order's deadline becomes its own FIELD (a DateTimeField, "
                                 "e.g. its creation date) + --timeout.")
        source.add_argument("--policy", action="store_true",
                            help="Each order's deadline is what DEADLINE_POLICY answers for it (an order it "
                                 "answers None for keeps none; one it fails for is left and reported).")
        source.add_argument("--timer", metavar="NAME",
                            help="A declared timer whose deadline is a column: put its pending rows in its "
                                 "queue, those past their deadline due now (order_timeout_status lists the "
                                 "timers).")
        parser.add_argument("--timeout", type=seconds, default=None,
                            help="Seconds added to --from-field (default: DEFAULT_TIMEOUT).")
        parser.add_argument("--dry-run", action="store_true", help="Report; change nothing.")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["timeout"] is not None and not options["from_field"]:
            raise CommandError("--timeout goes with --from-field.")
        dry_run = options["dry_run"]
        with terminal_progress(self.stdout) as progress:
            if options["timer"] is not None:
                text = self._timer(declared_timer(options["timer"]), dry_run=dry_run, progress=progress)
            elif options["policy"]:
                text = self._by_policy(dry_run=dry_run, progress=progress)
            else:
                text = self._orders(options, dry_run=dry_run, progress=progress)
        self.stdout.write(text)

    def _orders(self, options: dict[str, Any], *, dry_run: bool, progress: Progress | None) -> str:
        try:
            backfill = Backfill(in_seconds=options["in_seconds"], from_field=options["from_field"],
                                timeout=options["timeout"], progress=progress)
            plan = backfill.plan() if dry_run else backfill.run()
        except (ValueError, OrderTimeoutError) as exc:
            raise CommandError(str(exc)) from exc
        return self._summary(plan, dry_run=dry_run)

    def _by_policy(self, *, dry_run: bool, progress: Progress | None) -> str:
        try:
            backfill = Redate(undated=True, progress=progress)
            plan = backfill.plan() if dry_run else backfill.run()
        except (ValueError, ImproperlyConfigured, OrderTimeoutError) as exc:
            raise CommandError(str(exc)) from exc
        return summary(plan, "unpaid orders without a deadline")

    def _timer(self, timer: Kind, *, dry_run: bool, progress: Progress | None) -> str:
        try:
            backfill = TimerBackfill(timer, progress=progress)
            plan = backfill.plan() if dry_run else backfill.run()
        except (ValueError, OrderTimeoutError) as exc:
            raise CommandError(f"--timer: {exc}") from exc
        return timer_summary(plan, timer)

    @staticmethod
    def _summary(plan: BackfillPlan, *, dry_run: bool) -> str:
        verb = "would get" if dry_run else "got"
        lines = [f"{plan.candidates} unpaid orders have no deadline; "
                 f"{plan.dated if dry_run else plan.done} {verb} one."]
        if plan.candidates > plan.dated:
            lines.append(f"{plan.candidates - plan.dated} are left without one: their source "
                         "field is empty.")
        if plan.dated:
            lines.append(f"Deadlines from {plan.earliest:%Y-%m-%d %H:%M:%S %Z} "
                         f"to {plan.latest:%Y-%m-%d %H:%M:%S %Z}.")
        if plan.overdue_at_once:
            lines.append(f"{plan.overdue_at_once} of them {'would be' if dry_run else 'are'} "
                         f"overdue at once: {acted_on_at_once(None)}.")
        return "\n".join(lines)


def declared_timer(name: str) -> Kind:
    """The declared timer named ``name``; a CommandError naming those there are otherwise (the
    order close is this command without --timer)."""
    declared = {timer.name: timer for timer in registry.declared()}
    if name not in declared:
        names = ", ".join(repr(known) for known in declared) or "none"
        raise CommandError(f"--timer: no declared timer named {name!r} (declared: {names}); the unpaid "
                           "orders are backfilled without --timer.")
    return declared[name]


def timer_summary(plan: TimerBackfillPlan, timer: Kind) -> str:
    """A timer's backfill in words, for people."""
    would = "would be " if plan.dry_run else ""
    lines = [f"{plan.examined} {pending_rows(timer)} have a deadline; {plan.scheduled} {would}put in Redis, "
             f"{plan.moved_earlier} {would}moved earlier to their deadlines, {plan.kept} already there, "
             "left as they are."]
    if plan.overdue_at_once:
        lines.append(f"{plan.overdue_at_once} of them {'would be' if plan.dry_run else 'are'} overdue at once: "
                     f"{acted_on_at_once(timer)}.")
    if plan.dead_letters:
        lines.append(f"{plan.dead_letters} wait as open dead letters and were left to staff.")
    return "\n".join(lines)
