"""The lease guard: it keeps a batch's leases, gives an overrunning batch up, and never dies quietly."""

from __future__ import annotations

import logging
import threading

import pytest

from order_timeout.queue import TimeoutQueue
from order_timeout.timers.leases import LeaseGuard
from order_timeout.timers.members import now_score
from order_timeout.timers.registry import REMINDERS

from .conftest import wait_for
from .helpers import claim_everywhere

pytestmark = pytest.mark.django_db(transaction=True)


def test_ending_a_given_up_session_does_not_hold_up_the_batchs_exit(queue):
    """The guard ends the session of a batch it gave up on a connection of its own; connecting
    may take long (a struggling database). The batch leaving meanwhile must not wait for it."""
    ending, may_end = threading.Event(), threading.Event()

    def slow_end_session(using: str, session: object) -> bool:
        ending.set()
        may_end.wait(30)  # the database takes its time to answer
        return True

    guard = LeaseGuard(queue, 0.2, now_score_now, end_session=slow_end_session)
    left = threading.Event()

    def batch() -> None:
        with guard.watching("a-token", ["1"], 12345, "default") as watched:
            wait_for(lambda: watched.given_up.is_set() and ending.is_set(), timeout=20)
        left.set()

    worker = threading.Thread(target=batch)
    worker.start()
    try:
        assert left.wait(20), "the batch waited for the guard to end its session"
    finally:
        may_end.set()
        worker.join(10)
        guard.close()


def test_an_unexpected_error_in_the_guard_is_logged_and_the_guard_goes_on(make_order, queue, caplog):
    """Anything raised in the guard's thread (here its clock, once) must not end its watch:
    the batch that overruns later is still given up and handed over."""
    order = make_order(in_seconds=-1)
    token = "a-batch"
    claim_everywhere(queue, now_score_now(), 1, now_score_now() + 30_000, token)
    failures = []

    def clock_ms() -> int:
        if not failures:
            failures.append(1)
            raise OverflowError("a clock that went wrong once")
        return now_score_now()

    guard = LeaseGuard(queue, 0.6, clock_ms)
    with caplog.at_level(logging.ERROR, logger="order_timeout"):
        try:
            with guard.watching(token, [str(order.pk)], None, "default") as batch:
                wait_for(batch.given_up.is_set, timeout=20)
        finally:
            guard.close()

    assert failures == [1]
    assert "OverflowError: a clock that went wrong once" in caplog.text
    assert queue.positions([str(order.pk)])[str(order.pk)].lease_ms <= now_score_now()



def test_leases_it_can_neither_renew_nor_hand_over_are_logged_naming_their_kind(private_redis, caplog):
    """Redis gone under a batch of reminders: each line says whose leases, why, and what happens next."""
    queue = TimeoutQueue.from_settings()
    reminders = queue.of_kind(REMINDERS.key_space)
    private_redis.stop()
    guard = LeaseGuard(queue, 0.6, now_score_now)

    def said(text: str) -> list[str]:
        return [record.getMessage() for record in caplog.records if text in record.getMessage()]

    with caplog.at_level(logging.WARNING, logger="order_timeout"):
        try:
            with guard.watching("a-token", ["1"], None, "default", queue=reminders) as batch:
                wait_for(lambda: batch.given_up.is_set() and said("the batch given up"))
        finally:
            guard.close()

    renewals, = set(said("the batch in hand"))
    assert renewals.startswith("reminders: could not renew the leases of the batch in hand (")
    assert renewals.endswith("); trying again every 0.2s; once they run out, another consumer may take the "
                             "batch over.")
    handing_over, = said("the batch given up")
    assert handing_over.startswith("reminders: could not hand over the leases of the batch given up (")
    assert handing_over.endswith("); its members are taken over once their leases run out.")


def now_score_now() -> int:
    from django.utils import timezone

    return now_score(timezone.now())
