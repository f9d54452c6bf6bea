"""The promises, proven once for every kind of timer on the one lifecycle.

Each test runs over the kinds of the test project (``tests/kinds.py``): the
order close (on the app's ``Order`` and the shop's ``ShopOrder``), the
reminders, and the shop's declared ``reservation-lapses``,
``complete-after-delivery`` and ``plain-order-payment``. Then one test per
decision the lifecycle took once for every kind (``timers/lifecycle.py``,
``timers/acting.py``): the takeover limit after reading, the one-by-one
fallback, a lock conflict or a lost connection as the database's error, and
the watchdog petted after each row.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.urls import reverse
from django.utils import timezone

from order_timeout.conf import settings as order_settings
from order_timeout.consumer import Consumer, ConsumerStats
from order_timeout.models import DeadLetter
from order_timeout.scans import walks
from order_timeout.scans.compensation import compensate
from order_timeout.timers.acting import act_on
from order_timeout.timers.lifecycle import BUSY_RETRY_MS
from order_timeout.timers.members import now_score
from order_timeout.timers.outcome import Report
from testproject.shop.models import StockRecord

from .conftest import Clock, both_redis, running, wait_for
from .helpers import (
    INNODB_TRX_POLL,
    claim_everywhere,
    claim_next,
    end_own_session,
    hash_size,
    keys_for,
    leased_members,
    lose_redis_data,
    open_transactions_elsewhere,
    pending_count,
    score_of,
)
from .holding import row_locked_elsewhere
from .kinds import CASES, DEAD_LETTER_KINDS, EVERY_KIND, ONE_MODEL_EACH, Case

pytestmark = pytest.mark.django_db(transaction=True)

every_kind = pytest.mark.parametrize("case", EVERY_KIND, indirect=True)
dead_letter_kinds = pytest.mark.parametrize("case", DEAD_LETTER_KINDS, indirect=True)
one_model_each = pytest.mark.parametrize("case", ONE_MODEL_EACH, indirect=True)
alone_or_in_a_batch = pytest.mark.parametrize("size", [1, 3], ids=["alone", "in-a-batch"])


@pytest.fixture
def case(request: pytest.FixtureRequest, redis_backend: str, settings: Any, clock: Clock,
         monkeypatch: pytest.MonkeyPatch) -> Iterator[Case]:
    """The kind a test is parametrised with, set up on the test's settings and Redis.

    ``redis_backend`` first: what the case sets in ``settings`` is undone before the cluster's
    override is, or the cluster's settings would outlive the test."""
    made = CASES[request.param](settings, clock, monkeypatch)
    yield made
    made.close()


class StockServiceDown(Exception):
    pass


def counts(stats: ConsumerStats, case: Case) -> Report:
    """A consumer's totals for the case's kind, in the lifecycle's words."""
    return stats.of(case.kind.name).report


def quiet(case: Case) -> bool:
    """Nothing of the kind left in Redis: nothing pending, leased or in backoff."""
    queue = case.queue
    return pending_count(queue) == 0 and leased_members(queue) == [] and hash_size(queue, "attempts") == 0


def raising_for(*rows: Any) -> Callable[[Any], None]:
    """A receiver that raises for these rows (and for those added to its ``failing`` later)."""
    failing = {row.pk for row in rows}

    def release_stock(row: Any) -> None:
        if row.pk in failing:
            raise StockServiceDown(f"cannot release the stock of {row.pk}")

    release_stock.failing = failing  # type: ignore[attr-defined]
    return release_stock


def from_score(ms: int) -> datetime:
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms)


def quarantined(case: Case) -> list[bytes]:
    queue = case.queue
    return sorted(member for shard in queue.shards for member in queue.client.zrange(shard.keys.quarantine, 0, -1))


def post_action(client: Any, action: str, letter: DeadLetter) -> Any:
    return client.post(reverse("admin:order_timeout_deadletter_changelist"),
                       {"action": action, "_selected_action": [letter.pk]}, follow=True)


# -- exactly once ------------------------------------------------------------------------------


@both_redis
@every_kind
def test_racing_consumers_act_on_every_row_exactly_once(case):
    rows = case.make(30)
    workers = [Consumer(batch_size=7, kinds=[case.kind]) for _ in range(3)]

    with ExitStack() as racing:
        for worker in workers:
            racing.enter_context(running(worker))
        wait_for(lambda: case.acted(rows) == len(rows) and quiet(case))

    assert case.effects(rows) == [1] * len(rows)
    assert sum(counts(worker.stats, case).acted for worker in workers) == len(rows)
    assert sum(counts(worker.stats, case).failed for worker in workers) == 0


# -- a settled row is never acted on -------------------------------------------------------------


@every_kind
def test_a_settled_row_is_never_acted_on(case, consumer):
    rows = case.make(3)
    settled = rows[1]
    case.settle(settled)  # behind the app's back: Redis still holds its member

    stats = consumer(kinds=[case.kind]).run(once=True)

    assert case.acted(rows) == 2 and case.acted([settled]) == 0
    assert case.effects(rows) == [1, 0, 1]
    assert counts(stats, case).settled == 1
    assert quiet(case)


@every_kind
def test_a_row_settled_after_its_claim_is_never_acted_on(case, consumer, clock):
    (row,) = case.make(1)
    worker = consumer(kinds=[case.kind])
    claim = claim_next(worker, clock())
    assert claim.members == [case.member(row)]

    case.settle(row)
    report = worker.process(claim, clock())
    worker.flush_acks()

    assert case.acted([row]) == 0 and case.effects([row]) == [0]
    assert (report.acted, report.settled) == (0, 1)
    assert quiet(case)


@every_kind
def test_a_row_found_settled_is_no_longer_overdue(case, consumer, clock):
    """Once a consumer found it settled, neither the scan nor ``--max-overdue`` counts it."""
    (row,) = case.make(1)
    case.settle(row)

    consumer(kinds=[case.kind]).run(once=True)

    assert walks.count(case.kind, before=clock() + timedelta(hours=1)) == 0
    past_the_grace = clock() + timedelta(seconds=order_settings.COMPENSATION_GRACE + 1)
    assert compensate(now=past_the_grace).figures(case.kind).examined == 0


# -- the database's clock decides -----------------------------------------------------------------


@every_kind
def test_a_consumer_whose_clock_runs_20s_fast_acts_on_nothing_early(case):
    (row,) = case.make(1, at=timezone.now() + timedelta(seconds=5))
    fast = lambda: timezone.now() + timedelta(seconds=20)  # noqa: E731
    worker = Consumer(now=fast, kinds=[case.kind])

    # Before it has heard from the database it claims early, and the database refuses...
    first = worker.run_once()
    # ...and from that batch on it claims by the database's time: no second early claim, no spin.
    second = worker.run_once()

    assert first.members == [case.member(row)] and counts(worker.stats, case).acted == 0
    assert second.members == [] and worker.stats.batches == 1
    assert timedelta(seconds=-21) < worker.clock_offset <= timedelta(seconds=-20)
    assert counts(Consumer(now=fast, kinds=[case.kind]).run(once=True), case).claimed == 0
    assert case.acted([row]) == 0 and case.effects([row]) == [0]
    assert score_of(case.queue, case.member(row)) == case.score(row)  # waiting for its own moment


# -- a row locked elsewhere --------------------------------------------------------------------------


@every_kind
def test_a_row_locked_by_another_transaction_is_skipped_as_busy_and_acted_on_once_free(case, consumer, clock):
    rows = case.make(3)
    held = rows[1]

    with row_locked_elsewhere(case.model, held.pk):
        stats = consumer(kinds=[case.kind]).run(once=True)

    assert case.acted(rows) == 2 and case.acted([held]) == 0
    report = counts(stats, case)
    assert (report.acted, report.busy, report.failed) == (2, 1, 0)
    assert score_of(case.queue, case.member(held)) == now_score(clock()) + BUSY_RETRY_MS
    clock.advance(BUSY_RETRY_MS / 1000)
    consumer(kinds=[case.kind]).run(once=True)
    assert case.acted(rows) == 3 and case.effects(rows) == [1, 1, 1]
    assert quiet(case)


# -- a receiver that raises ----------------------------------------------------------------------


@every_kind
def test_a_raising_receiver_fails_its_row_alone_which_is_retried_after_each_delay_then_given_up(
        case, consumer, clock, settings):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "RETRY_DELAYS": [1, 2]}
    rows = case.make(3)
    unlucky = rows[1]
    member = case.member(unlucky)
    case.on_each_row(raising_for(unlucky))
    worker = consumer(kinds=[case.kind])

    worker.run(once=True)
    assert case.acted(rows) == 2 and case.effects(rows) == [1, 0, 1]
    waits = []
    for tries, delay in enumerate((1, 2), start=1):
        waits.append(score_of(case.queue, member) - now_score(clock()))
        clock.advance(delay - 0.001)
        worker.run(once=True)  # not yet: the retry waits its delay
        assert counts(worker.stats, case).failed == tries
        clock.advance(0.001)
        worker.run(once=True)

    assert waits == [1000, 2000]
    report = counts(worker.stats, case)
    assert (report.acted, report.failed, report.given_up) == (2, 3, 1)
    assert case.given_up(unlucky)
    assert case.acted([unlucky]) == 0 and case.effects([unlucky]) == [0]
    assert quiet(case)


@every_kind
def test_a_receiver_that_raises_system_exit_fails_its_row_alone_and_the_consumer_lives_on(
        case, consumer, settings):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "RETRY_DELAYS": []}
    rows = case.make(3)
    unlucky = rows[1]

    def exit_for_the_unlucky(row: Any) -> None:
        if row.pk == unlucky.pk:
            raise SystemExit(1)

    case.on_each_row(exit_for_the_unlucky)

    stats = consumer(kinds=[case.kind]).run(once=True)  # returns: the process lives on

    assert case.acted(rows) == 2 and case.effects(rows) == [1, 0, 1]
    report = counts(stats, case)
    assert (report.acted, report.failed, report.given_up) == (2, 1, 1)
    assert case.given_up(unlucky)
    assert quiet(case)


@pytest.fixture
def dead_letter(case, consumer, settings):
    """A due row whose act failed once with no retry left: (row, its dead letter). Its receiver is
    healed afterwards, so what staff do next succeeds."""
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "RETRY_DELAYS": []}
    (row,) = case.make(1)
    receiver = raising_for(row)
    case.on_each_row(receiver)
    consumer(kinds=[case.kind]).run(once=True)
    receiver.failing.clear()
    return row, DeadLetter.objects.get()


@dead_letter_kinds
def test_a_dead_letter_names_its_kind_and_requeued_from_the_admin_its_row_is_acted_on(
        case, dead_letter, consumer, admin_client):
    row, letter = dead_letter
    assert (letter.timer, letter.order_model, letter.order_id) == (case.kind.name, case.label, str(row.pk))
    assert letter.error_type.endswith("StockServiceDown")

    response = post_action(admin_client, "requeue", letter)

    assert "1 order requeued." in response.text
    consumer(kinds=[case.kind]).run(once=True)
    assert case.acted([row]) == 1 and case.effects([row]) == [1]
    letter.refresh_from_db()
    assert letter.resolution == DeadLetter.Resolution.REQUEUED
    assert quiet(case)


@dead_letter_kinds
def test_a_dead_letters_row_is_acted_on_now_from_the_admin(case, dead_letter, admin_client):
    row, letter = dead_letter

    response = post_action(admin_client, "close_now", letter)

    assert "1 order closed." in response.text
    assert case.acted([row]) == 1 and case.effects([row]) == [1]
    letter.refresh_from_db()
    assert letter.resolution == DeadLetter.Resolution.CLOSED


# -- Redis loses its data --------------------------------------------------------------------------


@both_redis
@every_kind
def test_after_redis_lost_its_data_the_rebuild_puts_every_row_back_and_they_are_acted_on(case, redis_backend):
    # Due in three seconds: ahead of the rebuild (a loaded CI machine took over a second to make the
    # rows, empty the cluster and rebuild, and the rows were overdue by then), and soon due by the
    # database's clock.
    rows = case.make(3, at=timezone.now() + timedelta(seconds=3))
    later = case.make(1, at=timezone.now() + timedelta(minutes=10))
    lose_redis_data(case.queue)  # Redis restarted without persistence

    result = compensate(rebuild=True)

    assert case.restored(result) == 4
    assert [score_of(case.queue, case.member(row)) for row in [*rows, *later]] == [
        case.score(row) for row in [*rows, *later]]
    wait_for(lambda: timezone.now() > max(case.moment(row) for row in rows))
    Consumer(kinds=[case.kind]).run(once=True)
    assert case.acted(rows) == 3 and case.effects(rows) == [1, 1, 1]
    assert case.acted(later) == 0


@every_kind
def test_after_redis_lost_its_data_the_scan_acts_on_every_overdue_row_past_the_grace(case, clock):
    """Past its deadline a reminder is moot: the scan sends none (the rebuild restores those
    still ahead); every other kind's overdue rows are acted on, once."""
    rows = case.make(3)
    lose_redis_data(case.queue)

    within_grace = compensate(now=clock())
    assert case.acted(rows) == 0 and case.scan_acted(within_grace) == 0
    result = compensate(now=clock() + timedelta(seconds=order_settings.COMPENSATION_GRACE + 1))

    acts = int(case.scanned_when_overdue)
    assert case.scan_acted(result) == 3 * acts
    assert case.acted(rows) == 3 * acts and case.effects(rows) == [acts] * 3
    assert quiet(case)


# -- (a) the takeover limit is checked after the members are read -----------------------------------


@every_kind
def test_past_the_takeover_limit_an_unreadable_member_is_quarantined_a_readable_one_given_up_untried(
        case, consumer, clock):
    (row,) = case.make(1)
    queue = case.queue
    stranger = "not-a-member"
    queue.schedule({stranger: now_score(clock()) - 10})
    for member in (case.member(row), stranger):
        queue.client.hset(keys_for(queue, member).takeovers, member, order_settings.MAX_TAKEOVERS)
    # Their last holder died with them: leased, the lease run out.
    claim_everywhere(queue, now_score(clock()), 10, now_score(clock()) - 1, "a-consumer-that-died")
    ran: list[Any] = []
    case.on_each_row(ran.append)

    stats = consumer(kinds=[case.kind]).run(once=True)

    assert quarantined(case) == [stranger.encode()]
    assert ran == [] and case.acted([row]) == 0 and case.effects([row]) == [0]
    assert case.given_up(row)
    assert not DeadLetter.objects.filter(order_id=stranger).exists()
    report = counts(stats, case)
    assert (report.given_up, report.dropped, report.acted) == (1, 1, 0)
    assert quiet(case)


# -- (b) a batch that fails as a whole is acted on row by row ----------------------------------------


@every_kind
def test_a_batch_that_fails_as_a_whole_is_acted_on_row_by_row_so_only_the_failing_row_fails(
        case, consumer, caplog):
    rows = case.make(3)
    unlucky = rows[1]
    case.refuse_in_batch(unlucky)  # a batch-level step: fire(), orders_expired, the batch's INSERT

    with caplog.at_level(logging.WARNING, logger="order_timeout"):
        stats = consumer(kinds=[case.kind]).run(once=True)

    assert "a batch of 3 failed as a whole" in caplog.text
    assert case.acted(rows) == 2 and case.acted([unlucky]) == 0
    assert case.effects(rows) == [1, 0, 1]
    report = counts(stats, case)
    assert (report.acted, report.failed) == (2, 1)


# -- (c) a lock conflict or a lost connection in a receiver is the database's error --------------------


@alone_or_in_a_batch
@every_kind
def test_a_lock_conflict_inside_a_receiver_is_tried_again_and_not_counted_failed(
        case, consumer, settings, caplog, size):
    # A failure would wait an hour: acting on the rows within the test means none was counted.
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "RETRY_DELAYS": [3600]}
    rows = case.make(size)
    contested = StockRecord.objects.create(num_in_stock=10)
    holder = ExitStack()
    holder.enter_context(row_locked_elsewhere(StockRecord, contested.pk))  # a checkout holds the stock
    tries: list[Any] = []

    def release_stock(row: Any) -> None:
        tries.append(row.pk)
        if len(tries) > 1:
            holder.close()  # the checkout commits after the first try met its lock
        # NOWAIT: the database's lock conflict at once (MariaDB 1205, PostgreSQL 55P03).
        StockRecord.objects.select_for_update(nowait=True).get(pk=contested.pk)

    case.on_each_row(release_stock)
    try:
        with caplog.at_level(logging.INFO, logger="order_timeout"):
            stats = consumer(kinds=[case.kind]).run(once=True)
    finally:
        holder.close()

    assert "Lock conflict while" in caplog.text
    assert case.acted(rows) == size and case.effects(rows) == [1] * size
    assert counts(stats, case).failed == 0 and not DeadLetter.objects.exists()
    assert quiet(case)


@alone_or_in_a_batch
@every_kind
def test_a_lost_connection_inside_a_receiver_is_the_databases_error_and_not_counted_failed(
        case, consumer, settings, size):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "RETRY_DELAYS": [3600]}
    rows = case.make(size)
    lost: list[Any] = []

    def lose_the_connection_once(row: Any) -> None:
        if not lost:
            lost.append(row.pk)
            end_own_session()  # a DBA's KILL, a failover, a proxy restart

    case.on_each_row(lose_the_connection_once)

    stats = consumer(kinds=[case.kind]).run(once=True)

    assert lost
    assert counts(stats, case).failed == 0
    assert case.acted(rows) == size and case.effects(rows) == [1] * size
    assert quiet(case)


# -- (d) every act pets the watchdog after each row's receivers ---------------------------------------


@every_kind
def test_every_act_pets_the_watchdog_after_each_rows_receivers(case):
    """What the scan's watchdog (``CompensationScan(exit_when_stuck=True)``) is petted by: a slow
    chunk of healthy rows is progress, one row stuck in its receivers is not. A declared timer's
    receiver is its batch's ``fire()``: petted after it (docs/design.md, "One lifecycle", 4)."""
    rows = case.make(3)
    ran: list[Any] = []
    petted: list[int] = []
    case.on_each_row(lambda row: ran.append(row.pk))

    outcome = act_on(case.kind, [case.key(row) for row in rows], progress=lambda: petted.append(len(ran)))

    assert sorted(outcome.acted) == sorted(case.key(row) for row in rows)
    # After each row's receivers, not once for the batch; after the batch's fire() for a declared timer.
    assert petted == ([3] if case.receivers_per_batch else [1, 2, 3])


# -- consumers as processes ---------------------------------------------------------------------------


def started(process: Any) -> bool:
    return "running" in process.out


@pytest.mark.slow
@both_redis
@one_model_each
def test_racing_consumer_processes_act_on_every_row_exactly_once(case, consumer_process):
    count = 150
    racers = [consumer_process("--batch-size", "20", env=case.env) for _ in range(3)]
    for racer in racers:
        racer.wait_until(lambda racer=racer: started(racer))
    rows = case.make(count)

    wait_for(lambda: case.acted(rows) == count and quiet(case))
    for racer in racers:
        racer.signal(signal.SIGTERM)
    results = [racer.wait() for racer in racers]

    assert [code for code, _, _ in results] == [0, 0, 0], [err for _, _, err in results]
    assert case.effects(rows) == [1] * count
    # Each act committed once, by the one process whose log counts it.
    assert sum(case.logged_acts(err) for _, _, err in results) == count


@pytest.mark.slow
@one_model_each
def test_a_consumer_killed_mid_batch_loses_nothing_its_rows_are_acted_on_after_the_lease(
        case, consumer_process, tmp_path):
    rows = case.make(5)
    with case.stalled(tmp_path) as stall:
        victim = consumer_process("--batch-size", "10", env={**case.env, **stall.env})
        victim.wait_until(stall.inside)  # inside its act, the rows locked
        victim.kill()
    wait_for(lambda: open_transactions_elsewhere() == 0, interval=INNODB_TRX_POLL)  # rolled back

    claimed = leased_members(case.queue)
    assert claimed == sorted(case.member(row) for row in rows)
    assert case.acted(rows) == 0 and case.effects(rows) == [0] * 5
    leases = [where.lease_ms for where in case.queue.positions(claimed).values()]
    assert all(lease is not None for lease in leases)
    within_lease = Consumer(now=Clock(from_score(min(leases) - 1)), follow_database_clock=False,
                            kinds=[case.kind]).run(once=True)
    assert counts(within_lease, case).claimed == 0 and leased_members(case.queue) == claimed
    after_lease = Consumer(now=Clock(from_score(max(leases) + 1)), follow_database_clock=False,
                           kinds=[case.kind]).run(once=True)

    assert counts(after_lease, case).acted == 5
    assert case.acted(rows) == 5 and case.effects(rows) == [1] * 5
    assert quiet(case)

