"""``manage.py order_timeout_prune [--dry-run]``: delete what the app no longer needs, by hand or from cron."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from order_timeout.scans.pruning import PruneResult, prune

from ..progress import terminal_progress

# How each table's rows read in the summary: (one, many).
NOUNS = {"notices": ("notice", "notices"), "reminders": ("reminder record", "reminder records"),
         "dead_letters": ("resolved dead letter", "resolved dead letters"),
         "refused_writes": ("handled refused write", "handled refused writes"),
         "pauses": ("ended pause", "ended pauses")}


class Command(BaseCommand):
    help = ("Delete delivered and dropped notices, reminder records, resolved dead letters, handled "
            "refused writes and ended pauses past their retention (NOTICE_RETENTION, REMINDER_RETENTION, "
            "DEAD_LETTER_RETENTION), a chunk at a time. Pending notices, open dead letters, refused writes not "
            "handled and open pauses are never deleted.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--dry-run", action="store_true", help="Count what would be deleted; delete nothing.")

    def handle(self, *args: Any, **options: Any) -> None:
        with terminal_progress(self.stdout) as progress:
            result = prune(dry_run=options["dry_run"], progress=progress)
        self.stdout.write(summary(result))


def summary(result: PruneResult) -> str:
    counts = [f"{count} {NOUNS[table][count != 1]}" for table, count in result.deleted.items()]
    listed = ", ".join(counts[:-1]) + f" and {counts[-1]}" if len(counts) > 1 else "".join(counts)
    verb = "Would delete" if result.dry_run else "Deleted"
    return f"{verb} {listed} in {result.elapsed_ms / 1000:.1f}s."
