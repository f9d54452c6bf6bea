"""``manage.py order_timeout_resume [--timer NAME ...] [--give-back]``: resume paused timers."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from order_timeout.conf import settings
from order_timeout.scans.giveback import resume_timers
from order_timeout.timers.pausing import PauseRefused


class Command(BaseCommand):
    help = ("Resume paused timers (by default the order close). With --give-back, every pending row whose "
            "deadline fell inside the pause, or falls within GIVE_BACK_GRACE after now, first gets its "
            "deadline moved later by the pause's length; without it, what fell due is acted on at once.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--timer", action="append", metavar="NAME",
                            help="A paused timer to resume; give it again for more. Default: close.")
        parser.add_argument("--give-back", action="store_true",
                            help="Give each deadline inside the pause (or within GIVE_BACK_GRACE after now) "
                                 "the pause's length, before resuming.")

    def handle(self, *args: Any, **options: Any) -> None:
        names = options["timer"] or ["close"]
        try:
            ended, given = resume_timers(names, give_time_back=options["give_back"])
        except PauseRefused as exc:
            raise CommandError(str(exc)) from exc
        for row in ended:
            assert row.resumed_at is not None
            line = f"Resumed {row.timer}, paused since {row.paused_at:%Y-%m-%d %H:%M:%S %Z} ({row.reason})"
            if row.timer in given:
                back = given[row.timer]
                line += (f"; gave {back.seconds:g}s back to {back.moved} row(s) due before "
                         f"{back.until:%H:%M:%S} (GIVE_BACK_GRACE {settings.GIVE_BACK_GRACE:g}s after now)")
                if back.busy:
                    line += f"; {back.busy} locked elsewhere were not moved"
            self.stdout.write(line + ".")
