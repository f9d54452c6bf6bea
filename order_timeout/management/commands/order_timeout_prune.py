"""``manage.py order_timeout_prune [--dry-run]``: delete what the app no longer needs, by hand or from cron."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from order_timeout.exceptions import QueueUnavailable
from order_timeout.scans.pruning import PruneResult, prune
from order_timeout.scans.turns import PRUNE, take_turn

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
        if options["dry_run"]:
            with terminal_progress(self.stdout) as progress:
                counted = prune(dry_run=True, progress=progress)
            self.stdout.write(summary(counted))
            return
        # Now, whatever ran before, yet one prune at a time: the fleet's turn (scans/turns.py), which
        # records this run as the last one, so the consumers' next prune is PRUNE_INTERVAL later.
        try:
            turn = take_turn(PRUNE, "command", interval=None)
        except QueueUnavailable as error:
            self.stderr.write(f"Redis cannot be reached ({error}): pruning without the fleet's turn.")
            turn = None
        else:
            if turn is None:
                raise CommandError("Another prune runs now (a consumer's, the beat's or another command's): "
                                   "nothing done. Its lock lapses within COMPENSATION_LOCK_SECONDS if it died.")
        result: PruneResult | None = None
        try:
            with terminal_progress(self.stdout) as progress:
                result = prune(progress=progress, between_chunks=None if turn is None else turn.renew)
        finally:
            if turn is not None:
                turn.end(complete=result is not None and result.complete,
                         figures={} if result is None else {"deleted": sum(result.deleted.values()),
                                                            "complete": result.complete})
        assert result is not None  # prune() returned (it raised otherwise)
        self.stdout.write(summary(result))


def summary(result: PruneResult) -> str:
    counts = [f"{count} {NOUNS[table][count != 1]}" for table, count in result.deleted.items()]
    listed = ", ".join(counts[:-1]) + f" and {counts[-1]}" if len(counts) > 1 else "".join(counts)
    verb = "Would delete" if result.dry_run else "Deleted"
    return f"{verb} {listed} in {result.elapsed_ms / 1000:.1f}s."
