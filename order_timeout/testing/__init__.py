"""For a shop's own tests: its timers tested as easily as the rest of its code (docs/testing.md).

In the test style the project already uses (Django's ``TestCase``, pytest-django's default
``django_db``, or ``transaction=True``), with or without a Redis::

    from order_timeout.testing import run_due, travel

    def test_an_unpaid_order_is_closed_after_its_deadline(self):
        order = checkout()                      # its deadline 15 minutes from now
        with travel(minutes=20):
            ran = run_due()                     # everything due, as a consumer would
        order.refresh_from_db()
        assert order.status == "closed" and ran.acted == 1

Installing the app installs a pytest plugin (``order_timeout.testing.plugin``) with the same as
fixtures: ``timeout_runner``, ``timeout_clock``, ``timeout_outbox``. The names below are imported
when first used: pytest loads the plugin before Django is set up.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .queues import empty_queues
    from .runner import Ran, run_due, tell_redis_now
    from .seeing import Outbox, capture_notices, queued_deadline, refused_writes
    from .time_travel import TimersClock, clock, travel

_WHERE = {"empty_queues": "queues", "Ran": "runner", "run_due": "runner", "tell_redis_now": "runner",
          "Outbox": "seeing", "capture_notices": "seeing", "queued_deadline": "seeing", "refused_writes": "seeing",
          "TimersClock": "time_travel", "clock": "time_travel", "travel": "time_travel"}

__all__ = ["Outbox", "Ran", "TimersClock", "capture_notices", "clock", "empty_queues", "queued_deadline",
           "refused_writes", "run_due", "tell_redis_now", "travel"]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f".{_WHERE[name]}", __name__), name)
    globals()[name] = value
    return value
