"""``manage.py order_timeout_compensate [--rebuild] [--dry-run]``: the compensation scan by hand."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from order_timeout.exceptions import OrderTimeoutError
from order_timeout.scans.compensation import ScanResult, compensate

from ..progress import terminal_progress


class Command(BaseCommand):
    help = ("Close unpaid orders overdue by more than COMPENSATION_GRACE (what Redis missed), "
            "or with --rebuild put every unpaid order missing from Redis back into it.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--rebuild", action="store_true",
                            help="Refill Redis from the database after it lost its data.")
        parser.add_argument("--dry-run", action="store_true",
                            help="Count what would be done; change nothing.")
        parser.add_argument("--from-oldest", action="store_true",
                            help="Read every overdue row from the oldest, open dead letters included, not "
                                 "from where the last scan left only those (as every COMPENSATION_FULL_INTERVAL).")

    def handle(self, *args: Any, **options: Any) -> None:
        with terminal_progress(self.stdout) as progress:
            try:
                result = compensate(rebuild=options["rebuild"], dry_run=options["dry_run"],
                                    from_oldest=options["from_oldest"], progress=progress, exit_when_stuck=True)
            except OrderTimeoutError as exc:
                raise CommandError(str(exc)) from exc
        self.stdout.write(self._summary(result))

    @staticmethod
    def _summary(result: ScanResult) -> str:
        """One line for the order close, then one per declared timer, in their own words."""
        if result.skipped:
            return "Skipped: another compensation scan is running."
        lock = "" if result.locked else " (Redis unreachable: ran without the lock)"
        if result.lock_lost:
            lock = " (stopped early: the lock expired during a chunk; the next scan goes on)"
        head = {"rebuild": "Rebuild"}.get(result.mode, "Scan") + (" (dry run)" if result.dry_run else "")
        first = (_figures(result, rows="unpaid orders", acted="closed") if result.closes_orders
                 else "no order close (ORDER_MODEL is None)")
        lines = [f"{head}: {first} in {result.elapsed_ms / 1000:.1f}s{lock}."]
        lines += [f"  timer {name}: {_figures(figures, rows='rows', acted='acted on')}."
                  for name, figures in result.timers.items()]
        return "\n".join(lines)


def _figures(result: ScanResult, *, rows: str, acted: str) -> str:
    """What the scan did for one kind."""
    would = "would be " if result.dry_run else ""
    if result.mode == "rebuild":
        text = f"{result.examined} {rows} with a future deadline examined, {result.restored} {would}put back into Redis"
        return text + (f", {result.reminders_restored} reminders {would}put back" if result.reminders_restored else "")
    if result.dry_run:
        return f"{result.would_act} overdue {rows} would be {acted} (of {result.examined} overdue)"
    return (f"{result.examined} overdue {rows} found, {result.closed} {acted}, {result.skipped_paid} settled "
            f"meanwhile (paid, or {acted} by a consumer), {result.not_due} extended, {result.held} held, "
            f"{result.failed} failed, {result.dead_lettered} dead-lettered")
