"""Emptying the app's queues, and only them, around a test.

A test that flushes the queue's Redis database (``FLUSHDB``) also empties
whatever else lives there; this deletes the app's own keys and nothing else,
for every kind (the order close, the reminders, each declared timer) and every
shard, whatever the database holds besides::

    @pytest.fixture(autouse=True)
    def empty_queues():
        from order_timeout.testing import empty_queues

        empty_queues()
        yield
        empty_queues()
"""

from __future__ import annotations

from ..queue import CLOSE, NOTICE, REMIND, TimeoutQueue


def empty_queues() -> None:
    """Delete every key the app keeps in Redis, under ``KEY_PREFIX``, and nothing else (nothing at
    all with ``TESTING_WITHOUT_REDIS``: there is no Redis to empty)."""
    from ..conf import settings
    from ..timers.registry import registry

    if settings.TESTING_WITHOUT_REDIS:
        return

    queue = TimeoutQueue.from_settings()
    for space in dict.fromkeys([CLOSE, REMIND, NOTICE, *(timer.key_space for timer in registry.declared())]):
        queue.of_kind(space).delete_all_keys()
