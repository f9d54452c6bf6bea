"""Claim -> close -> ack in one process, stepped by a hand-moved clock."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import Counter
from contextlib import contextmanager
from datetime import timedelta

import pytest
from django.conf import settings as django_settings
from django.db import DatabaseError, connection, connections, transaction
from django.utils import timezone
from redis import Redis

from order_timeout import schedule
from order_timeout.conf import settings as order_settings
from order_timeout.consumer import Consumer
from order_timeout.exceptions import OrderClosed
from order_timeout.models import Order
from order_timeout.queue import TimeoutQueue
from order_timeout.queue.wakeups import WakeListener
from order_timeout.reporting.metrics import ConsumerMetrics
from order_timeout.scheduling import order_kinds
from order_timeout.signals import order_expired, orders_expired
from order_timeout.timers.members import deadline_score, now_score
from testproject.shop.models import Expiry, Purchase

from .conftest import Clock, PrivateRedis, both_models, both_redis, finish, running, time_left, wait_for
from .helpers import (
    INNODB_TRX_POLL,
    Traffic,
    claim_everywhere,
    claim_next,
    cut_off_subscribers,
    end_own_session,
    expiries,
    hash_size,
    leased_members,
    lock_waits,
    pending_count,
    recording_pool,
    score_of,
    set_state,
    state,
)
from .holding import row_locked_elsewhere

pytestmark = pytest.mark.django_db(transaction=True)


@both_redis
@both_models
def test_due_order_is_closed_with_reason_timeout_and_signal_fired_once(consumer, make_order, queue, clock):
    order = make_order(in_seconds=-1)

    stats = consumer().run(once=True)

    order.refresh_from_db()
    assert state(order) == "closed"
    assert order.close_reason == "timeout"
    # Stamped by the database's clock, which decided it was due.
    assert order.expires_at <= order.closed_at <= timezone.now() + timedelta(seconds=1)
    assert expiries(order) == 1
    assert stats.closed == 1
    assert leased_members(queue) == [] and pending_count(queue) == 0


@both_models
def test_order_not_yet_due_is_left_alone(consumer, make_order, queue):
    order = make_order(in_seconds=5)

    consumer().run(once=True)

    order.refresh_from_db()
    assert state(order) == "unpaid"
    assert score_of(queue, str(order.pk)) == deadline_score(order.expires_at)


@both_redis
@both_models
def test_expired_order_is_closed_exactly_once_even_when_claimed_again(consumer, make_order, queue, clock):
    order = make_order(in_seconds=-1)
    first = consumer()
    first.run(once=True)
    # A stale member (say, a ZADD replayed after the close) comes back.
    queue.schedule({str(order.pk): now_score(clock())})

    consumer().run(once=True)

    assert expiries(order) == 1
    assert pending_count(queue) == 0 and leased_members(queue) == []


@both_redis
@both_models
def test_paid_order_is_never_closed_when_paid_after_claim(consumer, make_order, order_model, queue,
                                                         clock):
    """Seed pitfall 2: the member is still in Redis, but the row says paid."""
    order = make_order(in_seconds=-1)
    worker = consumer()
    claim = claim_next(worker, clock())
    assert claim.members == [str(order.pk)]

    order_model.objects.get(pk=order.pk).mark_paid()
    worker.process(claim, clock())
    worker.flush_acks()

    assert state(order) == "paid"
    assert expiries(order) == 0
    assert leased_members(queue) == []


@both_models
def test_pitfall_2_paid_order_whose_zrem_was_lost_is_never_closed(consumer, make_order, queue):
    """Seed pitfall 2, the other way round: ZREM never reached Redis."""
    order = make_order(in_seconds=-1)
    set_state(order, "paid")

    stats = consumer().run(once=True)

    assert state(order) == "paid"
    assert stats.skipped_paid == 1 and expiries(order) == 0
    assert leased_members(queue) == []


@both_models
def test_pitfall_5_extended_deadline_after_claim_is_not_closed_but_rescheduled(
        consumer, make_order, order_model, queue, clock):
    """Seed pitfall 5: the customer got more time while the member was in flight."""
    order = make_order(in_seconds=-1)
    worker = consumer()
    claim = claim_next(worker, clock())
    later = clock() + timedelta(minutes=10)
    order_model.objects.get(pk=order.pk).extend_deadline(later)

    worker.process(claim, clock())
    worker.flush_acks()

    order.refresh_from_db()
    assert state(order) == "unpaid"
    assert score_of(queue, str(order.pk)) == deadline_score(later)
    assert leased_members(queue) == []


def test_deadline_ahead_of_the_member_goes_back_and_does_not_spin(make_order, queue):
    """Redis says due, the row (and the database's clock) says 1.5 s to go."""
    order = Order.objects.create(expires_at=timezone.now() + timedelta(seconds=1.5))
    queue.schedule({str(order.pk): now_score(timezone.now()) - 1000})
    worker = Consumer(follow_database_clock=False)

    stats = worker.run(once=True)

    order.refresh_from_db()
    assert order.status == Order.Status.UNPAID
    assert stats.batches == 1 and stats.rescheduled == 1
    assert score_of(queue, str(order.pk)) == deadline_score(order.expires_at)
    wait_for(lambda: timezone.now() > order.expires_at + timedelta(seconds=0.1), timeout=5)
    Consumer().run(once=True)
    order.refresh_from_db()
    assert order.status == Order.Status.CLOSED


def test_raising_receiver_leaves_only_its_order_open(consumer, make_order, receiver, queue, clock):
    orders = [make_order(in_seconds=-1) for _ in range(3)]
    unlucky = orders[1]

    @receiver
    def release_stock(sender, order, **kwargs):
        if order.pk == unlucky.pk:
            raise RuntimeError("stock service down")

    stats = consumer().run(once=True)

    statuses = {o.pk: s for o, s in ((o, Order.objects.get(pk=o.pk).status) for o in orders)}
    assert statuses == {orders[0].pk: "closed", unlucky.pk: "unpaid", orders[2].pk: "closed"}
    assert expiries(unlucky) == 0
    # The others' receivers ran again after the rolled-back first run: their writes count once.
    assert expiries(orders[0]) == expiries(orders[2]) == 1
    assert stats.failed == 1
    # Back in the queue for its first retry, RETRY_DELAYS[0] = 10 s from now.
    assert leased_members(queue) == []
    assert score_of(queue, str(unlucky.pk)) == now_score(clock()) + 10_000


def test_failed_order_is_retried_after_the_first_retry_delay(consumer, make_order, receiver, clock):
    order = make_order(in_seconds=-1)
    calls = []

    @receiver
    def flaky(sender, order, **kwargs):
        calls.append(order.pk)
        if len(calls) == 1:
            raise RuntimeError("first try fails")

    worker = consumer()
    worker.run(once=True)
    assert Order.objects.get(pk=order.pk).status == "unpaid"
    clock.advance(9.9)
    worker.run(once=True)
    assert Order.objects.get(pk=order.pk).status == "unpaid"

    clock.advance(0.1)
    worker.run(once=True)

    assert Order.objects.get(pk=order.pk).status == "closed"
    assert expiries(order) == 1


def test_malformed_member_is_logged_and_dropped_and_the_consumer_goes_on(consumer, make_order, queue,
                                                                         clock, caplog):
    order = make_order(in_seconds=-1)
    queue.schedule({"not-an-id": now_score(clock()) - 10, "": now_score(clock()) - 10})

    with caplog.at_level(logging.ERROR, logger="order_timeout"):
        stats = consumer().run(once=True)

    assert Order.objects.get(pk=order.pk).status == "closed"
    assert stats.dropped == 2
    assert "malformed" in caplog.text
    assert pending_count(queue) == 0 and leased_members(queue) == []


def test_member_without_a_row_is_logged_and_dropped(consumer, queue, clock, caplog):
    queue.schedule({"987654": now_score(clock()) - 10})

    with caplog.at_level(logging.WARNING, logger="order_timeout"):
        stats = consumer().run(once=True)

    assert stats.dropped == 1
    assert "987654" in caplog.text
    assert leased_members(queue) == []


@both_redis
def test_pitfall_4_a_claim_takes_at_most_batch_size(consumer, make_order, queue, clock):
    orders = [make_order(in_seconds=-1) for _ in range(7)]

    claim = consumer(batch_size=3).claim(clock())

    in_its_shard = [o for o in orders if queue.shard_for(str(o.pk)).index == claim.shard]
    assert len(claim.members) == min(3, len(in_its_shard))
    assert pending_count(queue) == 7 - len(claim.members)
    assert len(leased_members(queue)) == len(claim.members)


def test_idle_consumer_sleeps_until_the_next_deadline_not_max_wait(consumer, make_order, clock):
    make_order(in_seconds=0.25)
    worker = consumer(max_wait=5, batch_window=0.01)

    claim = worker.claim(clock())

    assert claim.members == []
    # Until the deadline, and the batch window past it.
    assert worker._idle_wait(claim.next_score) == pytest.approx(0.26, abs=0.002)


def test_idle_consumer_sleeps_max_wait_when_nothing_is_pending(consumer, clock):
    worker = consumer(max_wait=0.7)

    assert worker._idle_wait(worker.claim(clock()).next_score) == 0.7


def test_lost_database_connection_is_logged_and_retried(make_order, receiver, settings, caplog):
    """The first close kills its own database connection. That is the database's failure, not
    the order's (one lifecycle, decision (c), docs/design.md): tried again at once, not counted."""
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "RETRY_DELAYS": [0.2]}
    order = make_order(in_seconds=-1)
    kills = []

    @receiver
    def kill_connection(sender, order, **kwargs):
        if not kills:
            kills.append(order.pk)
            end_own_session()

    worker = Consumer(max_wait=0.05)
    with caplog.at_level(logging.WARNING, logger="order_timeout"), running(worker):
        wait_for(lambda: Order.objects.get(pk=order.pk).status == "closed")

    assert kills and worker.stats.failed == 0
    assert f"acting on order={order.pk} failed" in caplog.text and "trying it once more" in caplog.text
    assert "close failed" not in caplog.text
    assert expiries(order) == 1


def test_consumer_survives_the_database_going_away(make_order, caplog):
    """The database cannot be reached at all: logged, retried with backoff, no attempt counted."""
    order = make_order(in_seconds=-1)
    # A short lease, so the member comes back and the consumer tries (and fails) again.
    worker = Consumer(max_wait=0.05, lease_seconds=0.3)

    def run_against_a_dead_database():
        # Connections are per thread: only this thread's points at a closed port.
        dead = connections["default"]
        dead.settings_dict = {**dead.settings_dict, "HOST": "127.0.0.1", "PORT": 1}
        worker.run()

    with caplog.at_level(logging.WARNING, logger="order_timeout"), \
            running(worker, target=run_against_a_dead_database):
        wait_for(lambda: worker.stats.errors >= 2)

    # One line per backoff step, with its cause, and no traceback: an outage is expected.
    failures = [r for r in caplog.records if "batch failed" in r.getMessage()]
    assert failures and all("OperationalError" in r.getMessage() and r.exc_info is None
                            for r in failures)
    assert "retrying" in caplog.text
    assert worker.stats.failed == 0 and worker.stats.closed == 0
    assert Order.objects.get(pk=order.pk).status == "unpaid"
    # Nothing lost: the member is still there for a consumer that reaches the database.
    Consumer(now=Clock(timezone.now() + timedelta(seconds=1))).run(once=True)
    assert Order.objects.get(pk=order.pk).status == "closed"


def test_a_receiver_that_breaks_the_transaction_holds_back_only_its_own_order(
        consumer, make_order, receiver, queue, clock):
    """As a deadlock does: the whole transaction is gone, not only the savepoint."""
    orders = [make_order(in_seconds=-1) for _ in range(3)]
    unlucky = orders[1]

    @receiver
    def roll_everything_back(sender, order, **kwargs):
        if order.pk == unlucky.pk:
            with connection.cursor() as cursor:
                cursor.execute("ROLLBACK")
            raise RuntimeError("Deadlock found when trying to get lock")

    stats = consumer().run(once=True)

    assert [Order.objects.get(pk=o.pk).status for o in orders] == ["closed", "unpaid", "closed"]
    assert stats.failed == 1
    assert score_of(queue, str(unlucky.pk)) == now_score(clock()) + 10_000
    assert expiries(orders[0]) == expiries(orders[2]) == 1


def test_lost_redis_is_logged_and_retried_until_it_returns(private_redis, make_order, caplog):
    order = make_order(in_seconds=0.3)
    private_redis.stop()
    worker = Consumer(max_wait=0.05)
    with caplog.at_level(logging.WARNING, logger="order_timeout"), running(worker):
        wait_for(lambda: worker.stats.errors >= 2)
        private_redis.start()
        schedule([order])  # an empty Redis came back; the rebuild scan would do this
        wait_for(lambda: Order.objects.get(pk=order.pk).status == "closed")

    assert "Redis failed" in caplog.text



class OutageRightAfterTheClaim(ConsumerMetrics):
    """Metrics that, told of a claim, take Redis and this thread's database away: the batch is in
    hand, and can be neither acted on nor put back."""

    def __init__(self, redis: PrivateRedis) -> None:
        super().__init__(enabled=False)
        self.redis = redis

    def claimed(self, seconds: float, size: int) -> None:
        if not size:
            return
        self.redis.stop()
        gone = connections["default"]
        gone.close()
        gone.settings_dict = {**gone.settings_dict, "HOST": "127.0.0.1", "PORT": 1}


def test_a_batch_it_can_neither_act_on_nor_put_back_waits_for_its_lease_and_the_line_names_its_kind(
        private_redis, consumer, make_order, caplog):
    make_order(in_seconds=-1)
    worker = consumer(metrics=OutageRightAfterTheClaim(private_redis))
    raised = []

    def run_once_in_a_thread_of_its_own():
        # Connections are per thread: only this one's points at a closed port.
        try:
            worker.run_once()
        except DatabaseError as exc:
            raised.append(exc)
        finally:
            connections["default"].close()

    with caplog.at_level(logging.WARNING, logger="order_timeout"):
        thread = threading.Thread(target=run_once_in_a_thread_of_its_own)
        thread.start()
        thread.join(time_left())

    assert raised, "the database's failure is the loop's to retry"
    assert [record.getMessage() for record in caplog.records if "put back" in record.getMessage()] == [
        "close: could not put back 1 claimed member(s): Redis is unreachable; they are taken over when their "
        "lease runs out."]


def test_a_shops_own_order_model_is_closed_the_same_way(consumer, clock):
    purchase = Purchase.objects.create(customer="ada", expires_at=clock() - timedelta(seconds=1))
    schedule([purchase])

    consumer(model=Purchase).run(once=True)

    purchase.refresh_from_db()
    assert purchase.status == Purchase.Status.CLOSED
    assert Expiry.objects.filter(order_id=str(purchase.pk), model="shop.Purchase").count() == 1


def test_reschedule_keeps_an_earlier_deadline_set_meanwhile(consumer, make_order, queue, clock):
    order = make_order(in_seconds=-1)
    member = str(order.pk)
    claim = consumer().claim(clock())
    # The consumer read a 10-minute deadline from the row...
    read_by_consumer = {member: deadline_score(clock() + timedelta(minutes=10))}
    # ...then the shop moved it to 5 s, and its commit reached Redis first.
    sooner = clock() + timedelta(seconds=5)
    Order.objects.get(pk=order.pk).extend_deadline(sooner)

    queue.reschedule(claim.token, read_by_consumer)

    assert claim.members == [member]
    assert score_of(queue, member) == deadline_score(sooner)


def test_once_stops_at_what_was_due_when_it_started(consumer, make_order, queue, clock):
    """Its cutoff is its first reading of the clock: what falls due while it runs waits for the
    next run, so a steady stream of deadlines cannot keep it going."""
    due_now = [make_order(in_seconds=-1) for _ in range(4)]
    # Due 0.5 s to 3.5 s after that first reading (the clock reads one second on, below).
    due_soon = [make_order(in_seconds=s) for s in (1.5, 2.5, 3.5, 4.5)]

    def ticking():  # every reading of the clock is one second later
        return clock.advance(1)

    stats = consumer(now=ticking, batch_size=2).run(once=True)

    assert [state(o) for o in due_now] == ["closed"] * 4
    # Never claimed (not even to be put back): still waiting, at their own deadlines.
    assert (stats.claimed, stats.batches, stats.closed, stats.rescheduled) == (4, 2, 4, 0)
    assert [state(o) for o in due_soon] == ["unpaid"] * 4
    assert [score_of(queue, str(o.pk)) for o in due_soon] == [deadline_score(o.expires_at) for o in due_soon]


@both_models
def test_payment_racing_a_close_waits_for_the_lock_and_is_refused(make_order, order_model, held_receiver):
    """Whoever takes the row lock first wins; the loser learns it."""
    order = make_order(in_seconds=-1)

    worker = Consumer()
    consumer_thread = threading.Thread(target=worker.run, kwargs={"once": True}, name="the consumer")
    consumer_thread.start()
    wait_for(held_receiver.inside.is_set)
    payment: list[object] = []

    def pay():
        try:
            payment.append(order_model.objects.get(pk=order.pk).mark_paid())
        except OrderClosed as exc:
            payment.append(exc)
        finally:
            connection.close()

    payer = threading.Thread(target=pay, name="the payer")
    payer.start()
    wait_for(lambda: lock_waits() == 1, interval=INNODB_TRX_POLL)  # blocked on the row lock the close holds
    assert payment == []
    held_receiver.release.set()
    finish(consumer_thread)
    finish(payer)

    assert isinstance(payment[0], OrderClosed)
    assert state(order) == "closed"
    assert expiries(order) == 1


def test_idle_consumer_does_not_busy_loop(settings):
    """With nothing pending it looks once per MAX_WAIT, one round trip each time (docs/settings.md),
    after learning at start that each shard is empty; whatever other clients of the server do."""
    traffic = Traffic()
    client = Redis(connection_pool=recording_pool(settings.CACHES["order_timeout"]["LOCATION"], traffic))
    shards = order_settings.SHARDS
    max_wait = 0.2
    with neighbour_hammering_the_server():
        started = time.monotonic()
        # Its heartbeat (a script per lane every half second, tests/test_heartbeats.py) beats
        # here only as it starts and as it leaves.
        worker = Consumer(TimeoutQueue(client, own_key_prefix(), shards), max_wait=max_wait,
                          heartbeat_seconds=3600)
        with running(worker):
            wait_for(lambda: kinds(traffic, len(worker.lanes.shards))["refresh"] >= 5)
        elapsed = time.monotonic() - started
    client.close()

    lanes = len(worker.lanes.shards)  # every kind's shards: the order close's and each timer's
    sent = kinds(traffic, lanes)
    refreshes = sent.pop("refresh")
    # At start: one claim per lane (each empty), the script that tells the server's version
    # (lua/version.lua: which pub/sub the wake-ups use), and the wake-up subscription; its
    # confirmation wakes each lane, so a lane already claimed by then is claimed once more; and
    # its heartbeat's two beats on each lane, as it starts and as it leaves; and, the queue being
    # new, its epoch marker set on each lane and read back, a script each (lua/epoch.lua); and,
    # once, the version of the timers' pauses read (and, the queue being new, set and read back),
    # and each lane's paused flag read as the database's pauses are (none: nothing to write).
    scripts = sent.pop("script") - 2 * lanes - 2 * lanes
    assert sent == {"subscribe": 1, "GET": 2 + lanes, "SET": 1} and lanes + 1 <= scripts <= 2 * lanes + 1, (
        sent, scripts)
    # Then one round trip per MAX_WAIT, never sooner.
    assert refreshes * max_wait <= elapsed, (refreshes, elapsed)


def own_key_prefix() -> str:
    """Keys, and wake-up channels, of the test's own. Pub/sub ignores the database number: other
    runs on the same server publish on the default prefix's channels, and their wake-ups would
    make a consumer claim."""
    return f"{order_settings.KEY_PREFIX}-{uuid.uuid4().hex[:8]}"


def kinds(traffic: Traffic, lanes: int) -> Counter[str]:
    """What an idle consumer's round trips were for; a script loaded once on a server that had
    none is the one allowance (the claim that found it missing is sent again)."""
    known = {("EVALSHA",): "script", ("ZRANGE",) * (2 * lanes): "refresh",
             ("SSUBSCRIBE",): "subscribe", ("SUBSCRIBE",): "subscribe"}
    counted: Counter[str] = Counter()
    for trip in traffic.asked():
        if trip.commands == ("SCRIPT LOAD",) or trip.outcome == "NoScriptError":
            continue
        counted[known.get(trip.commands, " ".join(trip.commands))] += 1
    return counted


@contextmanager
def neighbour_hammering_the_server():
    """Another client of the same Redis server: another test run's claims, reads and pings."""
    neighbour = Redis.from_url(django_settings.CACHES["order_timeout"]["LOCATION"])
    stop = threading.Event()

    def hammer():
        while not stop.is_set():
            neighbour.zrange("a-neighbours-key", 0, 0)
            neighbour.eval("return 1", 0)
            neighbour.ping()

    thread = threading.Thread(target=hammer, name="neighbour")
    thread.start()
    try:
        yield
    finally:
        stop.set()
        finish(thread)
        neighbour.close()


def test_consumer_wakes_at_the_next_deadline_rather_than_after_max_wait(make_order):
    """MAX_WAIT is an hour: only the deadline can end its sleep within the test."""
    order = make_order(in_seconds=0.3)
    with running(Consumer(max_wait=3600)):
        wait_for(lambda: Order.objects.get(pk=order.pk).status == "closed")


def test_claim_of_ten_thousand_members_is_sliced_and_unique(consumer, queue, clock):
    due = now_score(clock()) - 1
    queue.schedule({str(pk): due for pk in range(1, 10_001)})

    claim = consumer(batch_size=10_000).claim(clock())

    assert len(claim.members) == len(set(claim.members)) == 10_000
    assert pending_count(queue) == 0 and len(leased_members(queue)) == 10_000


def test_consumer_rejects_a_batch_size_outside_the_bounds():
    with pytest.raises(ValueError, match="batch_size"):
        Consumer(batch_size=0)


def test_batch_signal_fires_once_per_batch_with_every_closed_order(consumer, make_order):
    orders = [make_order(in_seconds=-1) for _ in range(5)]
    batches = []

    def release_in_bulk(sender, orders, **kwargs):
        batches.append(sorted(o.pk for o in orders))

    orders_expired.connect(release_in_bulk, weak=False)
    try:
        consumer(batch_size=3).run(once=True)
    finally:
        orders_expired.disconnect(release_in_bulk)

    assert sorted(len(batch) for batch in batches) == [2, 3]
    assert sorted(pk for batch in batches for pk in batch) == sorted(o.pk for o in orders)


def test_a_receiver_connected_after_the_kinds_closed_a_batch_hears_the_next_closes(consumer, make_order,
                                                                                  order_model):
    # Whether anyone listens is asked per batch (a batch nobody listens to sends nothing), not
    # kept by the kinds (the registry's, shared by every consumer of the process): a receiver a
    # shop connects later, in a ready() or a test, is not missed.
    first = make_order(in_seconds=-1)
    assert consumer().run(once=True).closed == 1
    heard, batches = [], []

    def on_expired(sender, order, **kwargs):
        heard.append(order.pk)

    def on_batch(sender, orders, **kwargs):
        batches.append([order.pk for order in orders])

    order_expired.connect(on_expired, sender=order_model, weak=False)
    orders_expired.connect(on_batch, sender=order_model, weak=False)
    try:
        later = [make_order(in_seconds=-1) for _ in range(2)]
        assert consumer().run(once=True).closed == 2
    finally:
        order_expired.disconnect(on_expired, sender=order_model)
        orders_expired.disconnect(on_batch, sender=order_model)
    assert sorted(heard) == sorted(order.pk for order in later) and first.pk not in heard
    assert [sorted(batch) for batch in batches] == [sorted(order.pk for order in later)]


@contextmanager
def no_receivers(*signals):
    """Every receiver of ``signals`` away while inside (a shop that listens to neither)."""
    kept = [(signal, signal.receivers[:]) for signal in signals]
    for signal in signals:
        signal.receivers.clear()
        signal.sender_receivers_cache.clear()
    try:
        yield
    finally:
        for signal, receivers in kept:
            signal.receivers[:] = receivers
            signal.sender_receivers_cache.clear()


def test_a_shop_that_listens_to_no_close_has_its_orders_closed_all_the_same(consumer, make_order):
    orders = [make_order(in_seconds=-1) for _ in range(3)]
    paid = make_order(in_seconds=-1)
    paid.mark_paid()
    with no_receivers(order_expired, orders_expired):
        stats = consumer().run(once=True)
    assert (stats.closed, stats.failed) == (3, 0)
    assert [state(order) for order in orders] == ["closed"] * 3 and state(paid) == "paid"


def test_a_raising_batch_receiver_makes_the_batch_close_one_order_at_a_time(consumer, make_order):
    orders = [make_order(in_seconds=-1) for _ in range(3)]
    sizes = []

    def refuse_big_batches(sender, orders, **kwargs):
        sizes.append(len(orders))
        if len(orders) > 1:
            raise RuntimeError("bulk release failed")

    orders_expired.connect(refuse_big_batches, weak=False)
    try:
        stats = consumer().run(once=True)
    finally:
        orders_expired.disconnect(refuse_big_batches)

    assert sizes == [3, 1, 1, 1]
    assert stats.closed == 3 and stats.failed == 0
    assert [expiries(o) for o in orders] == [1, 1, 1]


def test_a_receiver_that_marks_the_close_for_rollback_fails_that_order(consumer, make_order, receiver,
                                                                      queue, clock):
    orders = [make_order(in_seconds=-1) for _ in range(2)]

    @receiver
    def veto(sender, order, **kwargs):
        if order.pk == orders[0].pk:
            transaction.set_rollback(True)

    stats = consumer().run(once=True)

    assert [Order.objects.get(pk=o.pk).status for o in orders] == ["unpaid", "closed"]
    assert stats.failed == 1
    assert score_of(queue, str(orders[0].pk)) is not None  # retried later, not acked


def test_a_dead_consumers_batch_is_taken_over_whole_and_the_orders_due_meanwhile_get_the_next_claim(
        consumer, make_order, queue, clock):
    """The first death hands the batch on as a batch, counted once for each member; orders that
    fell due meanwhile do not wait behind it: the next claim is theirs."""
    stale = [make_order(in_seconds=-10) for _ in range(3)]
    claim_everywhere(queue, now_score(clock()), 3, now_score(clock()) - 1, "a-consumer-that-died")
    due = [make_order(in_seconds=-1) for _ in range(3)]
    worker = consumer(batch_size=4)

    claims = [worker.claim(clock()) for _ in range(2)]

    assert sorted(claims[0].members) == sorted(str(o.pk) for o in stale)
    assert sorted(claims[1].members) == sorted(str(o.pk) for o in due)
    assert [(c.takeovers, c.died_alone) for c in claims] == [(1, False), (0, False)]
    assert hash_size(queue, "takeovers") == 3 and pending_count(queue) == 0


def test_a_batch_taken_over_that_dies_again_goes_on_member_by_member_and_only_its_killer_is_given_up(
        make_order, queue, clock):
    """A crash costs one claim: the batch is taken over whole. If that holder dies too, each member
    is taken alone: the innocent close at once, each acked by its first holder; the killer, dead
    alone with its holder past MAX_TAKEOVERS (3), is the only member ever judged."""
    shard, members = queue.shards[0], []
    while len(members) < 8:
        member = str(make_order(in_seconds=3600).pk)  # due only for the first claim below
        if queue.shard_for(member) is shard:
            members.append(member)
    killer = members[5]
    now_ms = now_score(clock())
    assert sorted(shard.claim(now_ms + 3_700_000, 8, now_ms - 1000, "dead:0").members) == sorted(members)
    held_by_killer, acked, judged = [], [], []
    for n in range(1, 30):
        # Each claim's lease runs out before the next (a unique expiry: the batches stay apart).
        claim = shard.claim(now_ms, 8, now_ms - 1000 + n, f"holder{n}:0")
        if not claim.members:
            break
        if claim.died_alone and claim.takeovers > order_settings.MAX_TAKEOVERS:
            judged.append((claim.members, claim.takeovers))
            queue.ack(claim.token, claim.members)  # given up (the lifecycle's part)
        elif killer in claim.members:
            held_by_killer.append((len(claim.members), claim.died_alone))  # it dies: its lease runs out
        else:
            assert not claim.died_alone
            queue.ack(claim.token, claim.members)
            acked += claim.members

    # Whole, then alone (not judged: its holder held others), alone again (judged, tried once more).
    assert held_by_killer == [(8, False), (1, False), (1, True)]
    assert judged == [([killer], 4)]
    assert sorted(acked) == sorted(m for m in members if m != killer)


def test_an_order_whose_row_is_locked_elsewhere_does_not_stall_its_batch(consumer, make_order, queue,
                                                                        clock):
    """A long transaction holds one row: the rest of the batch closes, that one is looked at again."""
    orders = [make_order(in_seconds=-1) for _ in range(3)]
    held = orders[1]

    with row_locked_elsewhere(Order, held.pk):
        stats = consumer().run(once=True)

    assert [Order.objects.get(pk=o.pk).status for o in orders] == ["closed", "unpaid", "closed"]
    assert stats.failed == 0 and stats.rescheduled == 1
    assert score_of(queue, str(held.pk)) == now_score(clock()) + 1000
    clock.advance(1)
    consumer().run(once=True)
    assert Order.objects.get(pk=held.pk).status == "closed"


@both_redis
def test_a_new_earlier_deadline_wakes_a_sleeping_consumer(make_order):
    """Nothing pending: the consumer sleeps MAX_WAIT (an hour), yet closes a 0.2 s order at once."""
    worker = Consumer(max_wait=3600)
    with running(worker):
        # Listening: it made its listener as it started.
        wait_for(lambda: worker._listener is not None and worker._listener.subscribed)
        order = make_order(in_seconds=0.2)
        wait_for(lambda: Order.objects.get(pk=order.pk).status == "closed")


def test_a_wake_up_that_comes_while_its_lanes_claim_is_answered_is_not_lost(make_order):
    """Seen in CI (PostgreSQL, a loaded run): a consumer claimed the close lane and found it empty;
    before it wrote down "empty", the listener heard of a new deadline there; the consumer then
    wrote "empty" over the wake-up and slept its MAX_WAIT (an hour) with the order due. Here the
    wake-up is made to come in exactly that gap."""
    worker = Consumer(max_wait=3600, kinds=order_kinds())
    lane = next(lane for lane, kind in enumerate(worker._kind_of_lane) if kind.model is Order)
    shard = worker.lanes.shards[lane]
    answered, go_on, woken = threading.Event(), threading.Event(), threading.Event()
    in_the_gap = threading.Event()
    claim, woke = shard.claim, worker.rota.woke

    def claim_then_wait(*args, **kwargs):
        reply = claim(*args, **kwargs)
        if in_the_gap.is_set() and not reply.members:
            in_the_gap.clear()
            answered.set()
            go_on.wait(10)
        return reply

    def woke_and_tell(index):
        woke(index)
        if index == lane and answered.is_set():
            woken.set()

    shard.claim, worker.rota.woke = claim_then_wait, woke_and_tell
    with running(worker):
        wait_for(lambda: worker._listener is not None and worker._listener.subscribed)
        in_the_gap.set()
        worker._woken(lane)  # the consumer claims the lane (empty) and stops before noting it
        wait_for(answered.is_set, timeout=10)
        order = make_order(in_seconds=0.2)  # its wake-up comes while the empty answer is in hand
        wait_for(woken.is_set, timeout=10)
        go_on.set()
        wait_for(lambda: Order.objects.get(pk=order.pk).status == "closed", timeout=10)


@both_redis
def test_a_wake_up_subscription_that_comes_back_looks_at_every_lane_at_once(queue):
    """Seen in CI's Redis Cluster failover test: a deadline published while a consumer's
    subscription was down (a restart, a failover, a proxy's idle timeout) reached nobody, and that
    consumer slept on to MAX_WAIT. Each channel confirmed, first or again (the listener's rebuild,
    or redis-py's own reconnect), wakes its lane, as a message would have."""
    woken: set[int] = set()
    listener = WakeListener(queue, woken.add)
    try:
        wait_for(lambda: listener.subscribed and woken == set(range(len(queue.shards))))
        woken.clear()

        cut_off_subscribers(queue)

        wait_for(lambda: woken == set(range(len(queue.shards))))
    finally:
        listener.close()


@pytest.mark.parametrize("window, apart, batches", [(0.15, 0.04, [1]), (0.0, 0.3, [2, 3])],
                         ids=["window", "no-window"])
def test_a_sleeping_consumer_closes_the_deadlines_within_its_batch_window_in_one_batch(make_order, window,
                                                                                      apart, batches):
    """Three deadlines 40 ms apart: with a window of 150 ms, one batch (and so one
    transaction). Without a window, three deadlines 300 ms apart: a batch per deadline (a loaded
    CI machine woke a consumer more than 80 ms late, and three deadlines 40 ms apart were all due
    by then). None closes before its deadline."""
    orders = [make_order(in_seconds=1.0 + apart * i) for i in range(3)]
    # The close's lane alone: the test shop's e-mail notices would be batches of their own.
    worker = Consumer(max_wait=3600, batch_window=window, kinds=order_kinds())
    with running(worker):
        wait_for(lambda: Order.objects.filter(status="closed").count() == 3)

    assert worker.stats.batches in batches and worker.stats.closed == 3
    for order in orders:
        order.refresh_from_db()
        assert order.closed_at >= order.expires_at


def test_scheduling_publishes_a_wake_up_only_for_a_new_earliest_deadline(redis_client, clock):
    queue = TimeoutQueue(redis_client, own_key_prefix(), 1)  # its channel heard by this test alone
    pubsub = redis_client.pubsub(ignore_subscribe_messages=True)
    pubsub.ssubscribe(queue.shards[0].keys.wake)
    now = now_score(clock())

    def messages():
        received, until = [], time.monotonic() + 1.0
        while time.monotonic() < until:
            message = pubsub.get_message(timeout=0.1)  # None for the subscribe confirmation too
            if message is not None:
                received.append(int(message["data"]))
        return received

    queue.schedule({"1": now + 60_000})
    queue.schedule({"2": now + 120_000})  # behind the head: no wake-up
    queue.schedule({"3": now + 1_000})
    queue.schedule({"4": now + 5_000, "5": now + 500})

    assert messages() == [now + 60_000, now + 1_000, now + 500]
    pubsub.close()
