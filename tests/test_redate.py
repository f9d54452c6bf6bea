"""Deadlines that follow the policy: ``order_timeout_redate`` asks DEADLINE_POLICY again.

Tried on Saleor: its expiry recomputes the channel's window on every run; we store one deadline
per row, so a channel whose window grew from 30 to 60 minutes kept closing its open orders at 30,
and a per-channel backfill was code the shop wrote. Here the policy is the order's creation time
plus its payment method's window (``WINDOWS``, which a test changes as staff change a channel).
"""

from __future__ import annotations

import json
import logging
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from order_timeout.models import DeadLetter
from order_timeout.timers.members import deadline_score

from .conftest import both_models
from .helpers import expiries, score_of, state
from .holding import row_locked_elsewhere

pytestmark = pytest.mark.django_db(transaction=True)

WINDOWS = {"card": timedelta(minutes=30), "bank_transfer": timedelta(days=3)}


def placed_at(order):
    return getattr(order, "created_at", None) or order.date_placed


def by_window(order):
    """DEADLINE_POLICY: the order's creation time plus its method's window; "invoice" never expires."""
    method = getattr(order, "payment_method", "card")
    if method == "invoice":
        return None
    return placed_at(order) + WINDOWS[method]  # an unknown method raises


@pytest.fixture
def windows(settings, monkeypatch):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "DEADLINE_POLICY": "tests.test_redate.by_window"}
    monkeypatch.setitem(WINDOWS, "card", timedelta(minutes=30))
    return WINDOWS


def redate(*args):
    out = StringIO()
    call_command("order_timeout_redate", *args, "--json", stdout=out)
    return json.loads(out.getvalue())


def deadline_of(order):
    return type(order)._base_manager.get(pk=order.pk).expires_at


@both_models
def test_a_longer_window_moves_every_open_order_and_the_old_deadline_only_costs_a_look(
        windows, order_model, queue, consumer, clock):
    """Redis moves a member only ever earlier (schedule.lua's LT): at the old deadline the consumer
    reads the row, finds it not due, and puts the member back at the new one."""
    orders = [order_model.objects.create() for _ in range(5)]
    windows["card"] = timedelta(minutes=60)

    plan = redate("--chunk", "2")

    assert (plan["examined"], plan["later"], plan["unchanged"]) == (5, 5, 0)
    assert all(deadline_of(order) == placed_at(order) + timedelta(minutes=60) for order in orders)
    clock.current = max(placed_at(order) for order in orders) + timedelta(minutes=31)
    stats = consumer().run(once=True)
    assert stats.closed == 0 and all(state(order) == "unpaid" for order in orders)
    assert all(score_of(queue, str(order.pk)) == deadline_score(deadline_of(order)) for order in orders)


@both_models
def test_a_shorter_window_moves_the_members_earlier_at_once(windows, order_model, queue):
    order = order_model.objects.create()
    windows["card"] = timedelta(minutes=10)

    assert redate()["earlier"] == 1
    assert score_of(queue, str(order.pk)) == deadline_score(placed_at(order) + timedelta(minutes=10))


@both_models
def test_a_dry_run_says_what_would_change_and_changes_nothing(windows, order_model, queue):
    order = order_model.objects.create()
    before = deadline_of(order)
    windows["card"] = timedelta(minutes=5)

    plan = redate("--dry-run")

    assert (plan["dry_run"], plan["earlier"], plan["changed"]) == (True, 1, 1)
    assert deadline_of(order) == before and score_of(queue, str(order.pk)) == deadline_score(before)


@both_models
def test_a_shorter_window_past_an_order_closes_it_at_once_through_the_consumer(windows, order_model, consumer):
    order = order_model.objects.create()
    windows["card"] = timedelta(seconds=-1)

    plan = redate()

    assert (plan["earlier"], plan["overdue_at_once"]) == (1, 1)
    consumer(follow_database_clock=True, now=None).run(once=True)
    assert state(order) == "closed" and expiries(order) == 1


@both_models
def test_only_the_orders_the_filter_names_are_redated(windows, order_model):
    card = order_model.objects.create()
    transfer = order_model.objects.create(**({"payment_method": "bank_transfer"}
                                             if hasattr(order_model, "payment_method") else {}))
    windows["card"] = timedelta(minutes=60)

    plan = redate("--where", f"pk__in={card.pk}")

    assert (plan["examined"], plan["later"]) == (1, 1)
    assert deadline_of(card) == placed_at(card) + timedelta(minutes=60)
    assert deadline_of(transfer) == transfer.expires_at


@both_models
def test_paid_and_closed_orders_are_never_redated(windows, order_model):
    from .helpers import set_state

    paid, closed = order_model.objects.create(), order_model.objects.create()
    set_state(paid, "paid")
    set_state(closed, "closed")
    windows["card"] = timedelta(minutes=60)

    assert redate()["examined"] == 0


@both_models
def test_an_order_locked_elsewhere_is_skipped_and_counted_never_waited_for(windows, order_model, queue):
    locked, free = order_model.objects.create(), order_model.objects.create()
    before = deadline_of(locked)
    windows["card"] = timedelta(minutes=60)

    with row_locked_elsewhere(order_model, locked.pk):
        plan = redate()

    assert (plan["busy"], plan["later"]) == (1, 1)
    assert deadline_of(locked) == before and score_of(queue, str(locked.pk)) == deadline_score(before)
    assert deadline_of(free) == placed_at(free) + timedelta(minutes=60)


@pytest.mark.parametrize("order_model", ["shop.ShopOrder"], indirect=True)
def test_an_order_the_policy_now_says_never_expires_leaves_the_queue(windows, order_model, queue):
    order = order_model.objects.create()
    order_model.objects.filter(pk=order.pk).update(payment_method="invoice")  # staff moved it to invoice

    plan = redate()

    assert plan["never"] == 1 and deadline_of(order) is None
    assert score_of(queue, str(order.pk)) is None


@both_models
def test_an_order_the_policy_fails_for_keeps_its_deadline_and_is_reported(windows, order_model, caplog):
    order = order_model.objects.create()
    before = deadline_of(order)
    windows.pop("card")  # the policy now raises KeyError for a card order

    with caplog.at_level(logging.DEBUG, logger="order_timeout"):
        plan = redate()

    assert (plan["failed"], plan["changed"]) == (1, 0) and deadline_of(order) == before
    assert "raised" in plan["failures"][0]
    # An expected failure: one line, saying why; the policy's traceback at DEBUG.
    said = [record for record in caplog.records if record.getMessage().startswith("re-date:")]
    lines = [(line.levelno, line.getMessage(), line.exc_info) for line in said if line.levelno > logging.DEBUG]
    assert lines == [
        (logging.WARNING, f"re-date: DEADLINE_POLICY tests.test_redate.by_window raised for {order_model.__name__} "
                          f"{order.pk!r} (KeyError: 'card'); its deadline is left as it was.", None)]
    assert [record.exc_info[0] for record in said if record.levelno == logging.DEBUG] == [KeyError]


@both_models
def test_an_open_dead_letter_is_left_to_staff(windows, order_model):
    order = order_model.objects.create()
    DeadLetter.objects.create(order_model=order_model._meta.label, order_id=str(order.pk), attempts=4,
                              first_failed_at=timezone.now(), last_failed_at=timezone.now(),
                              last_error="ValueError: receiver")
    before = deadline_of(order)
    windows["card"] = timedelta(minutes=60)

    plan = redate()

    assert (plan["dead_letters"], plan["changed"]) == (1, 0) and deadline_of(order) == before


@both_models
def test_the_backfill_by_policy_dates_orders_without_a_deadline(windows, order_model, queue):
    order = order_model.objects.create()
    order_model._base_manager.filter(pk=order.pk).update(expires_at=None)  # adopted: an old row without one
    queue.unschedule([str(order.pk)])
    out = StringIO()

    call_command("order_timeout_backfill", "--policy", stdout=out)

    assert deadline_of(order) == placed_at(order) + timedelta(minutes=30)
    assert score_of(queue, str(order.pk)) == deadline_score(deadline_of(order))
    assert "1 dated" in out.getvalue()


@pytest.mark.parametrize("args, message", [
    (["--where", "no_such_field=1"], "does not fit"),
    (["--where", "payment_method"], "LOOKUP=VALUE"),
    (["--chunk", "0"], "--chunk"),
], ids=["unknown-field", "no-equals", "chunk-zero"])
def test_a_bad_option_is_a_command_error(windows, args, message):
    with pytest.raises(CommandError, match=message):
        call_command("order_timeout_redate", *args)


def test_without_a_policy_there_is_nothing_to_redate_from(db):
    with pytest.raises(CommandError, match="DEADLINE_POLICY"):
        call_command("order_timeout_redate")


def test_orders_created_now_get_the_same_deadline_the_redate_would_give(windows, order_model):
    """The policy at checkout and the re-date agree: a re-date right after changes nothing."""
    order_model.objects.create()

    assert redate()["unchanged"] == 1
    assert timezone.now() < deadline_of(order_model.objects.get())
