"""What the app gives a shop's own tests: ``order_timeout.testing``."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db


def test_empty_queues_deletes_the_apps_keys_and_nothing_else(redis_client, queue):
    from order_timeout.testing import empty_queues
    from order_timeout.timers.registry import registry

    lapses = queue.of_kind(registry.get("reservation-lapses").key_space)
    queue.schedule({"1": 1_000})
    lapses.schedule({"2": 1_000})
    redis_client.set("the-shops-own-key", "kept")

    empty_queues()

    assert queue.stats(0).pending == 0 and lapses.stats(0).pending == 0
    assert redis_client.get("the-shops-own-key") == b"kept"
