"""The refused writes reach staff: counted by ``order_timeout_status`` (``--max-refused``), the metrics
and the "Order timeouts" page, listed in the admin to act on, and marked handled there.

A refused write is money a shop may have taken for an order its deadline closed (or a payment's
row committed beside an expired order): nobody was told. Each face shows the ones not handled yet;
staff mark them handled once they refunded or put the order right.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import CommandError, call_command
from django.test import override_settings
from django.urls import reverse
from django.utils import timezone, translation
from prometheus_client import generate_latest

from order_timeout.exceptions import OrderClosed
from order_timeout.management.commands.order_timeout_status import THRESHOLD_CROSSED
from order_timeout.models import RefusedWrite
from order_timeout.reporting.metrics import backlog_registry

pytestmark = pytest.mark.django_db(transaction=True)

CHANGELIST = "admin:order_timeout_refusedwrite_changelist"
OVERVIEW = "admin:order_timeout_timeoutoverview_changelist"


@pytest.fixture(autouse=True)
def no_refused_writes_before() -> None:
    """Each test counts its own: a test outside a transaction of its own may have left one."""
    RefusedWrite.objects.all().delete()


def refused(object_id: str = "7", *, refusal: str = RefusedWrite.Refusal.PAID_AFTER_CLOSE, timer: str = "close",
            handled: bool = False, model: str = "order_timeout.Order") -> RefusedWrite:
    now = timezone.now()
    return RefusedWrite.objects.create(model=model, object_id=object_id, timer=timer, refusal=refusal,
                                       values={"status": "paid"}, handled_at=now if handled else None)


def status(*args: str) -> dict[str, Any]:
    out = io.StringIO()
    call_command("order_timeout_status", "--json", "--no-drift", *args, stdout=out)
    return json.loads(out.getvalue())


def staff(username: str, *codenames: str) -> User:
    user = User.objects.create_user(username, password="pw", is_staff=True)
    user.user_permissions.add(*(Permission.objects.get(content_type__app_label="order_timeout", codename=codename)
                                for codename in codenames))
    return user


# -- order_timeout_status ----------------------------------------------------------------------------


def test_the_status_counts_the_refused_writes_waiting_for_staff(make_order, consumer):
    order = make_order(in_seconds=-1)
    consumer().run(once=True)
    with pytest.raises(OrderClosed):
        order.mark_paid()
    refused("8", refusal=RefusedWrite.Refusal.STALE_SAVE, timer="ticket-order-expiry")
    refused("9", handled=True)

    assert status()["refused_writes"] == 2


def test_the_status_prints_the_refused_writes_for_people():
    refused()
    out = io.StringIO()

    call_command("order_timeout_status", "--no-drift", stdout=out)

    assert [line.split() for line in out.getvalue().splitlines() if line.startswith("refused writes")] == [
        ["refused", "writes", "1"]]


def test_max_refused_exits_with_the_threshold_code_when_more_wait():
    refused("1")
    refused("2")
    status("--max-refused", "2")

    with pytest.raises(CommandError, match=r"^2 refused writes wait for staff > --max-refused 1$") as crossed:
        status("--max-refused", "1")

    assert crossed.value.returncode == THRESHOLD_CROSSED


def test_handled_ones_do_not_cross_max_refused():
    refused("1", handled=True)

    status("--max-refused", "0")


def test_a_project_with_no_order_close_counts_and_holds_its_refused_writes_too(settings):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "ORDER_MODEL": None}
    refused(model="saleorlike.Order", timer="saleor-unconfirmed-expiry")
    text = io.StringIO()
    call_command("order_timeout_status", "--no-drift", stdout=text)

    assert status()["refused_writes"] == 1
    assert ["refused", "writes", "1"] in [line.split() for line in text.getvalue().splitlines()]
    with pytest.raises(CommandError, match="1 refused writes wait for staff") as crossed:
        status("--max-refused", "0")
    assert crossed.value.returncode == THRESHOLD_CROSSED


# -- the metrics ---------------------------------------------------------------------------------------


def test_the_metrics_gauge_the_open_refused_writes_by_refusal():
    refused("1")
    refused("2")
    refused("3", handled=True)

    text = generate_latest(backlog_registry()).decode()

    assert 'order_timeout_refused_writes{refusal="paid_after_close"} 2.0' in text
    assert 'order_timeout_refused_writes{refusal="stale_save"} 0.0' in text


# -- the admin: the list, and marking handled ------------------------------------------------------------


def test_staff_list_the_open_refused_writes_with_a_link_to_each_row(admin_client, make_order):
    order = make_order(in_seconds=600)
    waiting = refused(str(order.pk))
    refused("99", handled=True)

    page = admin_client.get(reverse(CHANGELIST), {"handled": "no"})

    assert page.status_code == 200
    assert list(page.context["cl"].result_list) == [waiting]
    assert f'<a href="{reverse("admin:order_timeout_order_change", args=[order.pk])}">{order.pk}</a>' in page.text


def test_staff_see_each_row_by_the_name_its_clients_know_find_it_by_that_name_and_see_what_settled_it(
        admin_client, make_order):
    order = make_order(in_seconds=600)
    named = RefusedWrite.objects.create(model="order_timeout.Order", object_id=str(order.pk), public_name="A-1001",
                                        timer="close", refusal=RefusedWrite.Refusal.PAID_AFTER_CLOSE)
    settled = RefusedWrite.objects.create(model="order_timeout.Order", object_id="98", timer="close",
                                          refusal=RefusedWrite.Refusal.PAID_AFTER_CLOSE, handled_at=timezone.now(),
                                          settled_how="status is now 'paid', what the refused write tried to write")

    found = admin_client.get(reverse(CHANGELIST), {"q": "A-1001"})
    by_itself = admin_client.get(reverse(CHANGELIST), {"handled": "itself"})

    assert list(found.context["cl"].result_list) == [named]
    assert f'<a href="{reverse("admin:order_timeout_order_change", args=[order.pk])}">A-1001</a>' in found.text
    assert list(by_itself.context["cl"].result_list) == [settled]
    assert "status is now &#x27;paid&#x27;, what the refused write tried to write" in by_itself.text


@pytest.mark.parametrize(("query", "expected"), [
    ({"refusal": "stale_save"}, ["2"]), ({"timer": "ticket-order-expiry"}, ["2"]), ({"handled": "yes"}, ["3"]),
    ({"q": "1"}, ["1"]),
], ids=["by-refusal", "by-timer", "handled", "search-by-object-id"])
def test_staff_filter_refused_writes_by_refusal_timer_and_handled_and_find_one_by_its_object_id(
        admin_client, query, expected):
    refused("1")
    refused("2", refusal=RefusedWrite.Refusal.STALE_SAVE, timer="ticket-order-expiry")
    refused("3", handled=True)

    page = admin_client.get(reverse(CHANGELIST), query)

    assert sorted(row.object_id for row in page.context["cl"].result_list) == expected


def test_marking_refused_writes_handled_records_who_and_when(client):
    rows = [refused("1"), refused("2"), refused("3", handled=True)]
    ops = staff("ops", "change_refusedwrite")
    client.force_login(ops)

    response = client.post(reverse(CHANGELIST), {"action": "mark_handled", "index": 0,
                                                 "_selected_action": [row.pk for row in rows]}, follow=True)

    assert [str(message) for message in response.context["messages"]] == ["2 refused writes marked handled."]
    assert RefusedWrite.objects.open().count() == 0
    assert set(RefusedWrite.objects.exclude(pk=rows[2].pk).values_list("handled_by", flat=True)) == {ops.pk}


def test_marking_handled_rows_that_are_handled_already_says_so(admin_client):
    row = refused("1", handled=True)

    response = admin_client.post(reverse(CHANGELIST), {"action": "mark_handled", "index": 0,
                                                       "_selected_action": [row.pk]}, follow=True)

    assert [str(message) for message in response.context["messages"]] == [
        "Nothing to do: the selected refused writes were handled already."]


def test_staff_who_may_only_view_refused_writes_cannot_mark_them_handled(client):
    row = refused("1")
    client.force_login(staff("auditor", "view_refusedwrite"))

    page = client.get(reverse(CHANGELIST))
    client.post(reverse(CHANGELIST), {"action": "mark_handled", "index": 0, "_selected_action": [row.pk]})

    assert page.status_code == 200 and 'value="mark_handled"' not in page.text
    assert RefusedWrite.objects.open().count() == 1


def test_a_refused_write_is_a_record_nobody_adds_edits_or_deletes_in_the_admin(admin_client):
    row = refused("1")

    change = admin_client.post(reverse("admin:order_timeout_refusedwrite_change", args=[row.pk]),
                               {"object_id": "2", "refusal": "stale_save"})
    add = admin_client.get(reverse("admin:order_timeout_refusedwrite_add"))
    delete = admin_client.get(reverse("admin:order_timeout_refusedwrite_delete", args=[row.pk]))
    changelist = admin_client.get(reverse(CHANGELIST))

    assert (change.status_code, add.status_code, delete.status_code) == (403, 403, 403)
    assert 'value="delete_selected"' not in changelist.text
    assert RefusedWrite.objects.get(pk=row.pk).object_id == "1"


# -- the "Order timeouts" page ---------------------------------------------------------------------------


def test_the_overview_shows_the_refused_writes_waiting_with_a_link_to_them(admin_client):
    refused("1")
    refused("2")
    refused("3", handled=True)

    page = admin_client.get(reverse(OVERVIEW))

    assert page.status_code == 200
    assert (f'<td id="refused-writes"><a href="{reverse(CHANGELIST)}?handled=no">2</a></td>' in page.text)
    assert "Refused writes waiting for staff" in page.text


def test_the_overview_links_the_refused_writes_only_for_who_may_see_them(client):
    refused("1")
    client.force_login(staff("looker", "view_timeoutoverview"))

    page = client.get(reverse(OVERVIEW))

    assert '<td id="refused-writes">1</td>' in page.text


def test_the_overview_counts_the_refused_writes_when_redis_cannot_be_read(admin_client, settings):
    refused("1")
    settings.CACHES = {**settings.CACHES, "order_timeout": {
        **settings.CACHES["order_timeout"], "LOCATION": "redis://127.0.0.1:1/0"}}

    page = admin_client.get(reverse(OVERVIEW))

    assert page.context["overview"].error
    assert f'<a href="{reverse(CHANGELIST)}?handled=no">1</a>' in page.text


@pytest.fixture
def simplified_chinese() -> Iterator[None]:
    with override_settings(LANGUAGE_CODE="zh-hans"), translation.override("zh-hans"):
        yield


def test_the_refused_writes_read_in_simplified_chinese(simplified_chinese, admin_client):
    row = refused("1")

    overview = admin_client.get(reverse(OVERVIEW))
    marked = admin_client.post(reverse(CHANGELIST), {"action": "mark_handled", "index": 0,
                                                     "_selected_action": [row.pk]}, follow=True)

    assert "Refused writes waiting for staff" not in overview.text
    assert [str(message) for message in marked.context["messages"]] == ["已将 1 条被拒绝的写入标记为已处理。"]


def test_the_handled_ones_are_pruned_after_the_dead_letter_retention_and_open_ones_never(settings):
    from order_timeout.scans.pruning import prune

    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "DEAD_LETTER_RETENTION": 86400}
    old, waiting = refused("1", handled=True), refused("3")
    refused("2", handled=True)  # handled just now
    RefusedWrite.objects.filter(pk__in=[old.pk, waiting.pk]).update(at=timezone.now() - timedelta(days=40))
    RefusedWrite.objects.filter(pk=old.pk).update(handled_at=timezone.now() - timedelta(days=2))

    result = prune()

    assert result.deleted["refused_writes"] == 1
    assert set(RefusedWrite.objects.values_list("object_id", flat=True)) == {"2", "3"}
