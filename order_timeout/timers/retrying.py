"""Retries with backoff and the give-up after the last: one rule for the consumers and the scan.

A key whose act failed goes back on its queue after each of ``RETRY_DELAYS``
(counted in Redis, so a retry a consumer takes, or the scan, counts on), and
after the last it is given up through its kind (a dead letter for staff, or a
reminder recorded failed). The lifecycle settles a claim's failures here; the
compensation scan first leases its own failures (``TimeoutQueue.take``) and
then settles them here too, so a failure the scan met reaches staff the same way.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from django.db import Error as DatabaseError

from ..queue import TimeoutQueue
from ..redaction import one_line
from .giving_up import Burial, Failure
from .members import now_score
from .outcome import Key

if TYPE_CHECKING:
    from datetime import datetime

    from .kind import Kind

logger = logging.getLogger("order_timeout")


class Retrier:
    """The retry delays (ms) and the lease (ms) they fall back on when a give-up cannot be written."""

    def __init__(self, *, retry_delays_ms: list[int], lease_ms: int) -> None:
        self.retry_delays_ms = retry_delays_ms
        self.lease_ms = lease_ms

    def delays_of(self, kind: Kind) -> list[int]:
        """The kind's own retry delays (the notices': NOTICE_RETRY_DELAYS), else RETRY_DELAYS."""
        own = kind.retry_delays()
        return self.retry_delays_ms if own is None else [round(1000 * delay) for delay in own]

    @classmethod
    def from_settings(cls) -> Retrier:
        from ..conf import settings

        return cls(retry_delays_ms=[round(1000 * delay) for delay in settings.RETRY_DELAYS],
                   lease_ms=round(1000 * settings.LEASE_SECONDS))

    def retry_or_give_up(self, kind: Kind, queue: TimeoutQueue, token: str, failed: dict[Key, BaseException],
                         by_key: dict[Key, str], now: datetime) -> int:
        """Back off each failed key; past the last delay, give it up (its kind records it) and let go."""
        if not failed:
            return 0
        key_of = {member: key for key, member in by_key.items()}
        # A failure no retry would change (a target that refused for good) is counted and given up now.
        now_ms = now_score(now)
        at_once = [by_key[key] for key, error in failed.items() if kind.gives_up_at_once(error)]
        later = [by_key[key] for key, error in failed.items() if not kind.gives_up_at_once(error)]
        retries = [*queue.retry(token, later, now_ms, self.delays_of(kind)), *queue.retry(token, at_once, now_ms, [])]
        dead: list[Failure] = []
        for retry in retries:
            key = key_of[retry.member]
            error = failed[key]
            if retry.retry_at_ms is None:
                dead.append(Failure(key, retry.attempts, retry.first_failure_ms, error))
            # An expected failure (a target down, a receiver raising) is one line: what failed, the
            # attempt, what happens next. Its traceback goes with the give-up, and at DEBUG.
            logger.warning(
                "%s failed %s attempt=%d error=%s: %s next=%s", kind.label, kind.describe(key),
                retry.attempts, type(error).__name__, one_line(error),
                kind.wording.give_up_next if retry.retry_at_ms is None
                else f"retry in {(retry.retry_at_ms - now_score(now)) / 1000:g}s",
                extra={"order_id": str(kind.row_of(key)), "attempt": retry.attempts},
            )
            logger.debug("%s failed %s attempt=%d: its traceback", kind.label, kind.describe(key),
                         retry.attempts, exc_info=error)
        if not dead:
            return 0
        burial = self.give_up(kind, queue, token, dead, by_key, now)
        buried = set(burial.buried)
        for failure in dead:
            if failure.key in buried:
                logger.error("%s %s %s after %d attempts; the last error follows.", kind.label,
                             kind.describe(failure.key), kind.wording.give_up_verb, failure.attempts,
                             exc_info=failure.error)
        return len(burial.buried)

    def give_up(self, kind: Kind, queue: TimeoutQueue, token: str, dead: list[Failure], by_key: dict[Key, str],
                now: datetime) -> Burial:
        """Record the give-up of the keys still pending, then let every member go.

        Recorded before the members leave Redis. If the record fails, they go
        back on the queue a last retry delay later, to be given up then: at
        most one try per that delay, never a loop, nothing lost.
        """
        members = [by_key[failure.key] for failure in dead]
        try:
            burial = kind.give_up(dead, now)
        except DatabaseError as exc:
            wait_ms = max(self.retry_delays_ms, default=self.lease_ms)
            logger.error("Could not write %d %s (%s: %s); member(s) %s of %s go back on the queue and are "
                         "given up %gs later.", len(dead), kind.wording.give_up_record, type(exc).__name__,
                         one_line(exc), ", ".join(members[:20]), kind.label, wait_ms / 1000)
            queue.reschedule(token, {member: now_score(now) + wait_ms for member in members})
            return Burial()
        if burial.settled:
            logger.info("%s: member(s) %s settled before their give-up was recorded: let go.", kind.label,
                        ", ".join(by_key[key] for key in burial.settled[:20]))
        queue.ack(token, members)
        return burial
