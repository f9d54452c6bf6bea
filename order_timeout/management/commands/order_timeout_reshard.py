"""``manage.py order_timeout_reshard --from N``: move the queue from N shards to ``SHARDS``."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from order_timeout.conf import MAX_SHARDS, settings
from order_timeout.exceptions import OrderTimeoutError
from order_timeout.scans.reshard import reshard

from .run_timeout_consumer import seconds


class Command(BaseCommand):
    help = ("After changing ORDER_TIMEOUT['SHARDS'] (deployed everywhere), move every member from "
            "the old number of shards to the new one, losing none.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--from", dest="old_shards", type=int, required=True, metavar="N",
                            help="The number of shards the queue had before.")
        parser.add_argument("--dry-run", action="store_true", help="Count; move nothing.")
        parser.add_argument("--wait", type=seconds, default=None, metavar="SECONDS",
                            help="How long to wait for leases still live in the old layout "
                                 "(default: the longer of BATCH_TIME_LIMIT and LEASE_SECONDS, + 5).")

    def handle(self, *args: Any, **options: Any) -> None:
        old = options["old_shards"]
        if not 1 <= old <= MAX_SHARDS:
            raise CommandError(f"--from must be from 1 to {MAX_SHARDS}, got {old}.")
        if old == settings.SHARDS:
            raise CommandError(f"--from {old} is ORDER_TIMEOUT['SHARDS'] already: nothing to move. "
                               "Set SHARDS to the new number first.")
        try:
            result = reshard(old, dry_run=options["dry_run"], wait_seconds=options["wait"])
        except OrderTimeoutError as exc:
            raise CommandError(str(exc)) from exc
        verb = "would move" if result.dry_run else "moved"
        self.stdout.write(f"Reshard {result.old_shards} -> {result.new_shards} shards: {verb} "
                          f"{result.moved} members in {result.passes} pass(es).")
        if result.still_leased:
            raise CommandError(
                f"{result.still_leased} members are still leased in the old layout (a consumer "
                "with the old SHARDS still running?); run it again once they are done.")
