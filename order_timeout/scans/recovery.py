"""A queue Redis lost, rebuilt from the rows by a consumer within seconds, with no Celery beat.

Redis can come back empty: a restart without persistence, a failover to a
replica that had nothing, a FLUSHDB by mistake. Or it comes back with an
older copy: restarted from its last snapshot, or a replica promoted that
missed the master's last writes. Every consumer then stays connected, idle
for what was lost, and the compensation scan would heal it minutes later. So
each queue keeps an epoch: a row in the database (``models.QueueEpoch``) and
a marker on each of its shards in Redis, stamped with the run id of the
server that wrote it. A consumer's heartbeat looks at the markers at every
beat. A marker missing while the row exists means Redis lost the queue; one
stamped by another server, that it may have lost its last writes (where INFO
is refused to the queue's user, only the first is seen). Either way the
consumer rebuilds it at once, with the compensation
scan's heal: every future deadline put back, and every overdue row missing
from Redis put back due (no grace: nobody else has them; an open dead letter
is left to staff), under the scan's lock, so one consumer rebuilds and the
others go on closing what it puts back. Once it is done the markers are
set again. With no row the queue is new (a first deploy): the row and the
markers are written, and nothing is rebuilt.

Rows whose state is final are never acted on twice: the heal restores only
what is missing from Redis, and every act re-checks its row under the lock.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence

from django.db import models
from django.utils import timezone

from ..models import QueueEpoch
from ..queue import TimeoutQueue
from ..timers.kind import Kind
from ..timers.pausing import paused_names
from .compensation import CompensationScan

logger = logging.getLogger("order_timeout")


LOSSES = {
    "gone": "its epoch marker is gone",
    "moved": "another Redis server holds its epoch marker: restarted from a snapshot, or a replica "
             "promoted, it may have missed the last writes",
}
# Logged once a rebuild is done, with the number of members Redis lacked and the rebuild put back.
REBUILT = "Rebuilt the queue from the database: %d member(s) put back, the overdue due now."


def queue_name(queue: TimeoutQueue) -> str:
    return f"{queue.prefix}:{queue.kind}"


class QueueRecovery:
    """For one consumer: ``run()`` when a beat found an epoch marker missing; True once every
    queue is marked again (rebuilt if Redis lost it), False to try again at a later beat."""

    def __init__(self, queue: TimeoutQueue, queues: Sequence[TimeoutQueue], kinds: list[Kind]) -> None:
        self.queue = queue
        self.queues = list({queue_name(each): each for each in queues}.values())
        self.kinds = kinds
        # Each queue in a log line by its kind's name: close, reminders, notices, a timer's name.
        self.names = {kind.key_space: kind.label for kind in kinds}

    def run(self) -> bool:
        lost: list[tuple[TimeoutQueue, QueueEpoch, str]] = []
        # A marker is gone, so the flags may be too: a kind staff paused stays paused, its flags
        # set again first, before a rebuild puts its members back (a new queue gets them too).
        paused = paused_names()
        for queue in self.queues:
            if self.names.get(queue.kind) in paused:
                queue.set_paused(True)
        for queue in self.queues:
            row = QueueEpoch.objects.filter(queue=queue_name(queue)).first()
            if row is None:
                # A new queue: Redis says which epoch first (consumers starting together agree on
                # it), then the row remembers it where Redis cannot lose it.
                epoch = queue.claim_epoch(uuid.uuid4().hex)
                row, created = QueueEpoch.objects.get_or_create(queue=queue_name(queue),
                                                                defaults={"epoch": epoch})
                if created:
                    logger.info("Queue %s set up: epoch %s.", self.names.get(queue.kind, queue.kind), row.epoch)
            trouble = queue.epoch_trouble(row.epoch)
            if trouble is not None:
                lost.append((queue, row, trouble))
        if not lost:
            return True
        for queue, _, trouble in lost:
            logger.warning("Redis lost the queue %s (%s): rebuilding it from the database now.",
                           self.names.get(queue.kind, queue.kind), LOSSES[trouble])
        scan = CompensationScan(heal=True, full=True, grace=0, queue=self.queue, kinds=self.kinds)
        result = scan.run()
        if result.skipped or not result.locked or result.lock_lost:
            # Another consumer (or the scan) holds the lock, or Redis went again: a later beat retries.
            return False
        for queue, row, _ in lost:
            queue.mark_epoch(row.epoch)
            QueueEpoch.objects.filter(pk=row.pk).update(rebuilt_at=timezone.now(),
                                                        rebuilds=models.F("rebuilds") + 1)
        restored = sum(result.figures(kind).restored + result.figures(kind).reminders_restored
                       for kind in self.kinds)
        logger.warning(REBUILT, restored)
        return True
