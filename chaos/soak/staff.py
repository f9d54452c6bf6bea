"""Staff at the dead letters, on a schedule: what the soak's failing closes wait for.

An order whose close fails for good becomes a dead letter, and open dead letters are staff's:
the app never prunes them. Staff here do what a shop's staff do once the cause is fixed: the
shop's stock service is fixed for those orders (their ``Role`` no longer raises), and the letters
are resolved through the admin's own service functions (``order_timeout.timers.staff``): every
other one requeued, the rest closed now. Resolved letters are then the prune's, after
``DEAD_LETTER_RETENTION``, so even that table stays flat.
"""

from __future__ import annotations

import threading
from collections import Counter
from datetime import timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.db import connection
from django.utils import timezone

from order_timeout import get_order_model
from order_timeout.models import DeadLetter
from order_timeout.timers import staff

from ..models import Role
from .stream import Errors


class StaffDesk:
    """Every ``every`` seconds, resolve the open dead letters older than ``after`` seconds."""

    def __init__(self, every: float, after: float, errors: Errors) -> None:
        self.every = every
        self.after = after
        self.errors = errors
        self.counts: Counter[str] = Counter()
        self.visits = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-staff", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        try:
            user = get_user_model().objects.get_or_create(username="soak-staff", defaults={"is_staff": True})[0]
            while not self._stop.wait(self.every):
                try:
                    self.visit(user)
                except Exception as exc:  # the harness's failure: counted, reported, and it goes on
                    self.errors.add("staff resolving dead letters", exc)
        finally:
            connection.close()

    def visit(self, user: Any) -> None:
        """One round: fix the shop for the failing orders, then requeue half, close the others now."""
        now = timezone.now()
        letters = list(DeadLetter.objects.filter(resolved_at__isnull=True,
                                                 last_failed_at__lte=now - timedelta(seconds=self.after))
                       .order_by("pk"))
        self.visits += 1
        if not letters:
            return
        label = get_order_model()._meta.label
        orders = [int(letter.order_id) for letter in letters if letter.timer == "" and letter.order_model == label]
        Role.objects.filter(order_id__in=orders).update(behaviour=Role.Behaviour.NONE)
        self.counts.update({f"requeue: {key}": value
                            for key, value in staff.requeue(letters[0::2], user, now).items()})
        self.counts.update({f"close now: {key}": value
                            for key, value in staff.close_now(letters[1::2], user, now).items()})
