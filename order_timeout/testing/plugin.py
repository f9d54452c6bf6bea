"""The pytest plugin installing the app brings (``pytest11`` entry point): the testing kit as
fixtures. Nothing here imports Django until a fixture is used, so a project that does not
configure Django, or does not use them, pays nothing.

- ``timeout_runner``: ``run_due`` (call it: ``timeout_runner()``, ``timeout_runner("reminders")``),
  the app's Redis keys emptied before and after the test (with a Redis);
- ``timeout_clock``: the clock the app judges by (``timeout_clock.advance(minutes=20)``), back
  to the database's own after the test;
- ``timeout_outbox``: every notice handler delivers to it during the test
  (``timeout_outbox.delivered``, ``timeout_outbox.pending()``).

Each takes the database as the test asked for it (``django_db``, with or without
``transaction=True``); they do not ask for it themselves.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from .runner import Ran
    from .seeing import Outbox
    from .time_travel import TimersClock


@pytest.fixture
def timeout_runner() -> Iterator[Callable[..., Ran]]:
    """``run_due``: acts on everything due (or the timers named), as a consumer would."""
    from . import empty_queues, run_due

    empty_queues()
    yield run_due
    empty_queues()


@pytest.fixture
def timeout_clock() -> Iterator[TimersClock]:
    """The app's clock for the test: the database's, moved ahead by ``advance``; reset after."""
    from . import clock

    clock.reset()
    yield clock
    clock.reset()


@pytest.fixture
def timeout_outbox() -> Iterator[Outbox]:
    """The notices delivered during the test, to this local outbox instead of their targets."""
    from . import capture_notices

    with capture_notices() as outbox:
        yield outbox
