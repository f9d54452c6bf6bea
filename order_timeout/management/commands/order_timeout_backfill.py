"""``manage.py order_timeout_backfill``: deadlines for unpaid orders that have none (adoption)."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser

from order_timeout.exceptions import OrderTimeoutError
from order_timeout.scans.backfill import Backfill, BackfillPlan
from order_timeout.scans.redate import Redate

from .order_timeout_redate import summary
from .run_timeout_consumer import seconds


class Command(BaseCommand):
    help = ("Give unpaid orders without a deadline one: now + --in seconds, their own "
            "--from-field + --timeout, or what DEADLINE_POLICY answers for each (--policy). "
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
        parser.add_argument("--timeout", type=seconds, default=None,
                            help="Seconds added to --from-field (default: DEFAULT_TIMEOUT).")
        parser.add_argument("--dry-run", action="store_true", help="Report; change nothing.")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["timeout"] is not None and not options["from_field"]:
            raise CommandError("--timeout goes with --from-field.")
        if options["policy"]:
            self._by_policy(dry_run=options["dry_run"])
            return
        try:
            backfill = Backfill(in_seconds=options["in_seconds"], from_field=options["from_field"],
                                timeout=options["timeout"])
            plan = backfill.plan() if options["dry_run"] else backfill.run()
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        except OrderTimeoutError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(self._summary(plan, dry_run=options["dry_run"]))

    def _by_policy(self, *, dry_run: bool) -> None:
        try:
            backfill = Redate(undated=True)
            plan = backfill.plan() if dry_run else backfill.run()
        except (ValueError, ImproperlyConfigured, OrderTimeoutError) as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(summary(plan, "unpaid orders without a deadline"))

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
                         "overdue at once: the consumer closes them as soon as they are scheduled "
                         "(order_expired fires for each).")
        return "\n".join(lines)
