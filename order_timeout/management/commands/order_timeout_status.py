"""``manage.py order_timeout_status``: how the queue is doing, for people, cron and health checks."""

from __future__ import annotations

import json
from argparse import ArgumentTypeError
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from order_timeout import get_order_model
from order_timeout.codec import now_score
from order_timeout.exceptions import OrderTimeoutError
from order_timeout.models import DeadLetter, Status
from order_timeout.queue import TimeoutQueue

# Exit status when a threshold is crossed (1 is any other error).
THRESHOLD_CROSSED = 2


def non_negative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ArgumentTypeError(f"must be a number, got {text!r}") from None
    if value < 0:
        raise ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


class Command(BaseCommand):
    help = ("Print the timeout queue's backlog; exit 2 when --max-overdue, --max-age or "
            "--max-dead-letters is crossed.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="One JSON object, for machines.")
        parser.add_argument("--max-overdue", type=non_negative, default=None,
                            help="Fail when more unpaid orders than this are past their deadline "
                                 "in the database.")
        parser.add_argument("--max-age", type=non_negative, default=None,
                            help="Fail when the oldest due member has waited longer than this "
                                 "many seconds to be claimed.")
        parser.add_argument("--max-dead-letters", type=non_negative, default=None,
                            help="Fail when more dead letters than this wait for staff.")

    def handle(self, *args: Any, **options: Any) -> None:
        now = timezone.now()
        try:
            queue = TimeoutQueue.from_settings().stats(now_score(now))
        except OrderTimeoutError as exc:
            raise CommandError(f"Cannot read the queue: {exc}") from exc
        model = get_order_model()
        status = {
            "pending": queue.pending,
            "due_unclaimed": queue.due,
            "leased": queue.leased,
            "expired_leases": queue.expired_leases,
            "oldest_due_age_seconds": (
                round((now_score(now) - queue.oldest_due_ms) / 1000, 3)
                if queue.oldest_due_ms is not None else 0.0
            ),
            "dead_letters": DeadLetter.objects.filter(resolved_at__isnull=True).count(),
            "overdue_unpaid_in_database": model._default_manager.filter(
                status=Status.UNPAID, expires_at__lte=now).count(),
        }
        if options["json"]:
            self.stdout.write(json.dumps(status))
        else:
            width = max(map(len, status))
            for key, value in status.items():
                self.stdout.write(f"{key.replace('_', ' '):<{width}}  {value}")

        crossed = []
        if options["max_overdue"] is not None and \
                status["overdue_unpaid_in_database"] > options["max_overdue"]:
            crossed.append(f"{status['overdue_unpaid_in_database']} overdue unpaid orders "
                           f"> --max-overdue {options['max_overdue']:g}")
        if options["max_age"] is not None and status["oldest_due_age_seconds"] > options["max_age"]:
            crossed.append(f"oldest due member waited {status['oldest_due_age_seconds']:g}s "
                           f"> --max-age {options['max_age']:g}")
        if options["max_dead_letters"] is not None and \
                status["dead_letters"] > options["max_dead_letters"]:
            crossed.append(f"{status['dead_letters']} open dead letters "
                           f"> --max-dead-letters {options['max_dead_letters']:g}")
        if crossed:
            raise CommandError("; ".join(crossed), returncode=THRESHOLD_CROSSED)
