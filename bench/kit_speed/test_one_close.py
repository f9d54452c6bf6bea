"""One timer test, written two ways, timed by ``python -m bench.kit_speed`` (docs/testing.md).

The same behaviour, "an unpaid order past its deadline is closed": with the testing kit, in the
default ``django_db`` test (a transaction rolled back after it); and the way docs/timers.md
showed before the kit, with ``transaction=True`` (every table flushed after it), a real consumer
command and deadlines written in the past.
"""

from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from order_timeout.models import Order
from order_timeout.testing import empty_queues, run_due, travel

ROUNDS = 15


@pytest.mark.django_db
@pytest.mark.parametrize("round_", range(ROUNDS))
def test_with_the_kit(round_: int) -> None:
    order = Order.objects.create(expires_at=timezone.now() + timedelta(minutes=15))

    with travel(minutes=20):
        run_due()

    order.refresh_from_db()
    assert order.status == "closed"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("round_", range(ROUNDS))
def test_with_transaction_true_and_the_command(round_: int) -> None:
    empty_queues()
    order = Order.objects.create(expires_at=timezone.now() - timedelta(seconds=1))

    call_command("run_timeout_consumer", "--once")

    order.refresh_from_db()
    assert order.status == "closed"
    empty_queues()
