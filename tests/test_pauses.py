"""Staff pause a timer while a payment provider is down, and resume it, giving back the time it took.

While a timer is paused no consumer claims it and no scan acts on it; its members wait in Redis,
payments are accepted, every other timer goes on. The pause lives in the database: a consumer
restarted during it, or a Redis that lost its version, stays paused. Resuming acts at once on
what fell due, or, with --give-back, moves each deadline inside the pause later by its length.
"""

from __future__ import annotations

import io
import json
import threading
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from order_timeout.models import Order, Pause
from order_timeout.queue import TimeoutQueue
from order_timeout.scans.compensation import compensate
from order_timeout.timers.pausing import PauseRefused, known_names, pause, resume
from testproject.shop.models import Checkout, StockRecord, StockReservation

from .conftest import both_redis, finish, running, wait_for
from .helpers import expiries, state

pytestmark = pytest.mark.django_db(transaction=True)


def command(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def paused(name: str = "close", reason: str = "PSP outage") -> None:
    command("order_timeout_pause", "--timer", name, "--reason", reason)


def reservation(in_seconds: float) -> StockReservation:
    stock = StockRecord.objects.create(num_in_stock=10, num_allocated=1)
    return StockReservation.objects.create(stockrecord=stock, checkout=Checkout.objects.create(),
                                           expires_at=timezone.now() + timedelta(seconds=in_seconds))


def at_once(*acts: Any) -> list[Any]:
    """Run each staff action in a thread of its own, all let go together; what each returned, or
    the PauseRefused it raised, in the order given."""
    from django.db import connection

    barrier = threading.Barrier(len(acts))
    outcomes: list[Any] = [None] * len(acts)

    def staff(index: int, act: Any) -> None:
        barrier.wait()
        try:
            outcomes[index] = act()
        except PauseRefused as refused:
            outcomes[index] = refused
        finally:
            connection.close()

    threads = [threading.Thread(target=staff, args=(index, act)) for index, act in enumerate(acts)]
    for thread in threads:
        thread.start()
    for thread in threads:
        finish(thread)
    return outcomes


@both_redis
def test_a_paused_close_closes_nothing_and_its_resume_closes_what_fell_due_at_once(make_order, consumer):
    paused()
    due = [make_order(in_seconds=-5) for _ in range(3)]

    worker = consumer()
    worker.run(once=True)
    assert [state(order) for order in due] == ["unpaid"] * 3

    command("order_timeout_resume")
    consumer().run(once=True)

    assert [expiries(order) for order in due] == [1, 1, 1]
    assert [state(order) for order in due] == ["closed"] * 3


def test_every_other_timer_goes_on_while_the_close_is_paused(make_order, consumer):
    from order_timeout.timers.registry import registry

    paused()
    order = make_order(in_seconds=-5)
    lapsing = reservation(in_seconds=-5)

    consumer(kinds=registry.kinds()).run(once=True)

    assert state(order) == "unpaid"
    assert StockReservation.objects.get(pk=lapsing.pk).state == "released"


def test_a_payment_during_a_pause_is_accepted_and_never_closed(make_order, consumer):
    paused()
    order = make_order(in_seconds=-5)

    assert order.mark_paid() is True
    command("order_timeout_resume")
    consumer().run(once=True)

    assert (state(order), expiries(order)) == ("paid", 0)


def test_a_consumer_started_during_a_pause_stays_paused_even_if_redis_lost_its_version(make_order, consumer,
                                                                                        redis_client):
    paused()
    redis_client.delete(TimeoutQueue.from_settings().global_keys.pauses)  # Redis came back empty of it
    order = make_order(in_seconds=-5)

    consumer().run(once=True)

    assert state(order) == "unpaid"


@both_redis
def test_a_running_consumer_stops_claiming_a_paused_timer_within_a_heartbeat(make_order, consumer):
    worker = consumer(heartbeat_seconds=0.6, max_wait=0.1, follow_database_clock=False, now=timezone.now)
    with running(worker) as thread:
        before = make_order(in_seconds=-1)
        wait_for(lambda: state(before) == "closed")
        paused()
        # A heartbeat (a third of HEARTBEAT_SECONDS) tells the running consumer.
        wait_for(lambda: worker.pauses.paused == frozenset({"close"}))
        during = [make_order(in_seconds=-1) for _ in range(3)]
        threading.Event().wait(1.0)
        assert [state(order) for order in during] == ["unpaid"] * 3
        command("order_timeout_resume")
        wait_for(lambda: all(state(order) == "closed" for order in during))
        worker.request_stop()
    finish(thread)
    assert [expiries(order) for order in during] == [1, 1, 1]


def test_the_scan_leaves_a_paused_timer_alone(make_order):
    paused()
    overdue = make_order(in_seconds=-600)

    result = compensate()

    assert result.paused and result.closed == 0
    assert state(overdue) == "unpaid"


def test_give_back_moves_each_deadline_inside_the_pause_later_by_its_length(make_order, consumer):
    started = timezone.now() - timedelta(seconds=120)
    Pause.objects.create(timer="close", open_for="close", reason="PSP outage", paused_at=started)
    before = make_order(in_seconds=-300)       # due before the pause: not given anything
    inside = [make_order(in_seconds=-60), make_order(in_seconds=-10)]
    just_after = make_order(in_seconds=300)    # within GIVE_BACK_GRACE (600 s) after the resume
    later = make_order(in_seconds=3600)        # due long after: its own time is its own
    deadlines = {order.pk: Order.objects.get(pk=order.pk).expires_at for order in [before, *inside, just_after, later]}

    out = command("order_timeout_resume", "--give-back")
    given = Pause.objects.get().given_back_seconds

    assert 120 <= given < 130 and "gave" in out
    now = {order.pk: Order.objects.get(pk=order.pk).expires_at for order in [before, *inside, just_after, later]}
    assert now[before.pk] == deadlines[before.pk] and now[later.pk] == deadlines[later.pk]
    for order in [*inside, just_after]:
        assert now[order.pk] == deadlines[order.pk] + timedelta(seconds=given)
    consumer().run(once=True)
    # Due before the pause: closed; given back: still open, each closed at its new deadline, once.
    assert (state(before), [state(order) for order in inside]) == ("closed", ["unpaid", "unpaid"])
    assert Pause.objects.get().given_back_rows == 3


@both_redis
def test_an_order_given_the_time_back_closes_at_its_new_deadline_exactly_once(make_order, consumer):
    """Paused for 2 s: an order due inside the pause is given those 2 s, and a running consumer,
    its deadline followed in Redis, closes it once its new deadline passed, not at the resume."""
    Pause.objects.create(timer="close", open_for="close", reason="PSP outage",
                         paused_at=timezone.now() - timedelta(seconds=2))
    due = make_order(in_seconds=-1)
    worker = consumer(heartbeat_seconds=0.6, max_wait=0.1, follow_database_clock=False, now=timezone.now)
    with running(worker) as thread:
        command("order_timeout_resume", "--give-back")
        given = Pause.objects.get().given_back_seconds
        deadline = Order.objects.get(pk=due.pk).expires_at
        wait_for(lambda: state(due) == "closed")
        worker.request_stop()
    finish(thread)

    closed = Order.objects.get(pk=due.pk)
    assert given >= 2 and closed.closed_at >= deadline
    assert expiries(due) == 1


def test_a_give_back_cut_short_goes_on_where_it_stopped_without_moving_a_row_twice(make_order, monkeypatch,
                                                                                   settings):
    from order_timeout.scans import giveback

    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "COMPENSATION_CHUNK": 2}
    Pause.objects.create(timer="close", open_for="close", reason="PSP outage",
                         paused_at=timezone.now() - timedelta(seconds=100))
    orders = [make_order(in_seconds=-50 + i) for i in range(5)]
    deadlines = {order.pk: Order.objects.get(pk=order.pk).expires_at for order in orders}
    chunks = giveback._Walk._chunk
    calls: list[int] = []

    def dies_after_one_chunk(self: Any, keys: list[Any], *, last: Any) -> list[Any]:
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt("the deploy's SIGTERM")
        return chunks(self, keys, last=last)

    monkeypatch.setattr(giveback._Walk, "_chunk", dies_after_one_chunk)
    with pytest.raises(KeyboardInterrupt):
        command("order_timeout_resume", "--give-back")
    monkeypatch.setattr(giveback._Walk, "_chunk", chunks)
    assert Pause.objects.get().resumed_at is None  # still paused: nothing acted on meanwhile
    command("order_timeout_resume", "--give-back")

    pause_row = Pause.objects.get()
    moved = {order.pk: Order.objects.get(pk=order.pk).expires_at - deadlines[order.pk] for order in orders}
    assert set(moved.values()) == {timedelta(seconds=pause_row.given_back_seconds)}
    assert pause_row.given_back_rows == 5 and pause_row.resumed_at is not None


@pytest.mark.parametrize(("args", "says"), [
    (["order_timeout_pause", "--timer", "nope", "--reason", "x"], "No timer named 'nope'"),
    (["order_timeout_pause", "--reason", "  "], "needs a reason"),
    (["order_timeout_resume"], "close is not paused"),
])
def test_a_bad_pause_or_resume_is_a_command_error_naming_it(args, says):
    with pytest.raises(CommandError, match=says):
        command(*args)


def test_a_give_back_on_the_reminders_is_refused_naming_them(settings):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "REMINDERS": [60]}
    paused("reminders")

    with pytest.raises(CommandError, match="reminders has no deadline of its own"):
        command("order_timeout_resume", "--timer", "reminders", "--give-back")
    assert Pause.objects.get().resumed_at is None


def test_two_staff_pausing_at_once_end_with_one_pause(transactional_db):
    results = at_once(lambda: pause(["close"], "PSP outage", known=known_names()),
                      lambda: pause(["close"], "PSP outage", known=known_names()))

    assert sorted(type(result).__name__ for result in results) == ["PauseRefused", "list"]
    assert Pause.objects.filter(resumed_at__isnull=True).count() == 1
    resume(["close"])
    with pytest.raises(PauseRefused, match="not paused"):
        resume(["close"])


def test_status_shows_each_pause_and_fails_with_its_own_code_when_one_is_older_than_max_paused():
    Pause.objects.create(timer="close", open_for="close", reason="PSP outage",
                         paused_at=timezone.now() - timedelta(hours=2))

    figures = json.loads(command("order_timeout_status", "--json", "--no-drift"))
    with pytest.raises(CommandError) as crossed:
        command("order_timeout_status", "--no-drift", "--max-paused", "3600")

    assert [(pause["timer"], pause["reason"]) for pause in figures["paused"]] == [("close", "PSP outage")]
    assert crossed.value.returncode == 3 and "close paused for" in str(crossed.value)


@both_redis
def test_a_pause_stops_the_next_claim_before_any_heartbeat_tells_the_consumer(make_order, consumer):
    """The claim script reads the kind's paused flags: a consumer that has not heard of the pause yet
    (its heartbeat looks once every HEARTBEAT_SECONDS) claims nothing of it from the pause on."""
    worker = consumer()
    worker.run_once()  # loads the pauses (none) before this test pauses
    paused()
    due = make_order(in_seconds=-5)

    claim = worker.run_once()

    assert worker.pauses.paused == frozenset() and claim.members == []
    assert state(due) == "unpaid"


def test_a_rebuild_after_redis_lost_the_queue_keeps_a_paused_timer_paused(make_order, consumer, queue):
    from order_timeout.scans.recovery import QueueRecovery

    worker = consumer()
    worker.run_once()  # the queue's epoch set up
    paused()
    due = make_order(in_seconds=-5)
    queue.client.flushdb()  # Redis restarted empty: the flags and the version gone with the members

    assert QueueRecovery(worker.queue, worker.queues, worker.kinds).run()
    consumer().run(once=True)

    assert all(queue.client.exists(shard.keys.paused) for shard in queue.shards)
    assert state(due) == "unpaid"


def test_a_stale_paused_flag_left_by_a_late_pause_is_cleared_once_the_database_says_resumed(make_order, consumer):
    """Staff pause and resume at once: the pause's commit, the resume's commit and flags cleared,
    then the pause's own telling runs late and sets the flags again (or Redis was down at the
    resume). The database says resumed, so a running consumer must clear them and close."""
    from order_timeout.timers.pausing import set_flags

    worker = consumer(heartbeat_seconds=0.6, max_wait=0.1, follow_database_clock=False, now=timezone.now)
    with running(worker) as thread:
        paused()
        command("order_timeout_resume")
        set_flags(worker.queue, ["close"], paused=True)  # the pause's telling, late
        worker.queue.housekeeping.bump_pauses("late")
        due = make_order(in_seconds=-1)
        wait_for(lambda: state(due) == "closed")
        worker.request_stop()
    finish(thread)
    assert expiries(due) == 1
    assert not any(worker.queue.client.exists(shard.keys.paused) for shard in worker.queue.shards)


def test_a_resume_redis_never_heard_of_reaches_the_claims_within_recheck(make_order, consumer, monkeypatch):
    """Redis down at the resume: its flags stay set and its version unmoved. The consumers ask the
    database every RECHECK seconds whatever Redis says, and clear the flags it no longer holds."""
    from order_timeout.timers import pausing

    monkeypatch.setattr(pausing, "RECHECK", 1.0)
    worker = consumer(heartbeat_seconds=0.3, max_wait=0.1, follow_database_clock=False, now=timezone.now)
    with running(worker) as thread:
        paused()
        wait_for(lambda: worker.pauses.paused == frozenset({"close"}))
        resume(["close"])
        pausing.set_flags(worker.queue, ["close"], paused=True)  # as if the clearing never reached Redis
        due = make_order(in_seconds=-1)
        wait_for(lambda: state(due) == "closed")
        worker.request_stop()
    finish(thread)
    assert expiries(due) == 1


def test_staff_pausing_and_resuming_at_once_end_in_a_state_one_of_them_asked_for(consumer, queue):
    """Each round: one pauses while another resumes. The database ends paused or not, and the
    claims' flags, once a consumer has looked, agree with it."""
    from order_timeout.timers.pausing import paused_names

    worker = consumer()
    for round_ in range(10):
        if round_ % 2:
            pause(["close"], "PSP outage", known=known_names())
        at_once(lambda: pause(["close"], "PSP", known=known_names()), lambda: resume(["close"]))

        assert Pause.objects.filter(resumed_at__isnull=True).count() <= 1
        worker.pauses.load()
        flagged = {bool(queue.client.exists(shard.keys.paused)) for shard in queue.shards}
        assert flagged == {"close" in paused_names()}
        if "close" in paused_names():
            resume(["close"])


def test_two_staff_giving_the_same_time_back_at_once_move_each_row_once(make_order, monkeypatch, settings):
    """Two resumes with --give-back of one pause (a double click, two terminals): one walk goes on,
    the other stops at its next chunk, and every deadline moves by the pause's length once."""
    from order_timeout.scans import giveback
    from order_timeout.scans.giveback import resume_timers

    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "COMPENSATION_CHUNK": 2}
    Pause.objects.create(timer="close", open_for="close", reason="PSP outage",
                         paused_at=timezone.now() - timedelta(seconds=100))
    orders = [make_order(in_seconds=-80 + 5 * i) for i in range(8)]
    deadlines = {order.pk: Order.objects.get(pk=order.pk).expires_at for order in orders}
    chunks = giveback._Walk._chunk

    def slowly(self: Any, keys: list[Any], *, last: Any) -> list[Any]:
        moved = chunks(self, keys, last=last)
        threading.Event().wait(0.1)  # the other staff's walk gets its turn between two chunks
        return moved

    monkeypatch.setattr(giveback._Walk, "_chunk", slowly)
    outcomes = at_once(lambda: resume_timers(["close"], give_time_back=True),
                       lambda: resume_timers(["close"], give_time_back=True))

    pause_row = Pause.objects.get()
    moved = {order.pk: Order.objects.get(pk=order.pk).expires_at - deadlines[order.pk] for order in orders}
    assert set(moved.values()) == {timedelta(seconds=pause_row.given_back_seconds)}
    assert pause_row.given_back_rows == 8 and pause_row.resumed_at is not None
    assert any(isinstance(outcome, tuple) for outcome in outcomes)  # one resumed, (ended, given back)


def test_a_give_back_inside_a_transaction_is_refused_before_anything_moves(make_order):
    """Its chunks would be savepoints of the caller's transaction, every moved row locked to its end."""
    from django.db import transaction

    from order_timeout.scans.giveback import give_back
    from order_timeout.timers.pausing import kind_named

    row = Pause.objects.create(timer="close", open_for="close", reason="PSP outage",
                               paused_at=timezone.now() - timedelta(seconds=100))
    order = make_order(in_seconds=-50)
    before = Order.objects.get(pk=order.pk).expires_at

    with transaction.atomic(), pytest.raises(PauseRefused, match="outside a transaction"):
        give_back(kind_named("close"), row, resume_at=timezone.now())

    assert Order.objects.get(pk=order.pk).expires_at == before


def test_a_shop_row_locked_by_a_payment_is_skipped_by_the_give_back_not_waited_on(transactional_db, settings):
    """A timer whose deadlines live in the app's table: the give-back locks each deadline and then its
    shop row; a payment holding the shop row (and about to touch its deadline) is never waited on."""
    from django.db import connection, connections

    from order_timeout.scans import giveback
    from order_timeout.timers.registry import registry
    from testproject.shop.models import PlainOrder

    kind = registry.get("plain-order-payment")
    waiting, paying = PlainOrder.objects.create(), PlainOrder.objects.create()
    for row in (waiting, paying):
        kind.set_deadline(row, timezone.now() - timedelta(seconds=30))
    Pause.objects.create(timer="plain-order-payment", open_for="plain-order-payment", reason="PSP outage",
                         paused_at=timezone.now() - timedelta(seconds=100))
    payment = connections.create_connection("default")
    try:
        payment.set_autocommit(False)
        with payment.cursor() as cursor:  # the payment's transaction holds the shop's row
            cursor.execute(f"SELECT id FROM {PlainOrder._meta.db_table} WHERE id = %s FOR UPDATE", [paying.pk])
        monkey = giveback.BUSY_ROUNDS
        giveback.BUSY_ROUNDS = 1
        try:
            command("order_timeout_resume", "--timer", "plain-order-payment", "--give-back")
        finally:
            giveback.BUSY_ROUNDS = monkey
        payment.rollback()
    finally:
        payment.close()
        connection.close()

    assert Pause.objects.get().given_back_rows == 1


def test_a_queue_rebuilt_during_a_pause_is_closed_at_once_after_the_resume(make_order, consumer, queue):
    """Redis lost the queue while the close was paused: the rebuild puts its overdue members back (the
    flags keep every claim off them), so the resume closes them within a look, not a scan later."""
    from order_timeout.scans.recovery import QueueRecovery

    worker = consumer()
    recovery = QueueRecovery(worker.queue, worker.queues, worker.kinds)
    assert recovery.run()  # the queues' epochs set up, as a consumer's first beat does
    paused()
    due = make_order(in_seconds=-5)
    queue.client.flushdb()
    assert recovery.run()

    command("order_timeout_resume")
    consumer().run(once=True)

    assert (state(due), expiries(due)) == ("closed", 1)
