"""``manage.py order_timeout_compensate [--rebuild] [--dry-run]``: the compensation scan by hand."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from order_timeout.exceptions import OrderTimeoutError
from order_timeout.scans.compensation import ScanResult, compensate

BAR_WIDTH = 30


class Command(BaseCommand):
    help = ("Close unpaid orders overdue by more than COMPENSATION_GRACE (what Redis missed), "
            "or with --rebuild put every unpaid order missing from Redis back into it.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--rebuild", action="store_true",
                            help="Refill Redis from the database after it lost its data.")
        parser.add_argument("--dry-run", action="store_true",
                            help="Count what would be done; change nothing.")

    def handle(self, *args: Any, **options: Any) -> None:
        progress = self._draw_progress if self.stdout.isatty() else None
        try:
            result = compensate(rebuild=options["rebuild"], dry_run=options["dry_run"],
                                progress=progress, exit_when_stuck=True)
        except OrderTimeoutError as exc:
            raise CommandError(str(exc)) from exc
        if progress:
            self.stdout.write("")
        self.stdout.write(self._summary(result))

    def _draw_progress(self, done: int, total: int) -> None:
        filled = BAR_WIDTH * done // total if total else BAR_WIDTH
        self.stdout.write(f"\r[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {done}/{total}", ending="")
        self.stdout.flush()

    @staticmethod
    def _summary(result: ScanResult) -> str:
        if result.skipped:
            return "Skipped: another compensation scan is running."
        would = "would be " if result.dry_run else ""
        if result.mode == "rebuild":
            text = (f"Rebuild: {result.examined} unpaid orders with a future deadline examined, "
                    f"{result.restored} {would}put back into Redis")
        else:
            text = (f"Scan: {result.examined} overdue unpaid orders found, {result.closed} closed, "
                    f"{result.skipped_paid} settled meanwhile (paid, or closed by a consumer), "
                    f"{result.not_due} extended, {result.failed} failed")
            if result.dry_run:
                text = f"Scan (dry run): {result.examined} overdue unpaid orders would be closed"
        lock = "" if result.locked else " (Redis unreachable: ran without the lock)"
        if result.lock_lost:
            lock = " (stopped early: the lock expired during a chunk; the next scan goes on)"
        return f"{text} in {result.elapsed_ms / 1000:.1f}s{lock}."
