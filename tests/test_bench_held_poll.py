"""The harness's poll of a burst's progress (bench/workloads.py ``unpaid_left``) asks the same small
statement however many orders the burst holds: the held row's poll once carried every held id,
40 kB of SQL compiled every 0.25 s on the closers' machine, in that row only. Behaviour only: no
timing is asserted."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from bench.systems import Ours, OursHeld
from bench.workloads import Phase, unpaid_left
from order_timeout.models import Order
from testproject.shop.models import OrderPayment


def burst(low: int, high: int, held: set[int]) -> Phase:
    return Phase(kind="burst", orders=high - low + 1 - len(held), start=timezone.now(), pk_range=(low, high),
                 held=held)


def test_the_held_rows_poll_is_the_same_statement_for_ten_held_orders_and_for_ten_thousand() -> None:
    few = burst(1, 100_000, set(range(1, 100_000, 10_000)))
    many = replace(few, held=set(range(1, 100_000, 10)))

    statements = [unpaid_left(OursHeld(Path()), phase).query.sql_with_params() for phase in (few, many)]

    assert len(few.held) == 10 and len(many.held) == 10_000
    assert statements[0] == statements[1]
    sql, params = statements[1]
    # The range's two ends, the unpaid status and the hold condition's own few values: no id list.
    assert len(params) < 10 and len(sql) < 1_000


def test_a_row_that_holds_nothing_polls_its_unpaid_orders_alone() -> None:
    statement, _ = unpaid_left(Ours(Path()), burst(1, 10, set())).query.sql_with_params()

    assert "EXISTS" not in statement.upper() and "orderpayment" not in statement


@pytest.mark.django_db
def test_the_poll_finds_an_unheld_unpaid_order_and_not_a_held_one() -> None:
    deadline = timezone.now() + timedelta(hours=1)
    held, unheld = Order.objects.create(expires_at=deadline), Order.objects.create(expires_at=deadline)
    OrderPayment.objects.create(order=held)
    phase = burst(min(held.pk, unheld.pk), max(held.pk, unheld.pk), {held.pk})
    system = OursHeld(Path())

    assert list(unpaid_left(system, phase).values_list("pk", flat=True)) == [unheld.pk]

    unheld.mark_paid()

    assert not unpaid_left(system, phase).exists()
    assert Order.objects.filter(Order.unpaid_q(), pk=held.pk).exists()  # still unpaid, only held
