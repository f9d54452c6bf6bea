"""``manage.py order_timeout_pause [--timer NAME ...] --reason "PSP outage"``: pause timers during an outage."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from order_timeout.timers.pausing import PauseRefused, known_names, pause


class Command(BaseCommand):
    help = ("Pause timers (by default the order close) while a payment provider is down: no consumer "
            "claims them and no scan acts on them until order_timeout_resume; every other timer goes on, "
            "and payments are accepted as ever.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--timer", action="append", metavar="NAME",
                            help="A timer to pause (close, reminders, notices, or a declared timer's name); "
                                 "give it again for more. Default: close.")
        parser.add_argument("--reason", required=True, help="Why (the outage): staff and the log read it.")

    def handle(self, *args: Any, **options: Any) -> None:
        names = options["timer"] or ["close"]
        try:
            created = pause(names, options["reason"], known=known_names())
        except PauseRefused as exc:
            raise CommandError(str(exc)) from exc
        for row in created:
            self.stdout.write(f"Paused {row.timer} at {row.paused_at:%Y-%m-%d %H:%M:%S %Z}: {row.reason}")
