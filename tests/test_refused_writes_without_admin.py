"""Staff without Django's admin act on the refused writes, and a refusal the shop's own path
settled waits for no one.

Seen in a ticket shop that runs no ``django.contrib.admin``: ``order_timeout.admin`` could not even
be imported (``LookupError: No installed app with label 'admin'``), and only the admin could mark a
refused write handled. And refused payments whose retry then went through the shop's own late-payment
path (the order ended paid, nothing to refund: 11 of 11 in one race) still waited for staff.
``order_timeout_refused`` lists them and marks them handled with a note; a refused write whose row
reached what it tried is settled by itself, with when and how, and not counted by ``--max-refused``.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import subprocess
import sys
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command

from order_timeout.exceptions import OrderClosed
from order_timeout.management.commands.order_timeout_status import THRESHOLD_CROSSED
from order_timeout.models import Order, RefusedWrite
from order_timeout.scans.turns import run_scan
from testproject.tickets import payments
from testproject.tickets.models import Payment, TicketOrder, TicketOrderStatus

from .conftest import PROJECT_ROOT
from .test_ticket_shop import checkout, expiring, ticket_timers  # noqa: F401 - fixtures

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def no_refused_writes_before() -> None:
    RefusedWrite.objects.all().delete()


def refused(command: str = "order_timeout_refused", *args: str) -> str:
    out = io.StringIO()
    call_command(command, *args, stdout=out)
    return out.getvalue()


def listed(*args: str) -> list[dict[str, Any]]:
    return json.loads(refused("order_timeout_refused", "--json", *args))


def paid_after_close(make_order: Any, consumer: Any) -> Order:
    """An order its deadline closed, then a payment for it: refused, recorded for staff."""
    order = make_order(in_seconds=-1)
    consumer().run(once=True)
    with pytest.raises(OrderClosed):
        Order.objects.get(pk=order.pk).mark_paid()
    return order


def confirmed_after_expiry(expiring: Any, monkeypatch: Any) -> TicketOrder:  # noqa: F811
    """The ticket shop's confirmation, outside a transaction, of an order that expired while the
    provider captured: the order's save refused, the payment's row confirmed."""
    order = checkout(in_seconds=-1)
    payment = Payment.objects.create(order=order)
    monkeypatch.setattr(payments, "capture_at_the_provider", lambda order: expiring())
    with pytest.raises(Exception, match="was acted on by its timer"):
        payments.confirm(payment.pk)
    return order


def max_refused_exit(limit: str = "0") -> int:
    """``order_timeout_status --max-refused``'s exit code."""
    try:
        call_command("order_timeout_status", "--no-drift", "--max-refused", limit, stdout=io.StringIO())
    except CommandError as crossed:
        return crossed.returncode
    return 0


# -- the command ---------------------------------------------------------------------------------


def test_staff_list_the_open_refused_writes_by_the_name_the_shop_knows(expiring, monkeypatch):  # noqa: F811
    order = confirmed_after_expiry(expiring, monkeypatch)

    row, = listed()

    assert {key: row[key] for key in ("model", "object_id", "name", "timer", "refusal", "values", "state")} == {
        "model": "tickets.TicketOrder", "object_id": str(order.pk), "name": order.code,
        "timer": "ticket-order-expiry", "refusal": "stale_save", "values": {"status": "paid"}, "state": "open"}
    assert (row["handled_at"], row["handled_by"], row["note"], row["settled_how"]) == (None, None, "", "")


def test_the_log_line_names_the_refused_write_and_the_row_by_its_public_name(expiring, monkeypatch, caplog):  # noqa: F811
    with caplog.at_level(logging.WARNING, logger="order_timeout"):
        order = confirmed_after_expiry(expiring, monkeypatch)

    row = RefusedWrite.objects.get(object_id=str(order.pk))
    assert (f"refused write #{row.pk} recorded for staff: tickets.TicketOrder {order.code} (pk {order.pk}), "
            "timer ticket-order-expiry, stale_save") in caplog.messages


def test_staff_filter_by_timer_and_state(make_order, consumer, expiring, monkeypatch):  # noqa: F811
    paid_after_close(make_order, consumer)
    confirmed_after_expiry(expiring, monkeypatch)

    assert [row["timer"] for row in listed("--timer", "close")] == ["close"]
    assert [row["timer"] for row in listed("--timer", "ticket-order-expiry", "--timer", "close")] == [
        "ticket-order-expiry", "close"]  # newest first
    assert listed("--state", "handled") == [] and listed("--state", "settled") == []
    assert len(listed("--state", "all")) == 2


def test_staff_mark_refused_writes_handled_with_a_note_and_the_alert_clears(make_order, consumer):
    order = paid_after_close(make_order, consumer)
    row = RefusedWrite.objects.get(object_id=str(order.pk))
    User.objects.create_user("ana", is_staff=True)
    assert max_refused_exit() == THRESHOLD_CROSSED

    out = refused("order_timeout_refused", "--handle", str(row.pk), "--note", "Refunded: PSP ref 7731", "--by", "ana")

    assert out == f"#{row.pk} order_timeout.Order {order.pk}: marked handled: Refunded: PSP ref 7731\n"
    handled, = listed("--state", "handled")
    assert (handled["state"], handled["handled_by"], handled["note"]) == ("handled", "ana", "Refunded: PSP ref 7731")
    assert listed() == []
    assert max_refused_exit() == 0


def test_marking_one_handled_twice_leaves_the_first_note(make_order, consumer):
    order = paid_after_close(make_order, consumer)
    row = RefusedWrite.objects.get(object_id=str(order.pk))
    refused("order_timeout_refused", "--handle", str(row.pk), "--note", "Refunded")

    out = refused("order_timeout_refused", "--handle", str(row.pk), "--note", "Refunded again")

    assert out.startswith(f"#{row.pk} order_timeout.Order {order.pk}: left as it was, handled already at ")
    assert RefusedWrite.objects.get(pk=row.pk).handled_note == "Refunded"


@pytest.mark.parametrize("args, message", [
    (["--handle", "999999", "--note", "x"], "No refused write #999999: nothing was marked."),
    (["--handle", "{pk}"], "Say what was done with --note"),
    (["--note", "Refunded"], "--note and --by go with --handle ID ..."),
    (["--handle", "{pk}", "--note", "x", "--by", "nobody"], "No user 'nobody'."),
    (["--limit", "0"], "--limit must be at least 1."),
    (["--state", "closed"], "argument --state: invalid choice: 'closed'"),
], ids=["unknown-id", "no-note", "note-alone", "unknown-user", "limit-0", "bad-state"])
def test_a_bad_option_is_a_command_error_and_marks_nothing(make_order, consumer, args, message):
    order = paid_after_close(make_order, consumer)
    pk = str(RefusedWrite.objects.get(object_id=str(order.pk)).pk)

    with pytest.raises(CommandError, match=re.escape(message)):
        call_command("order_timeout_refused", *[arg.replace("{pk}", pk) for arg in args], stdout=io.StringIO())

    assert RefusedWrite.objects.open().count() == 1


def test_the_listing_for_people_names_the_row_what_it_tried_and_who_handled_it(make_order, consumer):
    order = paid_after_close(make_order, consumer)
    row = RefusedWrite.objects.get(object_id=str(order.pk))
    refused("order_timeout_refused", "--handle", str(row.pk), "--note", "Refunded")

    out = refused("order_timeout_refused", "--state", "all")

    lines = out.splitlines()
    assert re.fullmatch(rf"#{row.pk}  \S+ \S+ \S+  order_timeout.Order {order.pk} \(pk {order.pk}\)  timer close  "
                        r"paid_after_close  handled", lines[0]), lines[0]
    assert lines[1] == '    tried to write: {"status": "paid"}'
    assert re.fullmatch(r"    handled at \S+ \S+ \S+ by someone: Refunded", lines[2]), lines[2]
    assert lines[3] == "1 refused write(s)"


# -- settled by itself -------------------------------------------------------------------------


def test_a_refused_payment_the_shops_own_late_path_then_took_is_settled_by_itself(expiring, monkeypatch):  # noqa: F811
    """The shop's webhook runs again, finds the order expired and takes its own late-payment path:
    the order ends paid, as the refused write tried. Nothing is left for staff."""
    order = confirmed_after_expiry(expiring, monkeypatch)
    assert max_refused_exit() == THRESHOLD_CROSSED
    assert payments.confirm_payment(order.pk) == "paid late"
    assert TicketOrder.objects.get(pk=order.pk).status == TicketOrderStatus.PAID

    # Counted no more at once (read-only), and marked at the scan's turn.
    assert max_refused_exit() == 0
    assert RefusedWrite.objects.open().count() == 1
    run_scan("consumer", due_only=False)

    row, = listed("--state", "settled")
    assert row["state"] == "settled" and row["handled_at"] is not None and row["handled_by"] is None
    assert row["settled_how"] == "status is now 'paid', what the refused write tried to write"
    assert listed() == []


def test_a_refused_payment_whose_order_stayed_closed_waits_for_staff(make_order, consumer):
    order = paid_after_close(make_order, consumer)

    run_scan("consumer", due_only=False)

    row, = listed()
    assert (row["object_id"], row["state"]) == (str(order.pk), "open")
    assert max_refused_exit() == THRESHOLD_CROSSED


def test_the_command_settles_before_it_lists(make_order, consumer):
    order = paid_after_close(make_order, consumer)
    Order.objects.filter(pk=order.pk).update(status="paid")  # the shop's own path, by hand

    assert listed() == []
    settled, = listed("--state", "settled")
    assert settled["object_id"] == str(order.pk)


# -- no django.contrib.admin -------------------------------------------------------------------


def test_the_app_and_its_admin_module_import_without_djangos_admin(tmp_path):
    (tmp_path / "noadmin_settings.py").write_text(
        "from testproject.settings import *  # noqa: F403\n"
        "INSTALLED_APPS = [app for app in INSTALLED_APPS if app != 'django.contrib.admin']  # noqa: F405\n")
    script = ("import django; django.setup(); import order_timeout.admin; "
              "from django.contrib import admin; from order_timeout.models import RefusedWrite; "
              "from django.core.management import load_command_class; "
              "load_command_class('order_timeout', 'order_timeout_refused'); print('ok')")

    result = subprocess.run([sys.executable, "-c", script], cwd=PROJECT_ROOT, capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": f"{tmp_path}:{PROJECT_ROOT}",
                                 "DJANGO_SETTINGS_MODULE": "noadmin_settings"})

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("ok")
