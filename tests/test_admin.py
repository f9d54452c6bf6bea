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


# -- what a dead letter keeps of a receiver's error ------------------------------------------

class StockServiceDown(Exception):
    pass


def release_stock(order):
    raise StockServiceDown(f"stock service down for order {order.pk}")


@pytest.fixture
def failing_close(receiver, settings):
    """A receiver of order_expired that raises, and no retries: the first failure is a dead letter."""
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "RETRY_DELAYS": []}

    @receiver
    def refuse(sender, order, **kwargs):
        release_stock(order)


def dead_letter_of(make_order, consumer):
    from order_timeout.models import DeadLetter

    order = make_order(in_seconds=-1)
    consumer().run(once=True)
    return order, DeadLetter.objects.get(order_id=str(order.pk))


def test_a_dead_letter_keeps_only_the_exception_line_by_default(failing_close, make_order, consumer,
                                                                 admin_client, caplog):
    order, letter = dead_letter_of(make_order, consumer)

    assert letter.error_type == "tests.test_admin.StockServiceDown"
    assert letter.last_error == f"tests.test_admin.StockServiceDown: stock service down for order {order.pk}"
    page = admin_client.get(reverse("admin:order_timeout_deadletter_change", args=[letter.pk])).text
    assert "stock service down" in page
    assert "Traceback" not in page and "release_stock" not in page
    # The consumer's log is for operators: the give-up's line keeps the traceback (the retry's
    # line is one line, its traceback at DEBUG).
    failed = next(record for record in caplog.records if record.getMessage().startswith("close failed"))
    given_up = next(record for record in caplog.records
                    if record.getMessage().startswith(f"close order={order.pk} dead-lettered"))
    assert failed.exc_info is None
    assert given_up.exc_info and "release_stock" in caplog.text


def test_dead_letter_tracebacks_keeps_the_whole_traceback(failing_close, make_order, consumer, settings):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "DEAD_LETTER_TRACEBACKS": True}

    order, letter = dead_letter_of(make_order, consumer)

    assert letter.last_error.startswith("Traceback (most recent call last):")
    assert "in release_stock" in letter.last_error
    assert letter.last_error.endswith(
        f"tests.test_admin.StockServiceDown: stock service down for order {order.pk}")


@pytest.mark.parametrize("tracebacks", [False, True])
def test_close_now_failing_again_records_the_error_by_the_same_rule(failing_close, make_order, consumer,
                                                                    settings, admin_client, tracebacks):
    from order_timeout.models import DeadLetter

    order, letter = dead_letter_of(make_order, consumer)
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "DEAD_LETTER_TRACEBACKS": tracebacks}

    admin_client.post(reverse("admin:order_timeout_deadletter_changelist"),
                      {"action": "close_now", "_selected_action": [letter.pk], "index": 0})

    letter = DeadLetter.objects.get(pk=letter.pk)
    assert letter.attempts == 2 and not letter.is_resolved
    assert ("Traceback" in letter.last_error) is tracebacks
    assert letter.last_error.endswith(f"StockServiceDown: stock service down for order {order.pk}")


@pytest.mark.parametrize("value", [1, "yes", None])
def test_dead_letter_tracebacks_must_be_a_boolean(settings, value):
    from django.core.exceptions import ImproperlyConfigured

    from order_timeout.conf import settings as order_settings

    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "DEAD_LETTER_TRACEBACKS": value}

    with pytest.raises(ImproperlyConfigured, match=r"\['DEAD_LETTER_TRACEBACKS'\] must be True or False"):
        order_settings.load()
