"""The watch over the batch in hand: its database session limited, its leases kept or given up.

Around every act of a consumer (whatever the kind): the session the act runs
on is limited to ``BATCH_TIME_LIMIT`` (once per connection; behind a transaction
pooler, per transaction), and under ``run()`` the lease guard renews the
batch's leases while it works and gives it up when it overruns, and the
heartbeat records the session, for the consumer that finds this one dead to
end.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from django.db import connections

from ..db.session import limit_session, session_id, session_identity
from ..queue import Claim, TimeoutQueue
from .leases import LeaseGuard, WatchedBatch


class BatchWatch:
    def __init__(self, time_limit: float) -> None:
        self.time_limit = time_limit
        # Set by the consumer while it runs (no guard outside ``run()``: a test's single batch).
        self.guard: LeaseGuard | None = None
        # Told the session each batch runs on (the heartbeat records it, for whoever finds this
        # consumer dead to end: a frozen consumer's transaction would keep its rows locked).
        self.on_session: Callable[[str, str | None], None] | None = None
        self._limited: dict[str, Any] = {}
        # The batch watched last (None when the last batch ran with no guard).
        self.last: WatchedBatch | None = None
        self._identity: dict[str, str | None] = {}

    @contextmanager
    def watching(self, claim: Claim, queue: TimeoutQueue, using: str) -> Iterator[WatchedBatch | None]:
        connection = connections[using]
        connection.ensure_connection()
        if connection.connection is not self._limited.get(using):
            limit_session(connection, self.time_limit)
            self._limited[using] = connection.connection
            self._identity.pop(using, None)
        if self.on_session is not None:
            if using not in self._identity:
                self._identity[using] = session_identity(connection)
            self.on_session(using, self._identity[using])
        self.last = None
        if self.guard is None:
            yield None
            return
        batch: WatchedBatch | None = None
        try:
            with self.guard.watching(claim.token, claim.members, session_id(connection), using,
                                     queue=queue) as batch:
                self.last = batch
                yield batch
        finally:
            # The guard let go of it above: given_up is final. A session given up is being
            # ended (by the guard; behind a transaction pooler, by the server's limits):
            # what follows (dead letters, the next batch) needs a new one.
            if batch is not None and batch.given_up.is_set():
                connection.close()
