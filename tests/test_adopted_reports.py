"""What the adoptions found in the reports: every kind counted, held rows counted once, no order close
where there is no order model, and the scan's failures reaching staff.

Tried on three shops: ``order_timeout_compensate`` printed only orders (a dry run said "0 overdue
unpaid orders would be closed" with 121 timer rows due; a rebuild put 80 timer members back and
said "0 put back"); held rows past their deadline counted as overdue on Saleor, so
``order_timeout_status --max-overdue 0`` failed with its held orders; with no ``ORDER_MODEL`` the
built-in close still read the app's unused order table; and a receiver that raised on the scan's
path was logged and left, scan after scan, with no dead letter.
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta
from io import StringIO

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command
from django.db import connection
from django.db.models import Q
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from order_timeout.conf import settings as order_settings
from order_timeout.models import DeadLetter, Order
from order_timeout.reporting.health import measure
from order_timeout.scans.compensation import compensate
from order_timeout.signals import order_expired
from order_timeout.timers.members import now_score
from order_timeout.timers.registry import registry
from testproject.saleorlike.expiry import UnconfirmedOrderExpires
from testproject.saleorlike.models import Channel, Order as SaleorOrder, OrderStatus, TransactionItem
from testproject.shop.models import Checkout, StockRecord, StockReservation

from .conftest import PROJECT_ROOT, database_url
from .helpers import score_of

pytestmark = pytest.mark.django_db(transaction=True)

LAPSES = "reservation-lapses"


def reservations(count: int, in_seconds: float, *, checkout_state: str = "open") -> list[StockReservation]:
    stock = StockRecord.objects.create(num_in_stock=100, num_allocated=count)
    return [StockReservation.objects.create(stockrecord=stock, checkout=Checkout.objects.create(state=checkout_state),
                                            expires_at=timezone.now() + timedelta(seconds=in_seconds))
            for _ in range(count)]


@pytest.fixture
def lapses_queue(queue):
    return queue.of_kind(registry.get(LAPSES).key_space)


def run(command: str, *args: str) -> str:
    out = StringIO()
    call_command(command, *args, stdout=out)
    return out.getvalue()


@pytest.fixture
def no_grace(settings):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "COMPENSATION_GRACE": 0}


# -- every report counts every kind ---------------------------------------------------------------

def test_the_scan_prints_a_line_for_each_timer_it_acted_on(no_grace, lapses_queue):
    rows = reservations(3, in_seconds=-60)
    lapses_queue.delete_all_keys()  # only the scan can find them now

    out = run("order_timeout_compensate")

    assert f"timer {LAPSES}: 3 overdue rows found, 3 acted on" in out, out
    assert {row.state for row in StockReservation.objects.filter(pk__in=[r.pk for r in rows])} == {"released"}


def test_a_dry_run_counts_the_timer_rows_it_would_act_on(no_grace, lapses_queue):
    reservations(4, in_seconds=-60)
    lapses_queue.delete_all_keys()

    out = run("order_timeout_compensate", "--dry-run")

    assert f"timer {LAPSES}: 4 overdue rows would be acted on" in out, out
    assert set(StockReservation.objects.values_list("state", flat=True)) == {"held"}


def test_a_rebuild_counts_the_timer_members_it_puts_back(lapses_queue):
    rows = reservations(2, in_seconds=600)
    lapses_queue.delete_all_keys()

    out = run("order_timeout_compensate", "--rebuild")

    assert f"timer {LAPSES}: 2 rows with a future deadline examined, 2 put back into Redis" in out, out
    assert all(score_of(lapses_queue, str(row.pk)) is not None for row in rows)


# -- held rows: held within their hold, overdue past it ----------------------------------------------

def test_a_timers_held_rows_within_their_hold_are_held_not_overdue(settings):
    reservations(3, in_seconds=-60, checkout_state="completing")
    reservations(1, in_seconds=-60)

    figures = measure(drift=False).timers[LAPSES]

    assert (figures.overdue_in_database, figures.held_in_database) == (1, 3)


def test_a_timers_held_rows_past_their_longest_hold_are_overdue(settings):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "MAX_HOLD": 30}
    reservations(2, in_seconds=-60, checkout_state="completing")

    figures = measure(drift=False).timers[LAPSES]

    assert (figures.overdue_in_database, figures.held_in_database) == (2, 0)


@pytest.fixture
def saleor_expiry(redis_client):
    registry.register(SaleorOrder, UnconfirmedOrderExpires)
    try:
        yield registry.get(UnconfirmedOrderExpires.name)
    finally:
        registry.unregister(UnconfirmedOrderExpires.name)


def unconfirmed(minutes_ago: float, **fields) -> SaleorOrder:
    channel, _ = Channel.objects.get_or_create(slug="default-channel", defaults={"expire_orders_after": 30})
    order = SaleorOrder.objects.create(channel=channel, created_at=timezone.now() - timedelta(minutes=minutes_ago),
                                       **fields)
    order.status = OrderStatus.UNCONFIRMED
    order.save()
    return order


def test_saleors_held_orders_do_not_fail_max_overdue_zero(saleor_expiry):
    """docs/saleor.md, step 4: the timer's overdue figure stays at 0 while money is on its way."""
    for _ in range(4):
        TransactionItem.objects.create(order=unconfirmed(minutes_ago=45), charge_pending_value=10)

    out = run("order_timeout_status", "--max-overdue", "0", "--no-drift")

    figures = measure(drift=False).timers[saleor_expiry.name]
    assert (figures.overdue_in_database, figures.held_in_database) == (0, 4), out


def test_saleors_orders_held_past_max_hold_fail_max_overdue_zero(saleor_expiry, settings):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "MAX_HOLD": 60}
    TransactionItem.objects.create(order=unconfirmed(minutes_ago=45), charge_pending_value=10)

    with pytest.raises(CommandError, match="1 overdue rows > --max-overdue 0") as raised:
        run("order_timeout_status", "--max-overdue", "0", "--no-drift")

    assert raised.value.returncode == 2


def test_the_order_closes_held_orders_are_held_not_overdue(settings, make_order, order_model):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "HOLD_CONDITION": Q(close_reason="in-flight")}
    make_order(in_seconds=-60, close_reason="in-flight")
    make_order(in_seconds=-60)

    health = measure(drift=False)

    assert (health.overdue_unpaid_in_database, health.held_in_database) == (1, 1)


# -- no ORDER_MODEL: no order close ---------------------------------------------------------------

@pytest.fixture
def without_order_model(settings):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "ORDER_MODEL": None}


def test_with_no_order_model_the_reports_have_no_order_section_and_read_no_order_table(
        without_order_model, no_grace, lapses_queue, consumer):
    from order_timeout.consumer import Consumer

    reservations(2, in_seconds=-60)
    order_table = Order._meta.db_table
    with CaptureQueriesContext(connection) as queries:
        text = run("order_timeout_status")
        figures = json.loads(run("order_timeout_status", "--json"))
        scan = run("order_timeout_compensate")
        Consumer().run(once=True)

    assert [query["sql"] for query in queries.captured_queries if order_table in query["sql"]] == []
    assert text.startswith("no order close (ORDER_MODEL is None)") and "overdue unpaid" not in text
    assert figures["closes_orders"] is False and set(figures) == {"closes_orders", "refused_writes", "timers",
                                                                  "paused", "storage", "housekeeping"}
    assert LAPSES in figures["timers"]
    assert scan.startswith("Scan: no order close (ORDER_MODEL is None)") and f"timer {LAPSES}:" in scan
    assert set(StockReservation.objects.values_list("state", flat=True)) == {"released"}


def test_with_no_order_model_the_consumers_summary_and_the_scans_figures_name_no_order_close(
        without_order_model, no_grace, lapses_queue):
    reservations(2, in_seconds=-60)

    summary = run("run_timeout_consumer", "--once")
    figures = compensate().as_dict()

    assert "closed" not in summary and "Timeout consumer stopped after 1 batch(es)." in summary
    assert f"  {LAPSES}: 2 claimed, 2 acted" in summary
    assert figures["closes_orders"] is False
    assert all("closes_orders" not in own and "timers" not in own for own in figures["timers"].values())


def test_with_no_order_model_the_metrics_have_no_order_gauges(without_order_model):
    pytest.importorskip("prometheus_client")
    from order_timeout.reporting.metrics import BacklogCollector

    names = {family.name for family in BacklogCollector(own_connections=False).collect()}

    assert "order_timeout_pending" not in names or not any(
        family.samples for family in BacklogCollector(own_connections=False).collect()
        if family.name == "order_timeout_pending")
    assert "order_timeout_timer_pending" in names


@pytest.mark.parametrize("key", ["REMINDERS", "HOLD_CONDITION", "SETTLED_CONDITION", "CLOSE_FIELDS"])
def test_an_order_close_setting_with_no_order_model_is_refused_naming_it(settings, key):
    value = {"REMINDERS": [60], "HOLD_CONDITION": Q(pk=1), "SETTLED_CONDITION": Q(pk=1),
             "CLOSE_FIELDS": {"closed_at": "time"}}[key]
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "ORDER_MODEL": None, key: value}

    with pytest.raises(ImproperlyConfigured, match=rf"ORDER_TIMEOUT\['{key}'\] configures the order close"):
        order_settings.load()


def test_the_router_keeps_the_order_table_from_migrate(db):
    """``DATABASE_ROUTERS = ["order_timeout.routers.WithoutOrderTable"]``: migrate a fresh database
    with it (the app alone: the test project's shop has a foreign key to that table), and the app's
    tables are there but its order table."""
    url = database_url()
    name = f"{connection.settings_dict['NAME']}_without_orders"
    admin = connection.vendor
    with connection.cursor() as cursor:
        cursor.execute(f"DROP DATABASE IF EXISTS {name}")
        cursor.execute(f"CREATE DATABASE {name}")
    try:
        env = {"DATABASE_URL": url.rsplit("/", 1)[0] + "/" + name, "PYTHONPATH": str(PROJECT_ROOT),
               "DJANGO_SETTINGS_MODULE": "testproject.settings", "PATH": "/usr/bin:/bin"}
        script = ("import django; from django.conf import settings; "
                  "settings.DATABASE_ROUTERS = ['order_timeout.routers.WithoutOrderTable']; "
                  "settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, 'ORDER_MODEL': None}; django.setup(); "
                  "from django.core.management import call_command; "
                  "call_command('migrate', 'order_timeout', verbosity=0); "
                  "from django.db import connection; print(' '.join(sorted(connection.introspection.table_names())))")
        done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, done.stderr
        tables = set(done.stdout.split())
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP DATABASE IF EXISTS {name}")
    assert admin in ("mysql", "postgresql")
    assert "order_timeout_order" not in tables
    assert {"order_timeout_deadline", "order_timeout_deadletter", "order_timeout_reminder"} <= tables


def test_the_apps_order_model_with_its_table_routed_away_is_an_error(settings):
    from order_timeout.checks import check_order_table

    settings.DATABASE_ROUTERS = ["order_timeout.routers.WithoutOrderTable"]

    assert [message.id for message in check_order_table()] == ["order_timeout.E019"]


# -- the scan's failures reach staff ----------------------------------------------------------------

@pytest.fixture
def failing_close():
    def refuse(sender, order, **kwargs):
        raise RuntimeError(f"the stock service refused order {order.pk}")

    order_expired.connect(refuse, weak=False, dispatch_uid="test.failing-close")
    yield
    order_expired.disconnect(dispatch_uid="test.failing-close")


def test_a_close_that_keeps_failing_on_the_scans_path_is_retried_then_dead_lettered(
        no_grace, failing_close, make_order, queue):
    """RETRY_DELAYS (10, 30, 60 s) count the scan's tries as a consumer's: the fourth failure is a
    dead letter. Each scan runs after the retry it left is due (no consumer runs here)."""
    order = make_order(in_seconds=-60)
    queue.unschedule([str(order.pk)])  # Redis lost it: only the scan finds it
    started = timezone.now()

    first = compensate(now=started)
    assert (first.failed, first.dead_lettered) == (1, 0)
    assert score_of(queue, str(order.pk)) == now_score(started) + 10_000
    later = started
    for delay in (10, 30, 60):
        later += timedelta(seconds=delay + 1)
        result = compensate(now=later)
    letter = DeadLetter.objects.get(order_id=str(order.pk), resolved_at__isnull=True)

    assert (result.failed, result.dead_lettered) == (1, 1)
    assert letter.attempts == 4 and "the stock service refused" in letter.last_error
    assert score_of(queue, str(order.pk)) is None


def test_the_consumer_counts_on_from_a_failure_the_scan_met(no_grace, failing_close, make_order, queue, consumer,
                                                             clock):
    order = make_order(in_seconds=-60)
    queue.unschedule([str(order.pk)])
    compensate(now=clock())

    clock.advance(11)
    consumer().run(once=True)

    # Its second failure: the next try is 30 s away (RETRY_DELAYS[1]), not 10 s.
    assert score_of(queue, str(order.pk)) == now_score(clock()) + 30_000


def test_a_timers_fire_that_keeps_failing_on_the_scans_path_ends_as_its_dead_letter(no_grace, settings,
                                                                                   lapses_queue, monkeypatch):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "RETRY_DELAYS": []}
    row, = reservations(1, in_seconds=-60)
    lapses_queue.delete_all_keys()
    lapses = registry.get(LAPSES)

    def refuse(rows, now):
        raise RuntimeError("the stock service is down")

    monkeypatch.setattr(lapses, "fire", refuse)
    result = compensate()

    assert result.timers[LAPSES].dead_lettered == 1
    assert DeadLetter.objects.filter(timer=LAPSES, order_id=str(row.pk), resolved_at__isnull=True).exists()
    assert StockReservation.objects.get(pk=row.pk).state == "held"
