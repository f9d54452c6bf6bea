"""The fleet's housekeeping: the consumers run the compensation scan and the prune themselves, one
process at a time, whoever's turn comes first (Celery beat included), so no promise needs beat.

Seen before: with Redis down while a web request committed an order, the order's member never
reached Redis, and only the scan on Celery beat could close it; with beat down (or never set up),
nothing did, and nothing said the scan had stopped.
"""

from __future__ import annotations

import io
import json
import signal
import threading
import time
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import OperationalError, connections

from order_timeout.models import Order, Pause
from order_timeout.queue import TimeoutQueue
from order_timeout.reporting.housekeeping import last_runs
from order_timeout.scans import turns
from order_timeout.scans.compensation import CompensationScan
from order_timeout.scans.turns import PRUNE, SCAN, run_prune, run_scan, take_turn
from order_timeout.tasks import compensate as beat_task
from order_timeout.timers.pausing import pause
from order_timeout.timers.registry import registry

from .conftest import both_redis, wait_for
from .helpers import count_in, expiries, keys_for, score_of, state

pytestmark = pytest.mark.django_db(transaction=True)


def lost_member(queue: TimeoutQueue, order: Order) -> None:
    """The order committed, its member never reached Redis (Redis did not answer the save)."""
    member = str(order.pk)
    queue.client.zrem(keys_for(queue, member).pending, member)
    assert score_of(queue, member) is None


@pytest.fixture
def short_intervals(settings):
    """A scan due every 0.3 s, a prune every 0.3 s, every overdue row the scan's."""
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "COMPENSATION_INTERVAL": 0.3, "PRUNE_INTERVAL": 0.3,
                              "COMPENSATION_GRACE": 0}


def lock_lapsing_in(settings, seconds: float) -> None:
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "COMPENSATION_LOCK_SECONDS": seconds}


@both_redis
def test_a_scan_one_process_ran_is_not_due_for_another_until_its_interval_has_passed(queue, settings):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "COMPENSATION_INTERVAL": 3600}
    first = run_scan("consumer")
    again = run_scan("beat")

    assert first is not None and not first.skipped and again is None
    # An interval since it started, by the database's clock: here, an interval of a millisecond.
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "COMPENSATION_INTERVAL": 0.001}
    wait_for(lambda: run_scan("beat") is not None)
    runs = last_runs()
    assert runs[SCAN] is not None and runs[SCAN].runner == "beat" and runs[SCAN].complete


@both_redis
def test_a_turn_whose_runner_died_is_taken_by_the_next_once_its_lock_lapses(queue, short_intervals, settings):
    lock_lapsing_in(settings, 0.3)
    dead = take_turn(SCAN, "consumer", interval=0.3)  # taken, then its process was SIGKILLed
    assert dead is not None
    lock_lapsing_in(settings, 60)  # the next runner's

    assert take_turn(SCAN, "consumer", interval=0.3) is None  # its lock still lives
    wait_for(lambda: run_scan("consumer") is not None)  # and never recorded a complete run: due at once

    assert last_runs()[SCAN].complete


@both_redis
def test_a_runner_that_froze_past_its_lock_stops_and_records_nothing(queue, short_intervals, settings):
    lock_lapsing_in(settings, 0.3)
    frozen = take_turn(PRUNE, "consumer", interval=0.3)
    assert frozen is not None
    lock_lapsing_in(settings, 60)  # the next runner's
    time.sleep(0.35)  # frozen past its lock (SIGSTOP): the behaviour shown needs the lock to lapse
    after = run_prune("command", due_only=False)

    assert after is not None and after.complete
    assert frozen.renew() is False
    frozen.end(complete=True, figures={"deleted": 999})
    record = last_runs()[PRUNE]
    assert record.runner == "command" and record.figures["deleted"] == 0


def test_a_scan_that_failed_is_not_complete_and_the_next_turn_runs_it_at_once(queue, settings, monkeypatch):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "COMPENSATION_INTERVAL": 3600}

    def database_gone(self):
        raise OperationalError("the database went away")

    with monkeypatch.context() as patch:
        patch.setattr(CompensationScan, "run", database_gone)
        with pytest.raises(OperationalError):
            run_scan("consumer")

    assert last_runs()[SCAN].complete is False
    assert run_scan("consumer") is not None  # an hour's interval, yet due: nothing complete ran


@both_redis
def test_the_beat_task_does_nothing_while_a_consumer_ran_the_scan_this_interval(queue, make_order, settings):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "COMPENSATION_GRACE": 0}
    assert run_scan("consumer") is not None
    order = make_order(in_seconds=-5)
    lost_member(queue, order)

    assert beat_task()["not_due"] is True
    assert state(order) == "unpaid"  # the next turn closes it, an interval after the consumer's


@both_redis
def test_scans_by_beat_and_consumers_at_once_never_overlap_nor_repeat_within_an_interval(
        queue, short_intervals, monkeypatch):
    """Two consumers' housekeeping threads and a beat, each asking as often as it can for a second.

    Each run is timed where the promise is made: its start by the database's clock its turn was
    judged at (read through the real ``database_now_ms``), its work by the host's clock around the
    scan itself. Timing the askers' calls instead reads a thread's first connection as part of its
    run (seen in CI: a beat judged 0.3 s after a consumer looked 0.23 s after it).
    """
    judged_at = threading.local()
    runs: list[tuple[str, int, float, float]] = []
    lock = threading.Lock()
    real_now_ms, real_run = turns.database_now_ms, CompensationScan.run

    def now_ms_seen() -> int:
        judged_at.ms = real_now_ms()
        return judged_at.ms

    def run_timed(scan):
        started_ms, began = judged_at.ms, time.monotonic()
        try:
            return real_run(scan)
        finally:
            with lock:
                runs.append((threading.current_thread().name, started_ms, began, time.monotonic()))

    monkeypatch.setattr(turns, "database_now_ms", now_ms_seen)
    monkeypatch.setattr(CompensationScan, "run", run_timed)

    def ask(runner: str) -> None:
        # A second of asking, and on until three runs were seen (a loaded CI machine saw one scan
        # take half that second), never more than thirty.
        until, at_most = time.monotonic() + 1.2, time.monotonic() + 30
        try:
            while time.monotonic() < at_most and (time.monotonic() < until or len(runs) < 3):
                run_scan(runner) if runner != "beat" else beat_task()
                time.sleep(0.01)
        finally:
            connections.close_all()  # this thread's own: the test database is dropped after the test

    askers = [threading.Thread(target=ask, args=(runner,), name=f"{runner}-{number}")
              for number, runner in enumerate(("consumer", "consumer", "beat"))]
    for asker in askers:
        asker.start()
    for asker in askers:
        asker.join()

    runs.sort(key=lambda run: run[2])
    assert len(runs) >= 3, runs
    # Each run's work began after the one before it ended: the lock is taken before and given up after.
    for (_, _, _, ended), (_, _, began, _) in zip(runs, runs[1:], strict=False):
        assert began >= ended, runs
    # And each was judged due an interval (0.3 s) after the one before it began, by the database's clock.
    for (_, started_ms, _, _), (_, next_started_ms, _, _) in zip(runs, runs[1:], strict=False):
        assert next_started_ms - started_ms >= 300, runs


def test_a_pause_given_back_is_the_database_clocks_length_whatever_the_hosts_clocks(settings, monkeypatch):
    """Paused on a host whose clock runs an hour fast, resumed on one an hour slow: the time given
    back is what passed by the database's clock, not two hours off."""
    from django.utils import timezone as django_timezone

    from order_timeout.scans.giveback import resume_timers

    true_now = django_timezone.now
    known = [kind.label for kind in registry.kinds_for(None, None)]
    monkeypatch.setattr(django_timezone, "now", lambda: true_now() + timedelta(hours=1))
    pause(["close"], "PSP down", known=known)
    time.sleep(0.2)
    monkeypatch.setattr(django_timezone, "now", lambda: true_now() - timedelta(hours=1))
    ended, given = resume_timers(["close"], give_time_back=True)

    assert 0.2 <= given["close"].seconds < 5, given["close"].seconds
    row = Pause.objects.get()
    assert 0.2 <= (row.resumed_at - row.paused_at).total_seconds() < 5


def test_the_status_says_when_each_job_last_ran_and_fails_on_a_scan_too_old(queue):
    with pytest.raises(CommandError) as never:
        call_command("order_timeout_status", "--no-drift", "--max-scan-age", "600", stdout=io.StringIO())
    assert never.value.returncode == 2 and "no complete compensation scan is recorded" in str(never.value)

    run_scan("consumer")
    run_prune("consumer")
    out = io.StringIO()
    call_command("order_timeout_status", "--no-drift", "--max-scan-age", "600", stdout=out)
    lines = out.getvalue()
    assert "housekeeping (last runs" in lines
    assert "scan   started" in lines and "by consumer on" in lines and "complete" in lines
    assert "prune  started" in lines

    as_json = io.StringIO()
    call_command("order_timeout_status", "--no-drift", "--json", stdout=as_json)
    record = json.loads(as_json.getvalue())["housekeeping"]
    assert record["scan"]["runner"] == "consumer" and record["scan"]["where"] == turns.where()
    assert record["prune"]["complete"] is True

    time.sleep(0.05)
    with pytest.raises(CommandError) as old:
        call_command("order_timeout_status", "--no-drift", "--max-scan-age", "0.01", stdout=io.StringIO())
    assert old.value.returncode == 2 and "> --max-scan-age 0.01" in str(old.value)


def test_the_metrics_show_when_each_job_last_ran(queue):
    from prometheus_client import generate_latest

    from order_timeout.reporting.metrics import backlog_registry

    run_scan("consumer")
    text = generate_latest(backlog_registry()).decode()

    assert 'order_timeout_housekeeping_last_run_timestamp_seconds{job="scan"}' in text
    assert 'order_timeout_housekeeping_last_complete_run_timestamp_seconds{job="scan"}' in text


def test_the_prune_command_waits_for_no_one_but_never_runs_beside_another_prune(queue):
    running = take_turn(PRUNE, "consumer", interval=None)
    assert running is not None

    with pytest.raises(CommandError, match="Another prune runs now"):
        call_command("order_timeout_prune", stdout=io.StringIO())

    running.end(complete=True, figures={})
    out = io.StringIO()
    call_command("order_timeout_prune", stdout=out)  # its interval has not passed: by hand all the same
    assert out.getvalue().startswith("Deleted") and last_runs()[PRUNE].runner == "command"


# -- the promises, with consumers alone: no beat, no cron -------------------------------------------

HOUSEKEEPING_ENV = {"ORDER_TIMEOUT_COMPENSATION_INTERVAL": "1", "ORDER_TIMEOUT_COMPENSATION_GRACE": "0",
                    "ORDER_TIMEOUT_COMPENSATION_LOCK_SECONDS": "2", "ORDER_TIMEOUT_MAX_WAIT": "0.5"}


@both_redis
def test_consumers_alone_close_the_orders_whose_members_redis_never_got(consumer_process, make_order, queue):
    """The failed-write case, with no beat and no cron: overdue orders closed by the scan a consumer
    runs, an order due soon put back and closed at its deadline; each once."""
    overdue = [make_order(in_seconds=-5) for _ in range(5)]
    soon = make_order(in_seconds=2)
    for order in [*overdue, soon]:
        lost_member(queue, order)

    consumers = [consumer_process(env=HOUSEKEEPING_ENV, housekeeping=True) for _ in range(2)]

    wait_for(lambda: count_in(Order, "closed") == 6)
    assert [expiries(order) for order in [*overdue, soon]] == [1] * 6
    record = last_runs()[SCAN]
    assert record.runner == "consumer" and record.where.rsplit(":", 1)[1] in {str(c.proc.pid) for c in consumers}
    for consumer in consumers:  # its signal handlers are set once it says it runs
        consumer.wait_until(lambda consumer=consumer: "running" in consumer.out)
        consumer.signal(signal.SIGTERM)
    assert [consumer.wait()[0] for consumer in consumers] == [0, 0]


def test_a_consumer_started_with_no_housekeeping_leaves_the_scan_to_others(consumer_process, queue):
    quiet = consumer_process(env=HOUSEKEEPING_ENV)  # the fixture passes --no-housekeeping
    busy = consumer_process(env=HOUSEKEEPING_ENV, housekeeping=True)

    wait_for(lambda: (run := last_runs()[SCAN]) is not None and bool(run.complete))
    time.sleep(2.5)  # two more intervals: the quiet one had its chances to ask
    assert last_runs()[SCAN].where.endswith(f":{busy.proc.pid}")
    for consumer in (quiet, busy):
        consumer.wait_until(lambda consumer=consumer: "running" in consumer.out)
        consumer.signal(signal.SIGTERM)
        assert consumer.wait()[0] == 0


@pytest.mark.slow
def test_the_scans_runner_killed_and_the_next_frozen_a_third_finishes_and_nothing_closes_twice(
        consumer_process, make_order, queue):
    """Three consumers; the scan's runner SIGKILLed mid-scan, the next runner SIGSTOPped mid-scan: the
    third takes the scan over once the lock lapses (2 s) and closes the rest; the frozen one, let go,
    finds its turn gone and stops. Every order closed exactly once."""
    orders = [make_order(in_seconds=-5) for _ in range(60)]
    for order in orders:
        lost_member(queue, order)
    # Chunks of 5 orders, each order's receiver 50 ms: a scan takes a few seconds.
    env = {**HOUSEKEEPING_ENV, "ORDER_TIMEOUT_COMPENSATION_CHUNK": "5", "SHOP_DELAY_SECONDS": "0.05"}
    consumers = {c.proc.pid: c for c in (consumer_process(env=env, housekeeping=True) for _ in range(3))}

    def runner_now() -> int | None:
        run = last_runs()[SCAN]
        return None if run is None or run.ended is not None else int(run.where.rsplit(":", 1)[1])

    wait_for(lambda: runner_now() is not None and count_in(Order, "closed") > 0)
    killed = runner_now()
    consumers[killed].kill()
    wait_for(lambda: runner_now() not in (None, killed))
    frozen = runner_now()
    consumers[frozen].signal(signal.SIGSTOP)
    wait_for(lambda: runner_now() not in (None, killed, frozen))
    third = runner_now()

    consumers[frozen].signal(signal.SIGCONT)
    wait_for(lambda: count_in(Order, "closed") == len(orders))
    wait_for(lambda: (run := last_runs()[SCAN]) is not None and run.complete)
    assert last_runs()[SCAN].where.endswith(f":{third}") or last_runs()[SCAN].where.endswith(f":{frozen}")
    assert [expiries(order) for order in orders] == [1] * len(orders)
    for pid, consumer in consumers.items():
        if pid != killed:
            consumer.wait_until(lambda consumer=consumer: "running" in consumer.out)
            consumer.signal(signal.SIGTERM)
            assert consumer.wait()[0] == 0


# -- closes first: the consumer's scan keeps to a pace ------------------------------------------


class RecordedRests(threading.Event):
    """A stop that is never set and notes each rest the walk asks of it."""

    def __init__(self) -> None:
        super().__init__()
        self.rests: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.rests.append(timeout or 0.0)
        return False


def test_a_paced_scan_rests_after_every_chunk_and_acts_on_every_row(make_order, queue, settings):
    """The consumer's housekeeping thread walks at a pace (``housekeeper.PACE``): it rests after each
    chunk, so the closes beside it keep the CPU and the interpreter's lock (docs/benchmarks.md
    measures what the rest buys); it reads and restores every row all the same."""
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "COMPENSATION_CHUNK": 2}
    orders = [make_order(in_seconds=60) for _ in range(5)]
    for order in orders:
        lost_member(queue, order)
    stop = RecordedRests()

    result = CompensationScan(heal=True, stop=stop, pace=0.5).run()

    assert result.restored == 5 and result.examined >= 5
    assert len(stop.rests) >= 3 and all(rest > 0 for rest in stop.rests)  # one before each of the 3 chunks
    assert all(score_of(queue, str(order.pk)) is not None for order in orders)


def test_an_unpaced_scan_never_rests(make_order, queue, settings):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "COMPENSATION_CHUNK": 2}
    for _ in range(5):
        make_order(in_seconds=60)
    stop = RecordedRests()

    CompensationScan(heal=True, stop=stop).run()

    assert stop.rests == []


@pytest.mark.parametrize("pace", [0, -0.5, 1.5])
def test_a_pace_outside_zero_to_one_is_refused(pace):
    with pytest.raises(ValueError, match="pace must be in"):
        CompensationScan(heal=True, pace=pace)
