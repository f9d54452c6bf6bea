"""The long commands draw ``[####....] done/total`` on a terminal, and nothing into a pipe.

``order_timeout_compensate``, ``order_timeout_redate`` and ``order_timeout_backfill`` walk
tables a chunk at a time; on a terminal one shared bar (``order_timeout.management.progress``)
is redrawn after each chunk and its line ended before the summary. A cron job's mail or a log
file gets the summary alone.
"""

from __future__ import annotations

import io
import re
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.utils import timezone

from order_timeout.management.progress import ProgressBar
from order_timeout.models import Order
from testproject.shop.models import Checkout, StockRecord, StockReservation

pytestmark = pytest.mark.django_db(transaction=True)

FULL = "[" + "#" * 30 + "]"


class Terminal(io.StringIO):
    """A stdout that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def run(command: str, *args: str, out: io.StringIO) -> str:
    call_command(command, *args, stdout=out)
    return out.getvalue()


def frames(text: str) -> list[str]:
    """The bar's drawings, in order (each starts with a carriage return)."""
    return re.findall(r"\r(\[[#.]+\] \d+/\d+)", text)


@pytest.fixture
def small_chunks(settings: Any) -> None:
    """Two rows a chunk, so five rows are three chunks and three drawings."""
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "COMPENSATION_CHUNK": 2}


def an_hour_after_creation(order: Any) -> datetime:
    """DEADLINE_POLICY for these tests."""
    return order.created_at + timedelta(hours=1)


@pytest.fixture
def policy(settings: Any) -> None:
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT,
                              "DEADLINE_POLICY": "tests.test_command_progress.an_hour_after_creation"}


def open_orders(count: int) -> None:
    """Unpaid orders with a deadline: what a re-date walks."""
    for _ in range(count):
        Order.objects.create()


def undated_orders(count: int) -> None:
    for _ in range(count):
        Order.objects.create()
    Order.objects.update(expires_at=None)


def lapsing_reservations(count: int) -> None:
    stock = StockRecord.objects.create(num_in_stock=count, num_allocated=count)
    checkout = Checkout.objects.create()
    StockReservation.objects.bulk_create([
        StockReservation(stockrecord=stock, checkout=checkout, expires_at=timezone.now() + timedelta(hours=1))
        for _ in range(count)])


def test_the_bar_fills_in_proportion_and_ends_its_line_once():
    out = Terminal()
    bar = ProgressBar(_wrapped(out))

    bar.draw(2, 5)
    bar.draw(5, 5)
    bar.end()
    bar.end()

    assert out.getvalue() == "\r[" + "#" * 12 + "." * 18 + "] 2/5" + "\r" + FULL + " 5/5\n"


def _wrapped(out: io.StringIO) -> Any:
    from django.core.management.base import OutputWrapper

    return OutputWrapper(out)


@pytest.mark.parametrize("command, args, make", [
    ("order_timeout_redate", [], lambda: open_orders(5)),
    ("order_timeout_backfill", ["--in", "3600"], lambda: undated_orders(5)),
    ("order_timeout_backfill", ["--policy"], lambda: undated_orders(5)),
    ("order_timeout_backfill", ["--timer", "reservation-lapses"], lambda: lapsing_reservations(5)),
], ids=["redate", "backfill-in", "backfill-policy", "backfill-timer"])
def test_a_long_command_draws_its_bar_on_a_terminal_up_to_total_then_its_summary(
        command, args, make, policy, small_chunks, queue):
    make()

    text = run(command, *args, out=Terminal())

    assert frames(text)[-1] == f"{FULL} 5/5"
    assert [frame.split()[-1] for frame in frames(text)] == ["2/5", "4/5", "5/5"]
    summary = text.split(f"{FULL} 5/5\n", 1)[1]
    assert summary and "#" not in summary


@pytest.mark.parametrize("command, args, make", [
    ("order_timeout_redate", [], lambda: open_orders(5)),
    ("order_timeout_backfill", ["--in", "3600"], lambda: undated_orders(5)),
    ("order_timeout_backfill", ["--policy"], lambda: undated_orders(5)),
    ("order_timeout_backfill", ["--timer", "reservation-lapses"], lambda: lapsing_reservations(5)),
    ("order_timeout_compensate", ["--dry-run"], lambda: Order.objects.create(
        expires_at=timezone.now() - timedelta(hours=1))),
], ids=["redate", "backfill-in", "backfill-policy", "backfill-timer", "compensate"])
def test_no_bar_goes_into_a_pipe(command, args, make, policy, small_chunks, queue):
    make()

    text = run(command, *args, out=io.StringIO())

    assert "\r" not in text and "#" not in text and "/5" not in text
    assert text.strip()


def test_a_dry_run_of_a_redate_draws_its_bar_too(policy, small_chunks, queue):
    open_orders(3)

    text = run("order_timeout_redate", "--dry-run", out=Terminal())

    assert frames(text)[-1] == f"{FULL} 3/3"


def test_json_on_a_terminal_is_still_one_json_object(policy, queue):
    """What a machine reads is never mixed with the bar: --json draws none."""
    import json

    open_orders(3)

    text = run("order_timeout_redate", "--json", out=Terminal())

    assert json.loads(text)["examined"] == 3


def test_the_scan_draws_the_shared_bar(queue):
    for _ in range(3):
        Order.objects.create(expires_at=timezone.now() - timedelta(hours=1))

    text = run("order_timeout_compensate", "--dry-run", out=Terminal())

    assert frames(text)[-1] == f"{FULL} 3/3"
    assert text.split(f"{FULL} 3/3\n", 1)[1].startswith("Scan")
