"""Notices: written in the transaction of the change they tell of, delivered at least once after it.

Tried on bc07ed2 as a shop would write it: an ``order_expired`` receiver sending its e-mail from
``transaction.on_commit()``, and a consumer killed right after the close's COMMIT: every order
closed, 3 of 5 notices ever sent, and nothing anywhere said so. A notice is a row of
``order_timeout.Notice`` now, written by ``notify()`` in the close's transaction, delivered by
the one lifecycle (``timers/notices.py``) outside any transaction, retried, dead-lettered.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.db.models import Q
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from order_timeout import notify, notify_many
from order_timeout.models import DeadLetter, Notice
from order_timeout.notices import NoticeRefused, Rejected, handlers
from order_timeout.notices.writing import MAX_PAYLOAD_BYTES
from order_timeout.scans.compensation import compensate
from order_timeout.timers import staff
from order_timeout.timers.members import now_score
from order_timeout.timers.registry import NOTICES

from .conftest import wait_for
from .helpers import leased_members, score_of

pytestmark = pytest.mark.django_db(transaction=True)


class Recorder:
    """A handler that records each delivery it is given (and can be told to fail)."""

    def __init__(self) -> None:
        self.deliveries: list[Any] = []
        self.failing: BaseException | None = None
        self.in_transaction: list[bool] = []
        self.lock = threading.Lock()

    def __call__(self, delivery: Any) -> None:
        with self.lock:
            self.deliveries.append(delivery)
            self.in_transaction.append(connection.in_atomic_block)
        if self.failing is not None:
            raise self.failing

    @property
    def keys(self) -> list[str]:
        return [delivery.key for delivery in self.deliveries]


@pytest.fixture
def recorder(redis_client) -> Any:
    recorder = Recorder()
    handlers.declare("test-recorder", recorder, timeout=5)
    yield recorder
    handlers.forget("test-recorder")


@pytest.fixture
def delivering(consumer, clock):
    """A consumer of the notices alone, on the test's clock, first moved on to now: a notice is due
    when ``notify()`` wrote it, by the host's clock."""

    def build():
        clock.current = max(clock.current, timezone.now())
        return consumer(kinds=[NOTICES])

    return build


@pytest.fixture
def notice_queue(queue):
    return queue.of_kind(NOTICES.key_space)


def test_a_notice_is_delivered_after_its_commit_with_its_key_and_object(recorder, delivering, make_order):
    order = make_order(in_seconds=600)
    with transaction.atomic():
        notice = notify("test-recorder", order, key=f"order-expired:{order.pk}")

    stats = delivering().run(once=True)

    delivery, = recorder.deliveries
    assert (delivery.key, delivery.attempt, delivery.object) == (f"order-expired:{order.pk}", 1, order)
    assert delivery.payload == {"model": order._meta.label, "pk": str(order.pk)}
    notice.refresh_from_db()
    assert (notice.state, notice.attempts, stats.of(NOTICES.name).delivered) == (Notice.State.DELIVERED, 1, 1)
    assert notice.delivered_at is not None


def test_a_notice_of_a_rolled_back_transaction_never_exists_nor_is_delivered(recorder, delivering, notice_queue,
                                                                            clock, settings):
    class Undone(Exception):
        pass

    with pytest.raises(Undone), transaction.atomic():
        notify("test-recorder", {"order": 1})
        raise Undone
    worker = delivering()
    worker.run(once=True)
    assert not Notice.objects.exists() and recorder.deliveries == []

    # Its member, announced before the commit a lease late, names no row: the first look drops it.
    clock.advance(settings.ORDER_TIMEOUT.get("LEASE_SECONDS", 30) + 1)
    worker.run(once=True)

    assert recorder.deliveries == [] and notice_queue.stats(now_score(clock())).pending == 0


def test_a_handler_runs_outside_any_transaction(recorder, delivering):
    notify("test-recorder", {"sms": "+4912345"})

    delivering().run(once=True)

    assert recorder.in_transaction == [False]


@pytest.mark.parametrize(("handler", "payload", "problem"), [
    ("nobody-declared-me", {}, "no notice handler named 'nobody-declared-me'"),
    ("test-recorder", {"at": object()}, "payload must be JSON"),
    ("test-recorder", {"text": "x" * MAX_PAYLOAD_BYTES}, "over the 65,536 a notice stores"),
])
def test_notify_refuses_what_cannot_be_stored_inside_the_shops_transaction(recorder, handler, payload, problem):
    with pytest.raises(NoticeRefused, match=problem), transaction.atomic():
        notify(handler, payload)

    assert not Notice.objects.exists()


def test_a_notice_written_before_the_app_is_ready_is_refused_with_its_transaction(recorder, monkeypatch):
    """The notices sit below the timers that queue them; the timers hand them the way in at the
    app's start. Without it a notice would be written and never queued: it is refused instead."""
    from django.core.exceptions import ImproperlyConfigured

    from order_timeout.notices import writing

    monkeypatch.setattr(writing, "_queue_written", None)
    with pytest.raises(ImproperlyConfigured, match="INSTALLED_APPS"), transaction.atomic():
        notify("test-recorder", {"order": 1})

    assert not Notice.objects.exists()


def test_notify_many_writes_one_insert_for_the_batch(recorder, make_order):
    orders = [make_order(in_seconds=600) for _ in range(25)]

    with transaction.atomic(), CaptureQueriesContext(connection) as queries:
        notices = notify_many("test-recorder", orders, key=lambda order: f"expired:{order.pk}")

    inserts = [query["sql"] for query in queries.captured_queries if query["sql"].lstrip().upper().startswith("INSERT")]
    assert len(inserts) == 1 and len(notices) == 25
    assert {notice.key for notice in notices} == {f"expired:{order.pk}" for order in orders}


def test_a_failing_delivery_is_retried_by_its_own_delays_then_a_dead_letter(recorder, delivering, clock, settings,
                                                                           notice_queue):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "NOTICE_RETRY_DELAYS": [10, 60]}
    recorder.failing = ConnectionError("the SMTP server is down")
    notice = notify("test-recorder", {"to": "buyer@example.com"}, key="mail-1")
    worker = delivering()

    worker.run(once=True)
    assert score_of(notice_queue, str(notice.pk)) == now_score(clock()) + 10_000
    clock.advance(10)
    worker.run(once=True)
    clock.advance(60)
    worker.run(once=True)

    assert recorder.keys == ["mail-1"] * 3 and [d.attempt for d in recorder.deliveries] == [1, 2, 3]
    letter = DeadLetter.objects.get(timer=NOTICES.name, order_id=str(notice.pk), resolved_at__isnull=True)
    assert letter.attempts == 3 and "the SMTP server is down" in letter.last_error
    notice.refresh_from_db()
    assert (notice.state, notice.attempts) == (Notice.State.PENDING, 3)


def test_a_notice_the_target_refused_for_good_is_a_dead_letter_at_once_with_its_answer(recorder, delivering):
    recorder.failing = Rejected("the webhook answered 400", answer="400 Bad Request: unknown order")
    notice = notify("test-recorder", {"order": 7})

    delivering().run(once=True)

    assert DeadLetter.objects.filter(timer=NOTICES.name, order_id=str(notice.pk), attempts=1).exists()
    notice.refresh_from_db()
    assert notice.last_answer == "400 Bad Request: unknown order"


def test_a_failed_notice_fails_alone(recorder, delivering):
    def some_fail(delivery):
        recorder(delivery)
        if delivery.payload["n"] % 2:
            raise ConnectionError("refused")

    handlers.declare("test-odd-fail", some_fail)
    try:
        notices = notify_many("test-odd-fail", [{"n": n} for n in range(6)])
        stats = delivering().run(once=True)
    finally:
        handlers.forget("test-odd-fail")

    states = dict(Notice.objects.values_list("pk", "state"))
    assert [states[notice.pk] for notice in notices] == [Notice.State.DELIVERED, Notice.State.PENDING] * 3
    assert (stats.of(NOTICES.name).delivered, stats.of(NOTICES.name).failed) == (3, 3)


def test_a_notice_due_later_is_dropped_when_its_object_no_longer_meets_its_handlers_condition(
        redis_client, delivering, make_order, order_model):
    """ "Re-send the SMS in a moment unless it was paid meanwhile": asked when the notice is due (by
    the database's clock, as every deadline: so this test waits the second it gives them)."""
    sent: list[Any] = []
    handlers.declare("test-resend", sent.append, model=order_model, pending=order_model.unpaid_q())
    try:
        paid, unpaid = make_order(in_seconds=600), make_order(in_seconds=600)
        due = timezone.now() + timedelta(seconds=1)
        notify_many("test-resend", [paid, unpaid], at=due)
        paid.mark_paid()
        worker = delivering()
        worker.run(once=True)
        assert sent == []  # not due yet
        time.sleep(max((due - timezone.now()).total_seconds(), 0) + 0.05)
        delivering().run(once=True)
    finally:
        handlers.forget("test-resend")

    assert [delivery.object.pk for delivery in sent] == [unpaid.pk]
    assert dict(Notice.objects.values_list("object_id", "state")) == {
        str(paid.pk): Notice.State.DROPPED, str(unpaid.pk): Notice.State.DELIVERED}


def test_a_notice_redis_lost_is_delivered_by_the_scan(recorder, settings, notice_queue):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "COMPENSATION_GRACE": 0}
    notice = notify("test-recorder", {"webhook": "order.expired"})
    notice_queue.delete_all_keys()  # Redis flushed with the notice pending

    result = compensate()

    assert recorder.keys == [notice.key] and result.timers[NOTICES.name].closed == 1
    notice.refresh_from_db()
    assert notice.state == Notice.State.DELIVERED


def test_the_scan_leaves_a_notice_a_consumer_claimed_while_the_scan_was_delivering(recorder, settings,
                                                                                   notice_queue):
    """Found by the fault run notices-slow-target: the scan looked at where a chunk's notices were in
    Redis once, then delivered them a claim's worth at a time; a slow target gave the consumers time
    to claim the later ones (back in Redis), and both delivered them. The scan takes each batch
    before it delivers it, and leaves what a consumer has in hand."""
    from order_timeout.timers.notices import DELIVERIES_AT_ONCE

    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "COMPENSATION_GRACE": 0}
    notices = notify_many("test-recorder", [{"n": n} for n in range(DELIVERIES_AT_ONCE + 5)])
    # Redis lost them, and has them back (the scan's own heal, a requeue): pending, long due.
    notice_queue.delete_all_keys()
    notice_queue.schedule({NOTICES.member(notice.pk): now_score(timezone.now()) - 60_000 for notice in notices})
    consumer_claimed: list[str] = []
    deliver = recorder.__call__

    def a_consumer_claims_the_rest_meanwhile(delivery):
        if not consumer_claimed:
            claim = notice_queue.shards[0].claim(now_score(timezone.now()), 100,
                                                 now_score(timezone.now()) + 30_000, "a-consumer:0")
            consumer_claimed.extend(claim.members)
        deliver(delivery)

    handlers.forget("test-recorder")
    handlers.declare("test-recorder", a_consumer_claims_the_rest_meanwhile, timeout=5)

    compensate()

    assert len(consumer_claimed) == 5
    assert len(recorder.keys) == DELIVERIES_AT_ONCE  # the consumer's five are its own to deliver
    assert sorted(leased_members(notice_queue)) == sorted(consumer_claimed)


def test_a_dead_lettered_notice_is_requeued_or_dropped_by_staff(recorder, delivering, settings, admin_user):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "NOTICE_RETRY_DELAYS": []}
    recorder.failing = ConnectionError("down")
    first, second = notify_many("test-recorder", [{"n": 1}, {"n": 2}])
    delivering().run(once=True)
    letters = {letter.order_id: letter for letter in DeadLetter.objects.filter(timer=NOTICES.name)}
    assert set(letters) == {str(first.pk), str(second.pk)}

    recorder.failing = None
    staff.requeue([letters[str(first.pk)]], admin_user, timezone.now())
    assert staff.drop([letters[str(second.pk)]], admin_user, timezone.now())["dropped"] == 1
    delivering().run(once=True)

    assert dict(Notice.objects.values_list("pk", "state")) == {first.pk: Notice.State.DELIVERED,
                                                               second.pk: Notice.State.DROPPED}
    assert set(DeadLetter.objects.values_list("resolution", flat=True)) == {
        DeadLetter.Resolution.REQUEUED, DeadLetter.Resolution.DROPPED}


def test_the_status_command_counts_the_notices(recorder, make_order):
    import json
    from io import StringIO

    from django.core.management import call_command

    notify_many("test-recorder", [{"n": n} for n in range(3)])
    out = StringIO()
    call_command("order_timeout_status", "--json", stdout=out)

    figures = json.loads(out.getvalue())["timers"][NOTICES.name]
    assert (figures["pending"], figures["due_unclaimed"]) == (3, 3)


def test_a_close_and_its_notice_commit_together(recorder, make_order, consumer, receiver, delivering):
    """The shop's receiver writes the notice in the close's transaction: closed and told, or neither."""

    @receiver
    def tell(sender, order, **kwargs):
        notify("test-recorder", order, key=f"order-expired:{order.pk}")

    orders = [make_order(in_seconds=-1) for _ in range(3)]
    consumer().run(once=True)
    delivering().run(once=True)

    assert sorted(recorder.keys) == sorted(f"order-expired:{order.pk}" for order in orders)
    assert Notice.objects.filter(handler="test-recorder", state=Notice.State.DELIVERED).count() == 3


def test_a_notice_handler_condition_needs_its_model(redis_client):
    from django.core.exceptions import ImproperlyConfigured

    with pytest.raises(ImproperlyConfigured, match="pending and model go together"):
        handlers.declare("test-half", print, pending=Q(pk=1))


def test_the_admin_lists_the_notices_and_counts_them_on_its_overview(recorder, admin_client):
    from django.urls import reverse

    notice = notify("test-recorder", {"n": 1}, key="listed")

    listing = admin_client.get(reverse("admin:order_timeout_notice_changelist"))
    overview = admin_client.get(reverse("admin:order_timeout_timeoutoverview_changelist"))

    assert listing.status_code == 200 and "listed" in listing.content.decode()
    assert admin_client.get(reverse("admin:order_timeout_notice_change", args=[notice.pk])).status_code == 200
    assert 'id="timer-notices"' in overview.content.decode()


def test_a_burst_of_closes_goes_before_the_notices_it_writes(recorder, make_order, consumer, receiver, clock):
    """Seen in the benchmark (issue 26): the notices' lane had every other claim during a burst of
    closes, at 0.30x the plain burst's rate. The closes due go first; their notices follow."""
    from order_timeout.timers.registry import ORDER_TIMEOUT

    @receiver
    def tell(sender, order, **kwargs):
        notify("test-recorder", order, key=f"order-expired:{order.pk}")

    orders = [make_order(in_seconds=-1) for _ in range(9)]
    worker = consumer(kinds=[ORDER_TIMEOUT, NOTICES], batch_size=3)
    # Past the notices' time too: notify() dates them by the host's clock.
    clock.current = max(clock.current, timezone.now()) + timedelta(seconds=5)

    kinds = []
    for _ in range(10):
        # What a running consumer's wake-ups tell it (each notice's schedule publishes one),
        # read here before each claim: in a loop of run_once() nobody listens.
        worker.rota.refreshed(worker.lanes.next_scores())
        claim = worker.run_once()
        if claim.members:
            kinds.append(worker.kind_of(claim)[0].name)

    # Three batches of closes, then their notices (the test shop's own e-mails among them).
    assert kinds[:3] == [ORDER_TIMEOUT.name] * 3 and set(kinds[3:]) == {NOTICES.name}
    assert sorted(recorder.keys) == sorted(f"order-expired:{order.pk}" for order in orders)


def test_a_consumer_deep_in_a_backlog_hears_a_new_notice_within_its_yield(recorder, make_order, receiver,
                                                                            monkeypatch):
    """Found with the burst test above: a consumer made its wake-up listener only as it first went
    to sleep, so one that started into a backlog, having found the notices' lane empty, heard of a
    new notice only when the whole backlog was closed. It listens from its start now, and a notice
    waits behind the closes for YIELD_SECONDS at most."""
    from order_timeout.consumer import Consumer
    from order_timeout.timers.registry import ORDER_TIMEOUT

    from .conftest import running, wait_for

    # The one notice of the test (the test shop's e-mail for each close would queue before it).
    monkeypatch.setenv("SHOP_EMAIL_NOTICES", "0")

    @receiver
    def slow_shop(sender, order, **kwargs):
        time.sleep(0.03)

    orders = [make_order(in_seconds=-1) for _ in range(200)]
    worker = Consumer(kinds=[ORDER_TIMEOUT, NOTICES], batch_size=1, follow_database_clock=False)
    with running(worker):
        # Past a second of closes: the notices' lane had its turn, and was found empty.
        wait_for(lambda: worker.stats.closed >= 40)
        with transaction.atomic():
            notify("test-recorder", {"n": 1}, key="mid-backlog")

        wait_for(lambda: recorder.keys == ["mid-backlog"])
        model = type(orders[0])
        still_open = model.objects.filter(model.unpaid_q(), pk__in=[order.pk for order in orders]).count()

    # Delivered while the backlog was still being closed, not after it.
    assert 0 < still_open


def test_notify_many_reads_the_keys_back_where_the_database_returns_none(recorder, make_order, monkeypatch):
    """MySQL returns no keys from a multi-row INSERT (MariaDB and PostgreSQL do): read back by key."""
    orders = [make_order(in_seconds=600) for _ in range(4)]
    monkeypatch.setattr(type(connection.features), "can_return_rows_from_bulk_insert", False)

    with transaction.atomic():
        notices = notify_many("test-recorder", orders, key=lambda order: f"expired:{order.pk}")

    stored = dict(Notice.objects.values_list("key", "pk"))
    assert [(notice.key, notice.pk) for notice in notices] == [(f"expired:{order.pk}", stored[f"expired:{order.pk}"])
                                                                for order in orders]


def test_a_written_notice_reads_as_its_row_does(recorder, make_order):
    order = make_order(in_seconds=600)

    notice, = notify_many("test-recorder", [order], key=lambda order: "k")
    stored = Notice.objects.get(pk=notice.pk)

    fields = [field.attname for field in Notice._meta.concrete_fields]
    assert {name: getattr(notice, name) for name in fields} == {name: getattr(stored, name) for name in fields}
    assert notice._state.adding is False


def test_the_notices_of_a_batch_are_rows_in_the_order_of_their_items(recorder):
    written = notify_many("test-recorder", [{"n": n} for n in range(5)], key=lambda item: f"n-{item['n']}")

    assert [notice.key for notice in written] == [f"n-{n}" for n in range(5)]
    assert [notice.key for notice in written[1:3]] == ["n-1", "n-2"] and written[-1].key == "n-4"
    assert written[0] is written[0] and written[0].payload == {"n": 0}
    with pytest.raises(IndexError):
        written[5]


def test_a_batch_given_up_before_its_deliveries_is_handed_over_not_raised(recorder, delivering, settings,
                                                                          monkeypatch):
    """Seen in a loaded CI run: a batch of notices outran BATCH_TIME_LIMIT while still in its short
    transaction (before any delivery), the guard ended its session, and the next statement's lost
    connection was raised out of the consumer (under ``--once``, exit 1; in a long run, counted as
    a database outage with its backoff), though the database was fine and the batch, given up, had
    been handed over. Its keys are abandoned, as a batch of closes given up is, and delivered once
    by the claim that takes them over."""
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "BATCH_TIME_LIMIT": 0.3}
    begin = NOTICES.begin
    stalled: list[bool] = []

    def stalled_once(*args: Any, **kwargs: Any) -> Any:
        if not stalled:  # the first batch only: in its transaction until the guard gives it up
            stalled.append(True)
            wait_for(lambda: worker.watch.last is not None and worker.watch.last.given_up.is_set())
            time.sleep(0.3)  # and its end of the session lands
        return begin(*args, **kwargs)

    monkeypatch.setattr(NOTICES, "begin", stalled_once)
    handlers.declare("test-recorder-2", recorder, timeout=30)
    try:
        notices = notify_many("test-recorder-2", [{"n": n} for n in range(3)])
        worker = delivering()
        worker.run(once=True)
        # The members handed over are due for the next claim (now, or a --once started later).
        wait_for(lambda: delivering().run(once=True) and Notice.objects.filter(
            pk__in=[n.pk for n in notices], state=Notice.State.DELIVERED).count() == 3)
    finally:
        handlers.forget("test-recorder-2")

    assert stalled == [True]
    assert sorted(delivery.payload["n"] for delivery in recorder.deliveries) == [0, 1, 2]


def test_notices_delivered_past_the_batch_time_limit_are_recorded_on_a_new_session(recorder, delivering,
                                                                                    settings):
    """Seen in a loaded CI run: the deliveries of a batch outran BATCH_TIME_LIMIT, the lease guard
    gave it up by ending its database session, and the write that records what was delivered then
    met the lost connection: the consumer raised (under ``--once``, exited 1) and the notices,
    sent, stayed pending, to be sent again. What the handlers did is recorded on a new session."""
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "BATCH_TIME_LIMIT": 0.3}

    def given_up() -> bool:
        batch = worker.watch.last
        return batch is not None and batch.given_up.is_set()

    def slow_target(delivery: Any) -> None:
        recorder(delivery)
        wait_for(given_up)  # the guard gives the batch up while the deliveries are out,
        time.sleep(0.3)  # and its end of the session lands

    handlers.declare("test-slow-target", slow_target, timeout=30)
    try:
        notices = notify_many("test-slow-target", [{"n": n} for n in range(3)])
        worker = delivering()
        stats = worker.run(once=True)
    finally:
        handlers.forget("test-slow-target")

    assert len(recorder.deliveries) == 3
    assert set(Notice.objects.filter(pk__in=[n.pk for n in notices]).values_list("state", flat=True)) == {
        Notice.State.DELIVERED}
    assert stats.of(NOTICES.name).delivered == 3
