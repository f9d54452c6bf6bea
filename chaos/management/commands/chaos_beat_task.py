"""``manage.py chaos_beat_task``: one tick of Celery beat's entry, run as a worker runs it.

The soak (``chaos.soak``) plays Celery beat with this, not with ``order_timeout_compensate``:
the beat entry's task, ``order_timeout.tasks.compensate``, is what a shop's beat runs, and the
task (not the command) is where the app prunes when ``PRUNE_INTERVAL`` has passed. Called
directly, as a worker calls it, in a process of its own per tick. Its result goes to the log as
one JSON line after ``RESULT_PREFIX``, for the soak to read.
"""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand

RESULT_PREFIX = "beat task result: "


class Command(BaseCommand):
    help = "Run order_timeout.tasks.compensate once, in this process, as Celery beat's worker would."

    def handle(self, *args: Any, **options: Any) -> None:
        from order_timeout.tasks import compensate

        result = compensate()
        self.stdout.write(RESULT_PREFIX + json.dumps(result, default=str, sort_keys=True))
