"""The reminders' kind of timer: what a consumer does with a claim of reminders.

The same lifecycle as a close (scheduled on commit, claimed with a lease,
acted on under the row lock, acked), on a queue of its own kind
(``keys.REMIND``): one member per reminder of an order (``codec.reminder_member``),
due ``lead`` milliseconds before the deadline. ``reminding`` is the database
side; this module turns its outcome into acks, reschedules and retries.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass
from datetime import datetime

from .codec import deadline_score, now_score, parse_reminder
from .leaseguard import WatchedBatch
from .metrics import ConsumerMetrics
from .models import TimeoutOrderMixin
from .queue import BUSY, Claim, TimeoutQueue
from .reminding import Key, record_failed, send_reminders

logger = logging.getLogger("order_timeout")

# A reminder whose row another transaction holds is looked at again this much later.
BUSY_RETRY_MS = 1000


@dataclass
class ReminderReport:
    """What one batch of reminders did; logged as one line, added up in the consumer's stats."""

    claimed: int = 0
    sent: int = 0
    # Nothing to send: done before, order paid/closed/without a deadline, deadline passed.
    done: int = 0
    # Passed over: the order was held (a payment in flight) at the reminder's moment.
    held: int = 0
    rescheduled: int = 0
    failed: int = 0
    # Given up after the last retry (recorded failed).
    given_up: int = 0
    dropped: int = 0
    abandoned: int = 0

    def log(self) -> None:
        fields = asdict(self)
        logger.info("reminders " + " ".join(f"{name}=%s" for name in fields), *fields.values(),
                    extra={"reminders": fields})


class ReminderProcessor:
    """Send a claim's due reminders, then ack, reschedule or retry each member."""

    def __init__(self, queue: TimeoutQueue, model: type[TimeoutOrderMixin], *, retry_delays_ms: list[int],
                 max_takeovers: int, metrics: ConsumerMetrics) -> None:
        self.queue = queue
        self.model = model
        self.retry_delays_ms = retry_delays_ms
        self.max_takeovers = max_takeovers
        self.metrics = metrics

    def process(self, claim: Claim, now: datetime,
                watching: Callable[[Claim], AbstractContextManager[WatchedBatch | None]],
                learn_clock: Callable[[datetime | None], None], clock: Callable[[], datetime]) -> ReminderReport:
        by_key: dict[Key, str] = {}
        malformed: list[str] = []
        for member in claim.members:
            try:
                by_key[parse_reminder(self.model, member)] = member
            except ValueError:
                malformed.append(member)
        if malformed:
            logger.error("Dropping %d malformed reminder member(s) into the quarantine: %r", len(malformed),
                         malformed[:20])
            self.queue.quarantine(claim.token, malformed, now_score(now))
        if claim.takeovers > self.max_takeovers:
            return self._give_up_taken_over(claim, by_key, malformed, now)

        with watching(claim) as batch:
            outcome = send_reminders(self.model, list(by_key), should_stop=batch.expired if batch else None)
        learn_clock(outcome.db_now)
        sent_at = clock()
        token = claim.token
        self.queue.ack(token, [*(by_key[key] for key in
                                            (*outcome.sent, *outcome.done, *outcome.held, *outcome.missing))])
        self.queue.reschedule(token, {by_key[key]: deadline_score(moment)
                                      for key, moment in outcome.not_yet.items()})
        self.queue.reschedule(token, {by_key[key]: now_score(now) + BUSY_RETRY_MS for key in outcome.busy},
                              mark=BUSY, since_ms=now_score(now))
        if outcome.abandoned:
            self.queue.hand_over(token, [by_key[key] for key in outcome.abandoned], now_score(clock()))
        given_up = self._retry_or_give_up(token, outcome.failed, by_key, now)
        self.metrics.reminders(
            {"sent": len(outcome.sent), "done": len(outcome.done), "held": len(outcome.held),
             "rescheduled": len(outcome.not_yet), "busy": len(outcome.busy), "failed": len(outcome.failed),
             "given_up": given_up, "dropped": len(malformed) + len(outcome.missing),
             "abandoned": len(outcome.abandoned)},
            ((sent_at - moment).total_seconds() for moment in outcome.moments.values()))
        return ReminderReport(
            claimed=len(claim.members), sent=len(outcome.sent), done=len(outcome.done),
            held=len(outcome.held), rescheduled=len(outcome.not_yet) + len(outcome.busy),
            failed=len(outcome.failed), given_up=given_up,
            dropped=len(malformed) + len(outcome.missing), abandoned=len(outcome.abandoned))

    def _retry_or_give_up(self, token: str, failed: dict[Key, BaseException], by_key: dict[Key, str],
                          now: datetime) -> int:
        """Back off each failed reminder; past the last delay, record it failed and let it go."""
        if not failed:
            return 0
        key_of = {member: key for key, member in by_key.items()}
        retries = self.queue.retry(token, [by_key[key] for key in failed], now_score(now), self.retry_delays_ms)
        exhausted: list[Key] = []
        for retry in retries:
            key = key_of[retry.member]
            error = failed[key]
            if retry.retry_at_ms is None:
                exhausted.append(key)
            logger.warning(
                "reminder failed order=%s seconds_left=%g attempt=%d error=%s: %s next=%s", key[0],
                key[1] / 1000, retry.attempts, type(error).__name__, error,
                "give-up" if retry.retry_at_ms is None
                else f"retry in {(retry.retry_at_ms - now_score(now)) / 1000:g}s",
                exc_info=error, extra={"order_id": str(key[0]), "attempt": retry.attempts})
        return self._record_given_up(token, exhausted, by_key, now)

    def _give_up_taken_over(self, claim: Claim, by_key: dict[Key, str], malformed: list[str],
                            now: datetime) -> ReminderReport:
        """A reminder whose consumers kept dying with it: recorded failed, not tried again."""
        logger.error("reminder member(s) %s taken over %d times: given up without another try.",
                     ", ".join(by_key.values()), claim.takeovers)
        return ReminderReport(claimed=len(claim.members), given_up=self._record_given_up(
            claim.token, list(by_key), by_key, now), dropped=len(malformed))

    def _record_given_up(self, token: str, keys: list[Key], by_key: dict[Key, str], now: datetime) -> int:
        if not keys:
            return 0
        deadlines = dict(self.model._base_manager.filter(pk__in=[pk for pk, _lead in keys])
                         .exclude(expires_at=None).values_list("pk", "expires_at"))
        record_failed(self.model, [(key, deadlines[key[0]]) for key in keys if key[0] in deadlines], now)
        self.queue.ack(token, [by_key[key] for key in keys])
        return len(keys)

