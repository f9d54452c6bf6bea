"""What one soak runs: its length and stream, its schedule of kills, the ages it prunes at.

The ages are short so that a run of minutes reaches the steady state a shop reaches in weeks:
what the app keeps for ``retention`` seconds reaches its plateau a retention, a prune and a
scan after the stream starts (about a minute here), well inside the second half of a 2-minute
run, where the growth is fitted.

The prune runs on the beat's ticks once ``PRUNE_INTERVAL`` has passed: with a tick every 15 s
and a prune interval of 20 s, a prune every 30 s. Samples come every 20 s, so they meet the
prune's sawtooth at three phases in turn (every 60 s), never at one phase drifting slowly,
which would read as a slope.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from typing import Any

from ..tuning import DEFAULT_LEASE_SECONDS, Tuning

# The cohorts of the stream (``Role.cohort``): what each order must come to.
NEVER_PAID = "never paid"
PAID_EARLY = "paid before its deadline"
PAID_AT_DEADLINE = "paid at its deadline"
# Orders whose close raises on every attempt (the shop's stock service is down for them) until staff
# fix it: named after their behaviour, as the fault runs name a misbehaving order's cohort.
FAILING = "raise"

# The webhook every close tells (the test shop's handler, testproject/shop/notices.py).
WEBHOOK = "order-expired-webhook"

# The open dead letters, sampled apart from their table's rows: staff's, never pruned.
OPEN_LETTERS = "order_timeout_deadletter (open)"


@dataclass(frozen=True)
class Plan:
    """A soak's settings. Times in seconds; shares of the stream's orders."""

    seconds: float
    database: str = "mariadb"
    rate: float = 100.0
    consumers: int = 3
    sample_every: float = 20.0
    # Consumer 0 is never killed (its memory is the one judged); the others take turns.
    sigkill_every: float = 45.0
    sigterm_every: float = 90.0
    # NOTICE_RETENTION, REMINDER_RETENTION and DEAD_LETTER_RETENTION alike.
    retention: float = 30.0
    prune_interval: float = 20.0
    compensation_interval: float = 15.0
    # COMPENSATION_FULL_INTERVAL: the scan reads every overdue row from the oldest this often.
    full_interval: float = 120.0
    # Staff look at the dead letters this often, and act on those older than ``staff_after``.
    staff_every: float = 30.0
    staff_after: float = 10.0
    # REMINDERS: one, this long before the deadline.
    reminder: float = 3.0
    # Seconds from an order's creation to its deadline: uniform between the two.
    lead: tuple[float, float] = (5.0, 15.0)
    failing: float = 0.01
    paid_early: float = 0.20
    paid_at_deadline: float = 0.02
    # The RSS target's reference: a consumer's memory this long into the run (5 minutes), or from
    # the start of the fitted half in a shorter run.
    warm_up: float = 300.0

    @property
    def fit_from(self) -> float:
        """The steady state, where growth is fitted: the second half of the stream."""
        return self.seconds / 2

    @property
    def rss_reference(self) -> float:
        return min(self.warm_up, self.fit_from)

    @property
    def sigterm_offset(self) -> float:
        """The first SIGTERM, a third of its period in, so it never falls on a SIGKILL's moment."""
        return self.sigterm_every / 3

    def tuning(self) -> Tuning:
        """The fault runs' tuning at the app's own lease (a death costs a heartbeat, as in
        production) and batch size, with a scan that leaves the retries' time (check W004)."""
        return replace(Tuning(), lease_seconds=DEFAULT_LEASE_SECONDS, batch_size=200,
                       compensation_grace=DEFAULT_LEASE_SECONDS + 10,
                       compensation_interval=self.compensation_interval, compensation_lock_seconds=60.0)

    def environment(self, webhook_url: str, secret: str) -> dict[str, str]:
        """What every process of the soak adds to the fault runs' environment: the ages, the
        reminder, the behaviours (the failing closes) and the webhook to the soak's target."""
        ages = {"COMPENSATION_FULL_INTERVAL": self.full_interval, "NOTICE_RETENTION": self.retention,
                "REMINDER_RETENTION": self.retention, "DEAD_LETTER_RETENTION": self.retention,
                "PRUNE_INTERVAL": self.prune_interval}
        return {**{f"ORDER_TIMEOUT_{key}": json.dumps(value) for key, value in ages.items()},
                "ORDER_TIMEOUT_REMINDERS": f"{self.reminder:g}", "CHAOS_BEHAVIOURS": "1",
                "SHOP_WEBHOOK_URL": webhook_url, "SHOP_WEBHOOK_SECRET": secret, "SHOP_EMAIL_NOTICES": "0",
                # The reminders' e-mails are rendered and handed to a backend that keeps nothing. The test
                # project's default (locmem) keeps every e-mail in its process's mail.outbox: the first
                # 30-minute run's never-killed consumer grew by them, some 0.5 kB an order, for ever.
                "EMAIL_BACKEND": "django.core.mail.backends.dummy.EmailBackend"}

    def kills(self) -> list[tuple[float, str, int]]:
        """(moment, signal name, consumer slot) of every kill, in order: SIGKILL and SIGTERM each
        take the slots after the first in turn (in opposite orders), so each slot meets both."""
        others = list(range(1, self.consumers))
        if not others:
            return []
        events: list[tuple[float, str, int]] = []
        moment, turn = self.sigkill_every, 0
        while moment < self.seconds:
            events.append((moment, "SIGKILL", others[turn % len(others)]))
            moment, turn = moment + self.sigkill_every, turn + 1
        moment, turn = self.sigterm_offset, 0
        while moment < self.seconds:
            events.append((moment, "SIGTERM", others[-1 - turn % len(others)]))
            moment, turn = moment + self.sigterm_every, turn + 1
        return sorted(events)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
