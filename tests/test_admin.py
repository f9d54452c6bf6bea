from __future__ import annotations

import pytest
from django.urls import reverse

pytestmark = pytest.mark.django_db(transaction=True)


def test_order_changelist_shows_status_deadline_and_close_fields(admin_client, make_order):
    make_order(in_seconds=60)

    response = admin_client.get(reverse("admin:order_timeout_order_changelist"))

    assert response.status_code == 200
    for column in ("status", "expires_at", "closed_at", "close_reason"):
        assert f"column-{column}" in response.text
    assert "By status" in response.text


def test_status_is_read_only_in_the_order_admin(admin_client, make_order):
    order = make_order(in_seconds=60)

    response = admin_client.get(reverse("admin:order_timeout_order_change", args=[order.pk]))

    assert response.status_code == 200
    assert 'name="status"' not in response.text


def test_order_changelist_filters_by_status(admin_client, make_order):
    unpaid = make_order(in_seconds=60)
    paid = make_order(in_seconds=60)
    paid.mark_paid()

    response = admin_client.get(reverse("admin:order_timeout_order_changelist") + "?status__exact=paid")

    assert list(response.context["cl"].result_list) == [paid]
    assert unpaid not in response.context["cl"].result_list
