"""``order_timeout_backfill --timer NAME``: a column timer's existing rows into its queue at once.

Rows that were pending before their timer was declared (or written by ``bulk_create()`` and
``update()``, which send no signals) had no member in Redis: ``order_timeout_compensate
--rebuild`` put back only the future ones, and the overdue ones waited for a scan past
``COMPENSATION_GRACE``. The backfill schedules every pending row with a deadline, the due ones
due now, the future ones at their deadlines, with the queue's own rule: a member Redis holds
only ever moves earlier, and one a consumer has in hand (leased, or due and waiting for its
retry) keeps its time.

Then what the commands say runs for the rows they make due: a timer's own receiver, not the
order close's ``order_expired``.
"""

from __future__ import annotations

import io
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db.models import F, Q
from django.utils import timezone

from order_timeout import timers
from order_timeout.consumer import Consumer
from order_timeout.models import DeadLetter
from order_timeout.timers.members import deadline_score
from order_timeout.timers.registry import registry
from testproject.saleorlike.expiry import UnconfirmedOrderExpires
from testproject.saleorlike.models import Channel, Order as SaleorOrder, OrderStatus
from testproject.shop.models import Checkout, Return, ShopOrder, StockRecord, StockReservation

from .helpers import pending_count, score_of

pytestmark = pytest.mark.django_db(transaction=True)

LAPSES = "reservation-lapses"
COMPLETES = "complete-after-delivery"


def backfill(*args: str) -> str:
    out = io.StringIO()
    call_command("order_timeout_backfill", *args, stdout=out)
    return out.getvalue()


@pytest.fixture
def lapses_queue(queue: Any) -> Any:
    return queue.of_kind(registry.get(LAPSES).key_space)


@pytest.fixture
def stock(db: Any) -> StockRecord:
    return StockRecord.objects.create(num_in_stock=100, num_allocated=0)


def reservations(stock: StockRecord, *deadlines: datetime | None, state: str = "held") -> list[StockReservation]:
    """Reservations made as a data migration or an import makes them: ``bulk_create()``, no signal,
    so none reaches Redis."""
    checkout = Checkout.objects.create()
    made = StockReservation.objects.bulk_create([
        StockReservation(stockrecord=stock, checkout=checkout, quantity=1, state=state, expires_at=at)
        for at in deadlines])
    StockRecord.objects.filter(pk=stock.pk).update(num_allocated=F("num_allocated") + len(made))
    # PostgreSQL returns the keys of bulk_create, MariaDB does not: read them back.
    return list(StockReservation.objects.filter(checkout=checkout).order_by("pk"))


def member_score(queue: Any, row: Any) -> int | None:
    return score_of(queue, str(row.pk))


def serve(name: str) -> Any:
    """One consumer run over this timer alone, on the database's clock."""
    return Consumer(kinds=[registry.get(name)]).run(once=True)


# -- what it schedules -----------------------------------------------------------------------


def test_a_column_timers_existing_rows_are_scheduled_the_due_ones_due_now(stock, lapses_queue):
    now = timezone.now()
    overdue = reservations(stock, now - timedelta(days=2), now - timedelta(minutes=5))
    future = reservations(stock, now + timedelta(hours=1))
    assert pending_count(lapses_queue) == 0

    text = backfill("--timer", LAPSES)

    for row in [*overdue, *future]:
        assert member_score(lapses_queue, row) == deadline_score(row.expires_at)
    assert "3 pending stock reservations of timer reservation-lapses have a deadline; 3 put in Redis" in text
    assert "2 of them are overdue at once" in text


def test_the_consumer_acts_on_the_backfilled_due_rows_at_once_and_leaves_the_future_ones(stock, lapses_queue):
    now = timezone.now()
    (overdue,) = reservations(stock, now - timedelta(days=2))
    (future,) = reservations(stock, now + timedelta(hours=1))

    backfill("--timer", LAPSES)
    stats = serve(LAPSES)

    overdue.refresh_from_db()
    future.refresh_from_db()
    stock.refresh_from_db()
    assert stats.of(LAPSES).acted == 1
    assert (overdue.state, future.state) == ("released", "held")
    assert stock.num_allocated == 1  # the lapsed one's stock came back, through fire()
    assert member_score(lapses_queue, future) == deadline_score(future.expires_at)


def test_rows_no_longer_pending_and_rows_without_a_deadline_are_left_out(stock, lapses_queue):
    now = timezone.now()
    used = reservations(stock, now - timedelta(days=1), state="used")
    undated = reservations(stock, None)

    text = backfill("--timer", LAPSES)

    assert pending_count(lapses_queue) == 0
    assert member_score(lapses_queue, used[0]) is None and member_score(lapses_queue, undated[0]) is None
    assert "0 pending stock reservations of timer reservation-lapses have a deadline" in text


def test_a_delivered_order_completes_unless_a_return_is_open(queue):
    """The shop's other column timer, on an order model with the order close's own columns."""
    now = timezone.now()
    ShopOrder.objects.bulk_create([
        ShopOrder(number=number, status="Delivered", completes_at=now - timedelta(days=1))
        for number in ("kept", "returned")])
    kept, returned = (ShopOrder.objects.get(number=number) for number in ("kept", "returned"))
    Return.objects.create(order=returned)
    completing = queue.of_kind(registry.get(COMPLETES).key_space)

    text = backfill("--timer", COMPLETES)

    assert member_score(completing, kept) == deadline_score(kept.completes_at)
    assert member_score(completing, returned) is None
    serve(COMPLETES)
    assert ShopOrder.objects.get(pk=kept.pk).status == "Complete"
    assert ShopOrder.objects.get(pk=returned.pk).status == "Delivered"
    assert "1 pending shop orders of timer complete-after-delivery have a deadline; 1 put in Redis" in text


def test_the_rows_are_walked_a_chunk_at_a_time(stock, lapses_queue, settings):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "COMPENSATION_CHUNK": 2}
    now = timezone.now()
    rows = reservations(stock, *(now + timedelta(minutes=minutes) for minutes in range(-3, 4)))

    backfill("--timer", LAPSES)

    assert [member_score(lapses_queue, row) for row in rows] == [deadline_score(row.expires_at) for row in rows]


# -- what Redis holds already ----------------------------------------------------------------


def test_a_member_in_redis_keeps_its_score_unless_the_rows_deadline_is_earlier(stock, lapses_queue):
    now = timezone.now()
    earlier, later = reservations(stock, now + timedelta(hours=1), now + timedelta(hours=2))
    ahead_of_row = deadline_score(earlier.expires_at) - 60_000
    behind_row = deadline_score(later.expires_at) + 60_000
    lapses_queue.schedule({str(earlier.pk): ahead_of_row, str(later.pk): behind_row})

    text = backfill("--timer", LAPSES)

    assert member_score(lapses_queue, earlier) == ahead_of_row  # the consumer re-reads the row then
    assert member_score(lapses_queue, later) == deadline_score(later.expires_at)
    assert "0 put in Redis, 1 moved earlier to their deadlines, 1 already there" in text


def test_a_due_row_a_consumer_is_retrying_keeps_its_retry_time(stock, lapses_queue):
    """Pulled to its deadline it would be retried at once, its backoff spent for nothing."""
    (row,) = reservations(stock, timezone.now() - timedelta(minutes=10))
    retry_at = deadline_score(timezone.now() + timedelta(seconds=60))
    lapses_queue.schedule({str(row.pk): retry_at})

    backfill("--timer", LAPSES)

    assert member_score(lapses_queue, row) == retry_at


def test_a_leased_row_is_left_to_its_consumer(stock, lapses_queue):
    (row,) = reservations(stock, timezone.now() - timedelta(minutes=10))
    lapses_queue.client.zadd(lapses_queue.shard_for(str(row.pk)).keys.leased,
                             {str(row.pk): deadline_score(timezone.now() + timedelta(seconds=30))})

    text = backfill("--timer", LAPSES)

    assert member_score(lapses_queue, row) is None
    assert "1 already there" in text


def test_an_open_dead_letter_is_left_to_staff(stock, lapses_queue):
    buried, fresh = reservations(stock, *[timezone.now() - timedelta(hours=1)] * 2)
    now = timezone.now()
    DeadLetter.objects.create(order_model=StockReservation._meta.label, order_id=str(buried.pk), timer=LAPSES,
                              attempts=4, error_type="RuntimeError", first_failed_at=now, last_failed_at=now)

    text = backfill("--timer", LAPSES)

    assert member_score(lapses_queue, buried) is None
    assert member_score(lapses_queue, fresh) == deadline_score(fresh.expires_at)
    assert "1 wait as open dead letters and were left to staff." in text


def test_a_dry_run_says_what_it_would_do_and_leaves_redis_alone(stock, lapses_queue):
    now = timezone.now()
    reservations(stock, now - timedelta(days=1), now + timedelta(days=1))

    text = backfill("--timer", LAPSES, "--dry-run")

    assert pending_count(lapses_queue) == 0
    assert "2 pending stock reservations of timer reservation-lapses have a deadline; 2 would be put in Redis" in text
    assert "1 of them would be overdue at once" in text


# -- what it refuses -------------------------------------------------------------------------


def test_a_timer_whose_deadlines_live_in_the_apps_table_is_refused_with_where_to_go():
    with pytest.raises(CommandError) as refused:
        backfill("--timer", "plain-order-payment")

    assert "order_timeout_redate --timer plain-order-payment" in str(refused.value)
    assert "set_deadline()" in str(refused.value)


def test_an_unknown_timer_is_refused_with_the_declared_ones():
    with pytest.raises(CommandError, match="no declared timer named 'nope'") as refused:
        backfill("--timer", "nope")

    assert "'reservation-lapses', 'complete-after-delivery', 'plain-order-payment'" in str(refused.value)


@pytest.mark.parametrize("args, message", [
    (["--timer", LAPSES, "--in", "60"], "not allowed with argument"),
    (["--timer", LAPSES, "--timeout", "60"], "--timeout goes with --from-field"),
])
def test_options_that_do_not_go_together_are_command_errors(args, message):
    with pytest.raises(CommandError, match=message):
        backfill(*args)


# -- what the commands say runs for the rows they make due ----------------------------------


class LapsesWithoutReceiver(timers.Timer):
    """A timer of ``values`` alone: no fire() to name."""

    name = "lapses-without-receiver"
    deadline = "expires_at"
    pending = Q(state="held")
    values = {"state": "released"}


@pytest.fixture
def values_only(redis_client: Any) -> Any:
    registry.register(StockReservation, LapsesWithoutReceiver)
    try:
        yield registry.get(LapsesWithoutReceiver.name)
    finally:
        registry.unregister(LapsesWithoutReceiver.name)


def test_the_backfill_names_the_timers_own_receiver_not_order_expired(stock):
    reservations(stock, timezone.now() - timedelta(days=1))

    text = backfill("--timer", LAPSES)

    assert "the consumer acts on them as soon as they are scheduled (timer reservation-lapses: its values " \
           "are written and ReservationLapses.fire() runs for them)." in text
    assert "order_expired" not in text


def test_a_timer_without_fire_is_said_to_write_its_values(stock, values_only):
    reservations(stock, timezone.now() - timedelta(days=1))

    text = backfill("--timer", values_only.name)

    assert "(timer lapses-without-receiver: its values are written: state)." in text
    assert "fire()" not in text and "order_expired" not in text


@pytest.fixture
def expiry(redis_client: Any) -> Any:
    registry.register(SaleorOrder, UnconfirmedOrderExpires)
    try:
        yield registry.get(UnconfirmedOrderExpires.name)
    finally:
        registry.unregister(UnconfirmedOrderExpires.name)


def test_a_redate_of_a_timer_names_its_fire_and_its_rows_not_order_expired_and_orders(expiry):
    channel = Channel.objects.create(slug="default-channel", expire_orders_after=60)
    order = SaleorOrder.objects.create(channel=channel, created_at=timezone.now() - timedelta(minutes=45))
    order.status = OrderStatus.UNCONFIRMED
    order.save()
    Channel.objects.filter(pk=channel.pk).update(expire_orders_after=30)  # now past its window
    out = io.StringIO()

    call_command("order_timeout_redate", "--timer", expiry.name, "--dry-run", stdout=out)

    text = out.getvalue()
    assert text.startswith("1 pending orders of timer saleor-order-expiry looked at; 1 would change")
    assert "(timer saleor-order-expiry: its values are written and UnconfirmedOrderExpires.fire() runs " \
           "for them)" in text
    assert "order_expired" not in text


# The window DEADLINE_POLICY gives an order, as staff set it (the test below shortens it).
WINDOW = {"orders": timedelta(hours=1)}


def by_window(order: Any) -> datetime:
    """DEADLINE_POLICY for the test below."""
    return order.created_at + WINDOW["orders"]


def test_a_redate_of_orders_still_names_order_expired(settings, queue, monkeypatch):
    from order_timeout.models import Order

    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "DEADLINE_POLICY": "tests.test_backfill_timers.by_window"}
    Order.objects.create()
    monkeypatch.setitem(WINDOW, "orders", -timedelta(hours=1))  # past it now
    out = io.StringIO()

    call_command("order_timeout_redate", "--dry-run", stdout=out)

    assert "1 open orders looked at" in out.getvalue()
    assert "the consumer closes them as soon as they are scheduled (order_expired fires for each)" in out.getvalue()
