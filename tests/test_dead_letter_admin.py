"""The dead letters' admin: no back door to "close now", bounded work per click, no raw errors for lookers.

Tried: deleting a dead letter (Django's ``delete_selected``) sent its order back to the scan,
which closed it: "close now" without that permission and without a record of who did it.
"Select all" then Requeue or Close now locked every selected row in one transaction of the
web request. Staff with the view permission only read raw Redis errors (host and port) and
``last_error`` texts that may carry row values.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from order_timeout.models import DeadLetter, Order
from order_timeout.signals import order_expired
from order_timeout.timers.staff import STAFF_CHUNK

pytestmark = pytest.mark.django_db(transaction=True)

CHANGELIST = "admin:order_timeout_deadletter_changelist"
SECRET_VALUE = "card 4242-4242-4242-4242 of customer 77"


def staff(username: str, *permissions: str) -> User:
    user = User.objects.create_user(username, password="pw", is_staff=True)
    user.user_permissions.add(*(Permission.objects.get(content_type__app_label="order_timeout", codename=codename)
                                for codename in ("view_deadletter", *permissions)))
    return user


def dead_letters(count: int) -> list[DeadLetter]:
    """Overdue unpaid orders, each with an open dead letter (its close kept failing)."""
    now = timezone.now()
    orders = Order.objects.bulk_create([Order(expires_at=now - timedelta(minutes=10)) for _ in range(count)])
    return DeadLetter.objects.bulk_create([
        DeadLetter(order_model="order_timeout.Order", order_id=str(order.pk), attempts=4,
                   error_type="shop.StockServiceDown", last_error=f"StockServiceDown: {SECRET_VALUE}",
                   first_failed_at=now, last_failed_at=now) for order in orders])


def act_on_all(client, action: str):
    """The action on every dead letter, as "Select all" in the changelist sends it."""
    return client.post(reverse(CHANGELIST), {"action": action, "select_across": "1", "index": "0",
                                             "_selected_action": [DeadLetter.objects.first().pk]}, follow=True)


def test_dead_letters_cannot_be_deleted_from_the_admin_not_even_by_a_superuser(admin_client):
    letter, = dead_letters(1)

    changelist = admin_client.get(reverse(CHANGELIST))
    admin_client.post(reverse(CHANGELIST), {"action": "delete_selected", "_selected_action": [letter.pk],
                                            "post": "yes"})
    delete_page = admin_client.get(reverse("admin:order_timeout_deadletter_delete", args=[letter.pk]))

    assert 'value="delete_selected"' not in changelist.text
    assert delete_page.status_code == 403
    assert DeadLetter.objects.filter(pk=letter.pk, resolved_at__isnull=True).exists()


def test_close_now_on_every_dead_letter_closes_them_in_transactions_of_a_bounded_size(client):
    count = 2 * STAFF_CHUNK + 7
    dead_letters(count)
    client.force_login(staff("ops", "close_deadletter_order"))
    in_one_transaction: list[int] = []

    def measure(sender, order, **kwargs):
        connection.on_commit(lambda: None)
        in_one_transaction.append(len(connection.run_on_commit))

    order_expired.connect(measure, weak=False)
    try:
        response = act_on_all(client, "close_now")
    finally:
        order_expired.disconnect(measure)

    assert f"{count} orders closed." in response.text
    assert Order.objects.filter(status="closed").count() == count
    assert max(in_one_transaction) == STAFF_CHUNK
    assert DeadLetter.objects.filter(resolved_at__isnull=True).count() == 0


def test_requeue_of_every_dead_letter_locks_a_bounded_chunk_per_transaction(client, queue):
    count = 2 * STAFF_CHUNK + 7
    dead_letters(count)
    client.force_login(staff("ops", "requeue_deadletter"))

    with CaptureQueriesContext(connection) as queries:
        response = act_on_all(client, "requeue")

    assert f"{count} orders requeued." in response.text
    locking = [query["sql"] for query in queries if "FOR UPDATE" in query["sql"]
               and Order._meta.db_table in query["sql"]]
    assert len(locking) == 3
    assert sum(int(queue.client.zcard(shard.keys.pending)) for shard in queue.shards) == count


def test_staff_who_may_only_view_dead_letters_see_their_states_not_their_error_texts(client):
    letter, = dead_letters(1)
    client.force_login(staff("auditor"))

    changelist = client.get(reverse(CHANGELIST))
    page = client.get(reverse("admin:order_timeout_deadletter_change", args=[letter.pk]))
    searched = client.get(reverse(CHANGELIST), {"q": "4242"})

    assert changelist.status_code == page.status_code == 200
    assert SECRET_VALUE not in changelist.text and SECRET_VALUE not in page.text
    assert "shop.StockServiceDown" in page.text  # its kind, and its counts, still show
    assert len(searched.context["cl"].result_list) == 0  # no reading the text by searching it


def test_staff_who_act_on_dead_letters_read_their_error_texts(client):
    letter, = dead_letters(1)
    client.force_login(staff("ops", "requeue_deadletter"))

    page = client.get(reverse("admin:order_timeout_deadletter_change", args=[letter.pk]))

    assert SECRET_VALUE in page.text


def test_view_only_staff_see_that_redis_cannot_be_read_but_not_its_host(client, settings):
    viewer = User.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_timeoutoverview"))
    client.force_login(viewer)
    caches = {**settings.CACHES, "gone": {"BACKEND": "django_redis.cache.RedisCache",
                                          "LOCATION": "redis://10.11.12.13:6399/0",
                                          "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 0.2, "SOCKET_TIMEOUT": 0.2}}}

    with override_settings(CACHES=caches, ORDER_TIMEOUT={**settings.ORDER_TIMEOUT, "REDIS_ALIAS": "gone"}):
        page = client.get(reverse("admin:order_timeout_timeoutoverview_changelist"))

    assert page.status_code == 200
    assert 'id="queue-error"' in page.text
    assert "10.11.12.13" not in page.text and "6399" not in page.text
