"""The command's consumer keeps Python's full garbage collections out of its batches.

What start-up allocated is frozen; CPython's automatic full pass is off while
the loop runs, and the consumer runs one itself between two batches, as often
as CPython would have at most; the thresholds and the frozen objects are given
back when the loop ends (order_timeout/collector.py).
"""

from __future__ import annotations

import gc

import pytest

from order_timeout.collector import NEVER

from .helpers import state

pytestmark = pytest.mark.django_db(transaction=True)


class Cycles:
    """A receiver that leaves cyclic garbage behind, so that the younger generations are collected
    often; it notes the third threshold and any full pass that starts while it runs."""

    def __init__(self) -> None:
        self.thresholds: list[int] = []
        self.full_passes_inside = 0
        self.inside = False

    def __call__(self, sender, order, **kwargs) -> None:
        self.inside = True
        try:
            self.thresholds.append(gc.get_threshold()[2])
            for _ in range(3000):
                loop: list[object] = []
                loop.append(loop)
        finally:
            self.inside = False

    def seen(self, phase: str, info: dict) -> None:
        if phase == "start" and info["generation"] == 2 and self.inside:
            self.full_passes_inside += 1


@pytest.fixture
def cycles(receiver):
    watcher = Cycles()
    receiver(watcher)
    gc.callbacks.append(watcher.seen)
    yield watcher
    gc.callbacks.remove(watcher.seen)


@pytest.fixture(autouse=True)
def full_pass_after():
    """What a consumer froze and gave back waits for the next full pass, which a test process may not
    run before its databases are dropped: run it now, so that garbage it holds (a finished thread's
    database connection) is closed first (seen: PostgreSQL refused to drop a test database)."""
    yield
    gc.collect()


def test_a_consumer_that_collects_between_batches_runs_no_full_collection_inside_one(
        cycles, make_order, consumer, queue):
    orders = [make_order(in_seconds=-1) for _ in range(120)]
    kept = gc.get_threshold()
    worker = consumer(batch_size=4, collects_between_batches=True)

    stats = worker.run(once=True)

    assert stats.closed == 120 and {state(order) for order in orders} == {"closed"}
    # Inside every batch CPython's full pass was off, and none started; the consumer ran them between.
    assert set(cycles.thresholds) == {NEVER} and cycles.full_passes_inside == 0
    assert worker.collections is not None and worker.collections.ran >= 1
    # Given back when the loop ended.
    assert gc.get_threshold() == kept and gc.get_freeze_count() == 0


def test_a_consumer_in_someone_elses_process_leaves_the_collector_alone(cycles, make_order, consumer, queue):
    make_order(in_seconds=-1)
    kept = gc.get_threshold()

    consumer().run(once=True)

    assert cycles.thresholds == [kept[2]] and gc.get_freeze_count() == 0


def test_the_command_runs_its_consumer_collecting_between_batches(make_order, queue, monkeypatch):
    from django.core.management import call_command

    from order_timeout.consumer import Consumer

    built = []
    real_init = Consumer.__init__

    def noting(self, *args, **kwargs):
        built.append(kwargs.get("collects_between_batches"))
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(Consumer, "__init__", noting)
    order = make_order(in_seconds=-1)

    call_command("run_timeout_consumer", "--once")

    assert built == [True] and state(order) == "closed"
