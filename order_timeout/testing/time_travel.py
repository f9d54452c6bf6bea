"""Moving time for the app's judgement of what is due, in a test: deadlines, reminders' leads, holds
and ``MAX_HOLD``, pauses.

The database's clock decides what is due, so freezing Python's clock moves nothing, and a test
cannot move the database server's. ``travel`` moves the app's reading of it instead: every read
of the database's clock by the app (the locking statement's, the scans', the pauses') is that
much ahead, and nothing else is (the rows, the server, Python's clock stay as they are)::

    with travel(minutes=20):
        run_due()            # what is due 20 minutes from now
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta

from django.db import router

from ..db.session import database_now, judge_ahead, judged_ahead


class TimersClock:
    """The clock the app judges by in a test: the database's, moved ahead by ``advance``."""

    def advance(self, delta: timedelta | None = None, **parts: float) -> None:
        """Move the app's clock ahead by ``delta``, or by ``timedelta(**parts)`` (``minutes=20``)."""
        step = (delta or timedelta(0)) + timedelta(**parts)
        if step < timedelta(0):
            raise ValueError(f"time moves ahead only (the database's clock never goes back): {step}")
        judge_ahead(judged_ahead() + step)

    @property
    def ahead(self) -> timedelta:
        """How far ahead of the database's clock the app judges now."""
        return judged_ahead()

    def now(self, using: str | None = None) -> datetime:
        """The moment the app judges by now: the database's clock (of ``using``), moved ahead."""
        from ..models import DeadLetter

        return database_now(using or router.db_for_write(DeadLetter))

    def reset(self) -> None:
        """Back to the database's own clock."""
        judge_ahead(timedelta(0))


clock = TimersClock()


@contextmanager
def travel(delta: timedelta | None = None, **parts: float) -> Iterator[TimersClock]:
    """Judge what is due ``delta`` (or ``timedelta(**parts)``) ahead for the block's time, then as before."""
    before = judged_ahead()
    clock.advance(delta, **parts)
    try:
        yield clock
    finally:
        judge_ahead(before)
