"""A shop adopts the app on the order model it already has: its own status field, values and pipeline.

``ShopOrder`` stands in for an e-commerce framework's order: a 100-character
``status`` with 'Pending' -> 'Paid' -> 'Being processed' -> 'Complete' /
'Cancelled', a status-change history, stock allocated per line, its own Meta
and its own admin.
"""

from __future__ import annotations

import importlib
import io
import logging
import threading
from datetime import timedelta
from decimal import Decimal

import pytest
from django.core.management import CommandError, call_command
from django.db import connection, models, transaction
from django.db.migrations.executor import MigrationExecutor
from django.db.migrations.operations import AddField, AddIndex
from django.db.models import F
from django.test.utils import isolate_apps
from django.urls import reverse
from django.utils import timezone

from order_timeout.checks import check_status_declarations
from order_timeout.consumer import Consumer
from order_timeout.exceptions import OrderClosed, StaleOrderStatus
from order_timeout.models import DeadLetter, TimeoutOrderMixin
from order_timeout.reporting.health import measure
from order_timeout.scans.compensation import compensate
from order_timeout.signals import order_expired
from order_timeout.timers.members import deadline_score
from testproject.shop.models import Line, OrderStatusChange, ShopOrder, StockRecord

from .conftest import running, time_left, wait_for
from .helpers import expiries, keys_for, lock_waits, pending_count, score_of, state

pytestmark = pytest.mark.django_db(transaction=True)

use_shop = pytest.mark.parametrize("order_model", ["shop.ShopOrder"], indirect=True, ids=["ShopOrder"])


def history(order: ShopOrder) -> list[tuple[str, str]]:
    return list(OrderStatusChange.objects.filter(order=order).order_by("pk")
                .values_list("old_status", "new_status"))


# -- what adopting changes in the shop's model ----------------------------------


def test_the_mixin_leaves_the_shops_status_field_and_meta_alone():
    status = ShopOrder._meta.get_field("status")

    assert (status.max_length, status.default, status.choices) == (100, "Pending", None)
    assert ShopOrder._meta.ordering == ["-date_placed"]
    assert ShopOrder._meta.verbose_name == "shop order"
    assert [list(index.fields) for index in ShopOrder._meta.indexes] == [
        ["number"], ["status", "expires_at"]]
    assert ShopOrder._meta.get_field("expires_at").null


def test_the_adoption_migration_only_adds_columns_and_an_index():
    migration = importlib.import_module("testproject.shop.migrations.0003_order_timeouts").Migration

    kinds = [(type(op).__name__, getattr(op, "name", None)) for op in migration.operations]

    assert kinds == [("AddField", "close_reason"), ("AddField", "closed_at"),
                     ("AddField", "expires_at"), ("AddIndex", None)]
    assert all(isinstance(op, AddField | AddIndex) for op in migration.operations)
    expires_at = next(op for op in migration.operations if getattr(op, "name", "") == "expires_at")
    assert expires_at.field.null and expires_at.field.default is models.NOT_PROVIDED


@pytest.fixture
def shop_before_timeouts():
    """The shop's schema as it was before the app was added; put back to the latest afterwards."""
    executor = MigrationExecutor(connection)
    latest = executor.loader.graph.leaf_nodes("shop")
    executor.migrate([("shop", "0002_shop_orders")])
    yield executor
    MigrationExecutor(connection).migrate(latest)


@use_shop
def test_adopting_on_a_table_with_existing_rows_applies_cleanly_and_schedules_nothing_until_the_backfill(
        order_model, queue, redis_client, shop_before_timeouts):
    executor = shop_before_timeouts
    legacy = executor.loader.project_state(("shop", "0002_shop_orders")).apps.get_model("shop", "ShopOrder")
    long_status = "Awaiting confirmation from the payment provider (manual review) ".ljust(100, ".")
    placed = timezone.now() - timedelta(days=3)
    legacy.objects.create(number="old-pending", status="Pending", date_placed=placed)
    legacy.objects.create(number="old-review", status=long_status, date_placed=placed)
    legacy.objects.create(number="old-complete", status="Complete", date_placed=placed)

    # The adoption migration (0003), and what the shop added since, over the old rows.
    MigrationExecutor(connection).migrate(executor.loader.graph.leaf_nodes("shop"))

    rows = {order.number: order for order in ShopOrder.objects.all()}
    assert rows["old-review"].status == long_status
    assert {order.expires_at for order in rows.values()} == {None}
    assert redis_client.dbsize() == 0
    Consumer().run(once=True)
    compensate()
    assert state(rows["old-pending"]) == "unpaid"
    assert measure().unpaid_without_deadline == 1

    out = io.StringIO()
    call_command("order_timeout_backfill", "--in", "3600", stdout=out)

    assert "1 unpaid orders have no deadline; 1 got one." in out.getvalue()
    rows["old-pending"].refresh_from_db()
    assert score_of(queue, str(rows["old-pending"].pk)) == deadline_score(rows["old-pending"].expires_at)
    assert pending_count(queue) == 1


# -- the shop's pipeline ----------------------------------------------------------


@use_shop
def test_a_new_shop_order_starts_pending_and_is_scheduled_at_the_default_timeout(order_model, queue,
                                                                                 settings):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "DEFAULT_TIMEOUT": 900}
    before = timezone.now()

    order = ShopOrder.objects.create(number="1001")

    assert order.status == "Pending"
    assert before + timedelta(seconds=900) <= order.expires_at
    assert score_of(queue, str(order.pk)) == deadline_score(order.expires_at)


@use_shop
def test_a_new_order_in_a_settled_status_gets_no_deadline_and_is_never_scheduled(order_model, queue):
    order = ShopOrder.objects.create(number="1002", status="Paid")

    assert order.expires_at is None
    assert score_of(queue, str(order.pk)) is None


@use_shop
def test_moving_a_paid_order_through_the_shops_pipeline_never_raises(make_order, queue):
    order = make_order(in_seconds=600)
    assert order.mark_paid() is True

    for status in ("Being processed", "Complete", "Archived"):
        order.set_status(status)

    assert ShopOrder.objects.get(pk=order.pk).status == "Archived"
    assert history(order) == [("Paid", "Being processed"), ("Being processed", "Complete"),
                              ("Complete", "Archived")]
    assert score_of(queue, str(order.pk)) is None


@use_shop
def test_a_settled_order_cannot_be_moved_back_into_an_unpaid_status(make_order, queue):
    order = make_order(in_seconds=600)
    order.mark_paid()

    order.status = "Pending"
    with pytest.raises(StaleOrderStatus, match="back to the unpaid status"):
        order.save()

    assert state(order) == "paid"
    assert score_of(queue, str(order.pk)) is None


# -- a status before unpaid (a draft, a quote, an unconfirmed checkout) ----------------------


@use_shop
def test_a_draft_entering_pending_gets_its_deadline_then_and_is_scheduled(order_model, queue, settings):
    """Saleor's draftOrderComplete: draft -> unconfirmed. The deadline runs from that move."""
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "DEFAULT_TIMEOUT": 900}
    order = ShopOrder.objects.create(number="1003", status="Draft")
    assert order.expires_at is None and score_of(queue, str(order.pk)) is None
    before = timezone.now()

    order.set_status("Pending")

    row = ShopOrder.objects.get(pk=order.pk)
    assert row.status == "Pending"
    assert before + timedelta(seconds=900) <= row.expires_at <= timezone.now() + timedelta(seconds=900)
    assert score_of(queue, str(order.pk)) == deadline_score(row.expires_at)
    assert history(order) == [("Draft", "Pending")]


@use_shop
def test_a_draft_entering_pending_through_update_fields_writes_its_deadline_too(order_model, queue):
    order = ShopOrder.objects.create(number="1004", status="Draft")

    order.status = "Pending"
    order.save(update_fields=["status"])

    row = ShopOrder.objects.get(pk=order.pk)
    assert row.expires_at is not None
    assert score_of(queue, str(order.pk)) == deadline_score(row.expires_at)


@use_shop
def test_a_draft_given_a_deadline_as_it_enters_pending_keeps_that_deadline(order_model, queue):
    order = ShopOrder.objects.create(number="1005", status="Draft")
    chosen = timezone.now() + timedelta(hours=3)

    order.status, order.expires_at = "Pending", chosen
    order.save()

    assert ShopOrder.objects.get(pk=order.pk).expires_at == chosen
    assert score_of(queue, str(order.pk)) == deadline_score(chosen)


@use_shop
def test_a_draft_that_stays_a_draft_is_never_scheduled_or_closed(order_model, queue, consumer):
    order = ShopOrder.objects.create(number="1006", status="Draft",
                                     expires_at=timezone.now() - timedelta(minutes=1))

    consumer().run(once=True)
    compensate(now=timezone.now() + timedelta(hours=1))

    assert ShopOrder.objects.get(pk=order.pk).status == "Draft"
    assert score_of(queue, str(order.pk)) is None


@use_shop
def test_a_row_never_scheduled_enters_pending_from_any_status_and_its_deadline_starts(order_model, queue):
    """A framework's fixtures create an order in its own first status and save it unpaid (Saleor's
    default, then "unconfirmed"): the row never went through the queue, so nothing is refused."""
    order = ShopOrder.objects.create(number="1007", status="Quote")
    before = timezone.now()

    order.status = "Pending"
    order.save()

    row = ShopOrder.objects.get(pk=order.pk)
    assert row.status == "Pending" and row.expires_at >= before + timedelta(seconds=1799)
    assert score_of(queue, str(order.pk)) == deadline_score(row.expires_at)


@use_shop
def test_a_row_scheduled_then_settled_is_refused_back_into_pending_and_the_error_says_so(order_model):
    order = ShopOrder.objects.create(number="1008")  # Pending: scheduled
    ShopOrder.objects.filter(pk=order.pk).update(status="Paid")
    stale = ShopOrder.objects.get(pk=order.pk)

    stale.status = "Pending"
    with pytest.raises(StaleOrderStatus, match=r"scheduled \(deadline .*\) and then settled as 'Paid'.*"
                                               "TIMEOUT_DRAFT_STATUSES"):
        stale.save()


@use_shop
def test_a_row_closed_by_its_deadline_is_refused_back_into_pending_and_the_error_says_so(make_order, consumer):
    order = make_order(in_seconds=-1)
    consumer().run(once=True)
    closed = ShopOrder.objects.get(pk=order.pk)

    closed.status = "Pending"
    with pytest.raises(StaleOrderStatus, match="closed by its deadline at .* is not reopened"):
        closed.save()


@use_shop
def test_a_late_payment_after_the_shops_cancelled_value_raises_order_closed(make_order, consumer):
    order = make_order(in_seconds=-1)
    consumer().run(once=True)
    assert ShopOrder.objects.get(pk=order.pk).status == "Cancelled"

    with pytest.raises(OrderClosed):
        order.mark_paid()
    with pytest.raises(OrderClosed):
        ShopOrder.objects.get(pk=order.pk).mark_paid()


@use_shop
def test_a_late_payment_through_the_shops_own_state_machine_raises_order_closed(make_order, consumer):
    """The shop's checkout still holds the copy it loaded while the order was pending."""
    checkout_copy = make_order(in_seconds=-1)
    consumer().run(once=True)

    with pytest.raises(OrderClosed):
        checkout_copy.set_status("Paid")

    assert ShopOrder.objects.get(pk=checkout_copy.pk).status == "Cancelled"


@use_shop
def test_mark_paid_is_false_for_an_order_settled_in_another_value(make_order):
    order = make_order(in_seconds=600)
    order.mark_paid()
    order.set_status("Being processed")

    assert ShopOrder.objects.get(pk=order.pk).mark_paid() is False
    assert ShopOrder.objects.get(pk=order.pk).status == "Being processed"


@use_shop
def test_a_stale_copy_cannot_move_a_closed_order_along_the_pipeline(make_order, consumer):
    dashboard_copy = make_order(in_seconds=-1)
    consumer().run(once=True)

    dashboard_copy.status = "Being processed"
    with pytest.raises(StaleOrderStatus, match="closed.*since this copy was loaded"):
        dashboard_copy.save()

    assert ShopOrder.objects.get(pk=dashboard_copy.pk).status == "Cancelled"


@use_shop
def test_a_copy_read_again_after_the_close_may_move_it_on(make_order, consumer):
    """refresh_from_db() is a read like any other: the copy saw the close, so its move is the shop's."""
    dashboard_copy = make_order(in_seconds=-1)
    consumer().run(once=True)

    dashboard_copy.refresh_from_db()
    dashboard_copy.set_status("Archived")

    assert ShopOrder.objects.get(pk=dashboard_copy.pk).status == "Archived"


@use_shop
def test_the_shop_may_move_a_closed_order_on_to_another_settled_value(make_order, consumer):
    order = make_order(in_seconds=-1)
    consumer().run(once=True)

    ShopOrder.objects.get(pk=order.pk).set_status("Archived")

    assert ShopOrder.objects.get(pk=order.pk).status == "Archived"


# -- the shop's own close, in the closing transaction ------------------------------


@use_shop
def test_an_expiry_writes_the_shops_status_change_and_releases_its_stock_in_the_close(
        make_order, consumer):
    stock = StockRecord.objects.create(num_in_stock=10, num_allocated=3)
    order = make_order(in_seconds=-1)
    Line.objects.create(order=order, stockrecord=stock, quantity=3)

    stats = consumer().run(once=True)

    assert stats.closed == 1 and state(order) == "closed"
    assert history(order) == [("Pending", "Cancelled")]
    stock.refresh_from_db()
    assert stock.num_allocated == 0


@use_shop
def test_batch_receivers_write_the_same_close_with_one_statement_each_per_batch(make_order, consumer):
    """docs/existing-model.md's recommended way: ``orders_expired`` receivers, one INSERT of the
    status-change rows and one UPDATE of the stock for the whole batch."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from order_timeout.signals import orders_expired
    from testproject.shop.receivers import release_stock, release_stock_of, write_status_change, write_status_changes

    stock = StockRecord.objects.create(num_in_stock=10, num_allocated=30)
    orders = [make_order(in_seconds=-1) for _ in range(12)]
    for order in orders:
        Line.objects.create(order=order, stockrecord=stock, quantity=2)
    order_expired.disconnect(dispatch_uid="shop.write_status_change", sender=ShopOrder)
    order_expired.disconnect(dispatch_uid="shop.release_stock", sender=ShopOrder)
    orders_expired.connect(write_status_changes, sender=ShopOrder, dispatch_uid="test.changes")
    orders_expired.connect(release_stock_of, sender=ShopOrder, dispatch_uid="test.stock")
    try:
        with CaptureQueriesContext(connection) as queries:
            stats = consumer(batch_size=20).run(once=True)
    finally:
        orders_expired.disconnect(dispatch_uid="test.changes", sender=ShopOrder)
        orders_expired.disconnect(dispatch_uid="test.stock", sender=ShopOrder)
        order_expired.connect(write_status_change, sender=ShopOrder, dispatch_uid="shop.write_status_change")
        order_expired.connect(release_stock, sender=ShopOrder, dispatch_uid="shop.release_stock")

    assert stats.closed == 12
    assert all(history(order) == [("Pending", "Cancelled")] for order in orders)
    stock.refresh_from_db()
    assert stock.num_allocated == 30 - 12 * 2
    shop_writes = [q["sql"] for q in queries.captured_queries
                   if "shop_orderstatuschange" in q["sql"] or "UPDATE" in q["sql"] and "shop_stockrecord" in q["sql"]]
    assert len(shop_writes) == 2, shop_writes


@use_shop
def test_a_receiver_can_run_the_shops_own_state_machine_on_the_closed_order(make_order, consumer):
    order = make_order(in_seconds=-1)

    def archive(sender, order, **kwargs):
        order.set_status("Archived")

    order_expired.connect(archive, sender=ShopOrder, weak=False)
    try:
        stats = consumer().run(once=True)
    finally:
        order_expired.disconnect(archive, sender=ShopOrder)

    assert stats.closed == 1 and stats.failed == 0
    assert ShopOrder.objects.get(pk=order.pk).status == "Archived"
    assert history(order) == [("Pending", "Cancelled"), ("Cancelled", "Archived")]
    assert expiries(order) == 1


# -- orders without a deadline ----------------------------------------------------


@use_shop
def test_an_order_with_no_deadline_is_never_scheduled_scanned_or_closed(make_order, queue, consumer,
                                                                        clock):
    order = make_order(in_seconds=-600)
    ShopOrder.objects.filter(pk=order.pk).update(expires_at=None)
    order.refresh_from_db()
    queue.unschedule([str(order.pk)])

    from order_timeout import schedule

    schedule([order])
    consumer().run(once=True)
    scan = compensate(now=clock() + timedelta(hours=1))

    assert score_of(queue, str(order.pk)) is None
    assert scan.examined == 0 and state(order) == "unpaid"
    assert measure().unpaid_without_deadline == 1


# -- system checks ----------------------------------------------------------------


def test_the_shops_declarations_pass_the_checks():
    assert check_status_declarations(ShopOrder) == []


@isolate_apps("testproject.shop")
def test_a_status_field_that_does_not_exist_is_an_error():
    class Order(TimeoutOrderMixin):
        TIMEOUT_STATUS_FIELD = "state"
        status = models.CharField(max_length=20, default="unpaid")

        class Meta(TimeoutOrderMixin.Meta):
            app_label = "shop"

    assert [m.id for m in check_status_declarations(Order)] == ["order_timeout.E004"]


@isolate_apps("testproject.shop")
def test_declared_values_outside_the_fields_choices_are_errors():
    class Order(TimeoutOrderMixin):
        status = models.CharField(max_length=20, default="new",
                                  choices=[("new", "New"), ("paid", "Paid"), ("void", "Void")])
        TIMEOUT_UNPAID_STATUSES = ("new",)
        TIMEOUT_CLOSED_STATUS = "expired"

        class Meta(TimeoutOrderMixin.Meta):
            app_label = "shop"

    messages = check_status_declarations(Order)

    assert [m.id for m in messages] == ["order_timeout.E006"]
    assert "'expired'" in messages[0].msg and "TIMEOUT_CLOSED_STATUS" in messages[0].msg


@isolate_apps("testproject.shop")
def test_declared_values_longer_than_the_field_are_errors():
    class Order(TimeoutOrderMixin):
        status = models.CharField(max_length=6, default="unpaid")
        TIMEOUT_CLOSED_STATUS = "timed out"

        class Meta(TimeoutOrderMixin.Meta):
            app_label = "shop"

    assert [m.id for m in check_status_declarations(Order)] == ["order_timeout.E007"]


@isolate_apps("testproject.shop")
def test_overlapping_declarations_are_an_error():
    class Order(TimeoutOrderMixin):
        status = models.CharField(max_length=20, default="open")
        TIMEOUT_UNPAID_STATUSES = ("open",)
        TIMEOUT_PAID_STATUS = "open"

        class Meta(TimeoutOrderMixin.Meta):
            app_label = "shop"

    assert [m.id for m in check_status_declarations(Order)] == ["order_timeout.E005"]


@isolate_apps("testproject.shop")
def test_a_draft_status_that_is_also_unpaid_is_an_error():
    class Order(TimeoutOrderMixin):
        status = models.CharField(max_length=20, default="draft")
        TIMEOUT_DRAFT_STATUSES = ("draft", "unpaid")

        class Meta(TimeoutOrderMixin.Meta):
            app_label = "shop"

    assert [m.id for m in check_status_declarations(Order)] == ["order_timeout.E005"]


@isolate_apps("testproject.shop")
def test_new_orders_that_start_as_drafts_trigger_no_warning():
    class Order(TimeoutOrderMixin):
        status = models.CharField(max_length=20, default="draft")
        TIMEOUT_DRAFT_STATUSES = ("draft",)

        class Meta(TimeoutOrderMixin.Meta):
            app_label = "shop"

    assert check_status_declarations(Order) == []


@isolate_apps("testproject.shop")
def test_a_new_order_in_an_initial_status_that_is_not_unpaid_is_scheduled_when_it_enters_unpaid():
    """The shop's base class came first in the MRO and brought its own status, default ''."""

    class ShopBase(models.Model):
        status = models.CharField(max_length=100, blank=True)

        class Meta:
            abstract = True
            app_label = "shop"

    class Order(ShopBase, TimeoutOrderMixin):
        TIMEOUT_UNPAID_STATUSES = ("Pending",)

        class Meta(ShopBase.Meta, TimeoutOrderMixin.Meta):
            app_label = "shop"

    messages = check_status_declarations(Order)

    # Born in '', a row is scheduled when it enters Pending (a row never scheduled may): no warning.
    assert [m.id for m in messages] == []


@isolate_apps("testproject.shop")
def test_a_new_order_born_paid_or_closed_triggers_the_warning():
    class Order(TimeoutOrderMixin):
        status = models.CharField(max_length=100, default="Paid")
        TIMEOUT_UNPAID_STATUSES = ("Pending",)
        TIMEOUT_PAID_STATUS = "Paid"

        class Meta(TimeoutOrderMixin.Meta):
            app_label = "shop"

    messages = check_status_declarations(Order)

    assert [m.id for m in messages] == ["order_timeout.W001"]
    assert "'Paid'" in messages[0].msg and "paid value" in messages[0].msg


@isolate_apps("testproject.shop")
def test_a_meta_that_drops_the_deadline_index_triggers_the_warning():
    class ShopBase(models.Model):
        status = models.CharField(max_length=20, default="unpaid")

        class Meta:
            abstract = True
            app_label = "shop"
            ordering = ["pk"]

    class Order(ShopBase, TimeoutOrderMixin):
        class Meta(ShopBase.Meta):  # the mixin's Meta is not combined: its index is lost
            app_label = "shop"

    assert [m.id for m in check_status_declarations(Order)] == ["order_timeout.W002"]


# -- the backfill -------------------------------------------------------------------


@use_shop
def test_backfill_dry_run_says_what_it_would_do_and_changes_nothing(make_order, queue):
    now = timezone.now()
    old = [ShopOrder.objects.create(number=f"o{i}", date_placed=now - timedelta(days=i + 1))
           for i in range(3)]
    recent = ShopOrder.objects.create(number="r", date_placed=now - timedelta(minutes=1))
    ShopOrder.objects.update(expires_at=None)
    queue.client.flushdb()

    out = io.StringIO()
    call_command("order_timeout_backfill", "--from-field", "date_placed", "--timeout", "3600",
                 "--dry-run", stdout=out)

    text = out.getvalue()
    assert "4 unpaid orders have no deadline; 4 would get one." in text
    assert "3 of them would be overdue at once" in text
    assert set(ShopOrder.objects.values_list("expires_at", flat=True)) == {None}
    assert pending_count(queue) == 0
    assert old and recent


@use_shop
def test_backfill_from_the_shops_own_date_schedules_every_unpaid_order(make_order, queue, consumer):
    now = timezone.now()
    overdue = ShopOrder.objects.create(number="old", date_placed=now - timedelta(days=2))
    future = ShopOrder.objects.create(number="new", date_placed=now - timedelta(minutes=5))
    paid = ShopOrder.objects.create(number="paid", status="Paid", date_placed=now - timedelta(days=2))
    ShopOrder.objects.update(expires_at=None)
    queue.client.flushdb()

    call_command("order_timeout_backfill", "--from-field", "date_placed", "--timeout", "3600",
                 stdout=io.StringIO())
    consumer().run(once=True)

    future.refresh_from_db()
    assert future.expires_at == future.date_placed + timedelta(hours=1)
    assert score_of(queue, str(future.pk)) == deadline_score(future.expires_at)
    assert state(overdue) == "closed" and history(overdue) == [("Pending", "Cancelled")]
    assert ShopOrder.objects.get(pk=paid.pk).expires_at is None


@pytest.mark.parametrize("args, message", [
    ([], "one of the arguments --in --from-field --policy --timer is required"),
    (["--in", "60", "--from-field", "date_placed"], "not allowed with argument"),
    (["--in", "0"], "more than 0 seconds"),
    (["--in", "60", "--timeout", "5"], "--timeout goes with --from-field"),
    (["--from-field", "nope"], "has no field 'nope'"),
    (["--from-field", "number"], "is not a DateTimeField"),
])
@use_shop
def test_bad_backfill_options_are_command_errors(order_model, args, message):
    with pytest.raises(CommandError, match=message):
        call_command("order_timeout_backfill", *args, stdout=io.StringIO())


# -- deadlocks ------------------------------------------------------------------------


@use_shop
def test_a_deadlock_with_a_checkout_is_retried_at_once_not_after_the_retry_delays(
        make_order, settings, queue, caplog):
    """The checkout locks stock, then the order; the close locks the order, then stock."""
    # A failure would wait an hour: closing within the test means it was not counted as one.
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "RETRY_DELAYS": [3600]}
    contested = StockRecord.objects.create(num_in_stock=10, num_allocated=1)
    others = StockRecord.objects.bulk_create([StockRecord(num_in_stock=10) for _ in range(50)])
    order = make_order(in_seconds=-1)
    Line.objects.create(order=order, stockrecord=contested, quantity=1)
    holding, checkout_result = threading.Event(), []

    def checkout():
        try:
            with transaction.atomic():
                # A bigger transaction than the close, so the database picks the close as victim.
                StockRecord.objects.filter(pk__in=[s.pk for s in others]).update(
                    num_allocated=F("num_allocated") + 1)
                StockRecord.objects.filter(pk=contested.pk).update(num_allocated=F("num_allocated") + 1)
                holding.set()
                # Until the close waits for the stock row. (Polled gently: InnoDB's lock
                # tables, read every 50 ms, kept the consumer from even connecting.)
                # However long a busy machine takes: the budget is the test's own, not what it proves.
                wait_for(lambda: lock_waits() >= 1, interval=0.25)
                ShopOrder.objects.filter(pk=order.pk).update(total=Decimal("9.99"))
            checkout_result.append("committed")
        except Exception as exc:  # pragma: no cover - reported by the assertion below
            checkout_result.append(exc)
        finally:
            connection.close()

    buyer = threading.Thread(target=checkout)
    buyer.start()
    assert holding.wait(10)
    worker = Consumer(max_wait=0.05)
    with caplog.at_level(logging.INFO, logger="order_timeout"), running(worker):
        wait_for(lambda: state(order) == "closed")
    buyer.join(time_left())

    assert checkout_result == ["committed"]
    assert "Lock conflict while closing" in caplog.text
    assert worker.stats.failed == 0 and not DeadLetter.objects.exists()
    assert queue.client.hget(keys_for(queue, str(order.pk)).attempts, str(order.pk)) is None
    assert expiries(order) == 1 and history(order) == [("Pending", "Cancelled")]
    contested.refresh_from_db()
    assert contested.num_allocated == 1  # allocated 1, +1 by the checkout, -1 released by the close


# -- the admin --------------------------------------------------------------------------


@use_shop
def test_the_shops_own_admin_keeps_its_columns_and_gains_the_deadline_ones(admin_client, make_order):
    make_order(in_seconds=60, number="A-1")

    response = admin_client.get(reverse("admin:shop_shoporder_changelist"))

    assert response.status_code == 200
    for column in ("number", "status", "total", "date_placed", "expires_at", "closed_at",
                   "close_reason"):
        assert f"column-{column}" in response.text
    assert "By deadline" in response.text and "By status" in response.text


@use_shop
def test_the_deadline_filter_shows_the_unpaid_overdue_orders(admin_client, make_order):
    overdue = make_order(in_seconds=-60, number="late")
    make_order(in_seconds=60, number="on-time")

    response = admin_client.get(reverse("admin:shop_shoporder_changelist") + "?deadline=overdue")

    assert list(response.context["cl"].result_list) == [overdue]


def test_extending_a_registered_admin_twice_changes_nothing():
    from django.contrib import admin

    from order_timeout.admin import TimeoutOrderAdminMixin, extend_registered_admin

    first = type(admin.site.get_model_admin(ShopOrder))

    assert extend_registered_admin(ShopOrder) is first
    assert issubclass(first, TimeoutOrderAdminMixin) and first.__name__ == "ShopOrderAdmin"


# -- a shop that cannot touch its orders table: a deadline table beside it ----------------

use_sidecar = pytest.mark.parametrize("order_model", ["shop.PlainOrderDeadline"], indirect=True,
                                      ids=["PlainOrderDeadline"])


@use_sidecar
def test_a_deadline_row_beside_an_untouchable_order_closes_it_in_the_same_commit(order_model, consumer,
                                                                                 clock, queue):
    from testproject.shop.models import PlainOrder, PlainOrderDeadline

    order = PlainOrder.objects.create()
    deadline = PlainOrderDeadline.objects.create(order=order, expires_at=clock() - timedelta(seconds=1))
    assert score_of(queue, str(deadline.pk)) == deadline_score(deadline.expires_at)

    stats = consumer().run(once=True)

    assert stats.closed == 1 and state(deadline) == "closed"
    assert PlainOrder.objects.get(pk=order.pk).status == "cancelled"


@use_sidecar
def test_paying_through_the_deadline_row_keeps_the_untouchable_order_open(order_model, consumer, clock,
                                                                          queue):
    from testproject.shop.models import PlainOrder, PlainOrderDeadline

    order = PlainOrder.objects.create()
    PlainOrderDeadline.objects.create(order=order, expires_at=clock() - timedelta(seconds=1))

    with transaction.atomic():  # the shop's payment callback
        assert order.deadline.mark_paid() is True
        PlainOrder.objects.filter(pk=order.pk).update(status="paid")
    consumer().run(once=True)

    assert PlainOrder.objects.get(pk=order.pk).status == "paid"
    assert pending_count(queue) == 0
