"""Staff pause and resume a timer from the admin's "Order timeouts" page, as the commands do.

The page shows every open pause at the top to anyone who may view it; those with
``order_timeout.pause_timers`` also get a form to pause (a timer and a reason) and, per paused
timer, a form to resume it (with a checkbox that gives the time back). The forms call the same
functions as ``order_timeout_pause`` and ``order_timeout_resume``, with the user who clicked; a
refusal is an error message naming it. Every pause and resume is listed, read-only.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import call_command
from django.db.models import F
from django.test import Client, override_settings
from django.urls import reverse
from django.utils import timezone, translation

from order_timeout.models import Order, Pause

from .helpers import state
from .test_admin_overview import browser  # noqa: F401 - the real browser, where chromium is installed

pytestmark = pytest.mark.django_db(transaction=True)

OVERVIEW = "admin:order_timeout_timeoutoverview_changelist"
PAUSE = "admin:order_timeout_timeoutoverview_pause"
RESUME = "admin:order_timeout_timeoutoverview_resume"
HISTORY = "admin:order_timeout_pause_changelist"

# What staff who pause timers hold: the page, the permission of its own, and the history.
PAUSER = ("view_timeoutoverview", "pause_timers", "view_pause")


def staff(username: str, *codenames: str) -> User:
    user = User.objects.create_user(username, password="pw", is_staff=True)
    user.user_permissions.add(*(Permission.objects.get(content_type__app_label="order_timeout", codename=codename)
                                for codename in codenames))
    return user


def logged_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def messages_of(response: Any) -> list[str]:
    return [str(message) for message in response.context["messages"]]


def deadline(order: Order) -> Any:
    return Order.objects.values_list("expires_at", flat=True).get(pk=order.pk)


def pause_rows() -> list[tuple[Any, ...]]:
    """Every pause as the database holds it: what a refused form must leave as it was."""
    return list(Pause.objects.order_by("pk").values_list("timer", "reason", "paused_by", "resumed_at",
                                                          "given_back_seconds", "given_back_rows"))


def two_minutes_ago() -> None:
    """The open pause of the close began two minutes ago: an outage long enough to give back."""
    Pause.objects.filter(open_for="close").update(paused_at=F("paused_at") - timedelta(seconds=120))


def test_staff_who_may_pause_pause_the_close_with_a_reason_and_see_it_at_the_top():
    ops = staff("ops", *PAUSER)
    client = logged_in(ops)
    page = client.get(reverse(OVERVIEW))
    assert 'id="pause-form"' in page.text and 'id="nothing-paused"' in page.text

    response = client.post(reverse(PAUSE), {"timer": "close", "reason": "PSP outage"}, follow=True)

    row = Pause.objects.get()
    assert (row.timer, row.reason, row.paused_by, row.resumed_at) == ("close", "PSP outage", ops, None)
    assert response.redirect_chain == [(reverse(OVERVIEW), 302)]
    assert messages_of(response) == ["Paused close: PSP outage. Nothing of it is claimed or acted on until "
                                     "it is resumed."]
    assert [(p.timer, p.by, p.reason) for p in response.context["pauses"]] == [("close", "ops", "PSP outage")]
    text = response.text
    # At the top of the page, before the figures; with its resume form and the give-back checkbox.
    assert text.index('id="paused-timers"') < text.index('id="figures"')
    assert '<tr id="paused-close"><th scope="row">close</th>' in text
    assert 'id="resume-close"' in text and 'id="give-back-close"' in text
    assert "within 600 s after now, moves later by the pause's length" in text
    # A paused timer is no longer offered for a pause.
    assert '<option value="close">' not in text


def test_resuming_with_the_time_given_back_moves_the_deadlines_as_the_command_does(make_order):
    ops = staff("ops", *PAUSER)
    client = logged_in(ops)

    def moved_in_pause_lengths(pause: Callable[[], None], resume: Callable[[], Any]) -> tuple[dict[str, float], Any]:
        """Pause the close two minutes back, resume it giving the time back; how far each deadline
        moved, in lengths of the pause (before it, inside it, just after the resume, long after)."""
        pause()
        two_minutes_ago()
        orders = {"before": make_order(in_seconds=-300), "inside": make_order(in_seconds=-60),
                  "just after": make_order(in_seconds=300), "long after": make_order(in_seconds=3600)}
        was = {name: deadline(order) for name, order in orders.items()}
        answer = resume()
        row = Pause.objects.filter(resumed_at__isnull=False).latest("pk")
        moved = {name: round((deadline(order) - was[name]).total_seconds() / row.given_back_seconds, 6)
                 for name, order in orders.items()}
        Order.objects.filter(pk__in=[order.pk for order in orders.values()]).delete()
        return moved, (row, answer)

    by_command, (command_row, _out) = moved_in_pause_lengths(
        lambda: call_command("order_timeout_pause", "--reason", "PSP outage", stdout=io.StringIO()),
        lambda: call_command("order_timeout_resume", "--give-back", stdout=io.StringIO()))
    by_admin, (admin_row, response) = moved_in_pause_lengths(
        lambda: client.post(reverse(PAUSE), {"timer": "close", "reason": "PSP outage"}),
        lambda: client.post(reverse(RESUME), {"timer": "close", "give_back": "1"}, follow=True))

    assert by_admin == by_command == {"before": 0, "inside": 1, "just after": 1, "long after": 0}
    assert admin_row.given_back_rows == command_row.given_back_rows == 2
    assert 120 <= admin_row.given_back_seconds < 130
    assert (admin_row.paused_by, admin_row.resumed_by, admin_row.open_for) == (ops, ops, None)
    message = messages_of(response)[-1]  # after the pause's, which the page had not shown yet
    assert message.startswith("Resumed close, paused since ") and "(PSP outage); gave 12" in message
    assert " s back to 2 rows due before " in message
    assert 'id="nothing-paused"' in response.text


def test_resuming_without_the_checkbox_leaves_the_deadlines_and_closes_what_fell_due(make_order, consumer):
    client = logged_in(staff("ops", *PAUSER))
    client.post(reverse(PAUSE), {"timer": "close", "reason": "PSP outage"})
    two_minutes_ago()
    due = make_order(in_seconds=-60)
    was = deadline(due)
    consumer().run(once=True)
    assert state(due) == "unpaid"  # paused: nothing is closed

    response = client.post(reverse(RESUME), {"timer": "close"}, follow=True)
    consumer().run(once=True)

    assert deadline(due) == was and state(due) == "closed"
    assert Pause.objects.get().given_back_seconds is None
    assert messages_of(response)[-1].endswith("(PSP outage): what fell due is acted on now.")


def test_the_history_lists_every_pause_and_resume_newest_first_read_only(admin_client):
    ops, lead = staff("ops", *PAUSER), staff("lead", *PAUSER)
    logged_in(ops).post(reverse(PAUSE), {"timer": "close", "reason": "PSP outage"})
    two_minutes_ago()
    logged_in(lead).post(reverse(RESUME), {"timer": "close", "give_back": "1"})
    logged_in(ops).post(reverse(PAUSE), {"timer": "close", "reason": "3-D Secure failing again"})

    response = logged_in(ops).get(reverse(HISTORY))

    assert response.status_code == 200
    rows = [(row.reason, row.paused_by, row.resumed_by, row.given_back_seconds is not None)
            for row in response.context["cl"].result_list]
    assert rows == [("3-D Secure failing again", ops, None, False), ("PSP outage", ops, lead, True)]
    for column in ("Timer", "Paused at", "Paused by", "Reason", "Resumed at", "Resumed by",
                   "Seconds given back", "Rows given back"):
        assert column in response.text
    # Nobody adds, changes or deletes the record, not even a superuser.
    first = Pause.objects.earliest("pk")
    assert admin_client.get(reverse("admin:order_timeout_pause_add")).status_code == 403
    assert admin_client.post(reverse("admin:order_timeout_pause_change", args=[first.pk]),
                             {"reason": "rewritten"}).status_code == 403
    assert admin_client.post(reverse("admin:order_timeout_pause_delete", args=[first.pk]),
                             {"post": "yes"}).status_code == 403
    assert Pause.objects.get(pk=first.pk).reason == "PSP outage" and Pause.objects.count() == 2


@pytest.mark.parametrize("codenames", [("view_timeoutoverview",), ("view_timeoutoverview", "view_pause")],
                         ids=["page only", "page and history"])
def test_staff_without_pause_timers_see_the_pause_but_no_form_and_a_post_is_refused(codenames):
    call_command("order_timeout_pause", "--reason", "PSP outage", stdout=io.StringIO())
    client = logged_in(staff("looker", *codenames))
    before = pause_rows()

    page = client.get(reverse(OVERVIEW)).text
    pause_refused = client.post(reverse(PAUSE), {"timer": "notices", "reason": "just looking"})
    resume_refused = client.post(reverse(RESUME), {"timer": "close", "give_back": "1"})

    assert '<tr id="paused-close"><th scope="row">close</th>' in page and "PSP outage" in page
    assert "a command" in page  # paused by the command, not by a user
    assert 'id="pause-form"' not in page and 'id="resume-close"' not in page and "give_back" not in page
    assert ('id="pause-history"' in page) == ("view_pause" in codenames)
    assert (pause_refused.status_code, resume_refused.status_code) == (403, 403)
    assert pause_rows() == before


def test_pause_timers_without_the_page_is_refused_too():
    client = logged_in(staff("ops", "pause_timers"))

    response = client.post(reverse(PAUSE), {"timer": "close", "reason": "PSP outage"})

    assert response.status_code == 403 and not Pause.objects.exists()


@pytest.mark.parametrize(("paused", "url", "form", "says"), [
    ([], PAUSE, {"timer": "close", "reason": "  "}, "A pause needs a reason"),
    ([], PAUSE, {"timer": "close"}, "A pause needs a reason"),
    ([], PAUSE, {"timer": "nope", "reason": "PSP outage"}, "No timer named 'nope': the timers are "),
    (["close"], PAUSE, {"timer": "close", "reason": "PSP outage"}, "close is paused already"),
    ([], RESUME, {"timer": "close"}, "close is not paused."),
    ([], RESUME, {"timer": "close", "give_back": "1"}, "close is not paused."),
    (["reminders"], RESUME, {"timer": "reminders", "give_back": "1"}, "reminders has no deadline of its own"),
    (["notices"], RESUME, {"timer": "notices", "give_back": "1"}, "notices has no deadline of its own"),
], ids=["blank reason", "no reason", "unknown timer", "paused already", "not paused",
        "give-back on what is not paused", "give-back on the reminders", "give-back on the notices"])
def test_a_refused_pause_or_resume_is_an_error_message_naming_it_and_changes_nothing(settings, paused, url, form,
                                                                                     says):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "REMINDERS": [60]}
    for name in paused:
        call_command("order_timeout_pause", "--timer", name, "--reason", "PSP outage", stdout=io.StringIO())
    client = logged_in(staff("ops", *PAUSER))
    before = pause_rows()

    response = client.post(reverse(url), form, follow=True)

    assert response.redirect_chain == [(reverse(OVERVIEW), 302)]
    [message] = response.context["messages"]
    assert says in str(message) and message.level_tag == "error"
    assert pause_rows() == before


def test_the_give_back_checkbox_shows_only_where_a_give_back_can_work(settings):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "REMINDERS": [60]}
    for name in ("close", "reminders"):
        call_command("order_timeout_pause", "--timer", name, "--reason", "PSP outage", stdout=io.StringIO())

    page = logged_in(staff("ops", *PAUSER)).get(reverse(OVERVIEW)).text

    assert 'id="resume-close"' in page and 'id="resume-reminders"' in page
    assert 'id="give-back-close"' in page and 'id="give-back-reminders"' not in page


def test_the_forms_take_only_a_post_with_a_csrf_token():
    client = Client(enforce_csrf_checks=True)
    client.force_login(staff("ops", *PAUSER))

    assert client.get(reverse(PAUSE)).status_code == 405
    assert client.get(reverse(RESUME)).status_code == 405
    assert client.post(reverse(PAUSE), {"timer": "close", "reason": "PSP outage"}).status_code == 403
    assert not Pause.objects.exists()


def test_the_pause_box_reads_in_simplified_chinese():
    call_command("order_timeout_pause", "--reason", "PSP outage", stdout=io.StringIO())
    client = logged_in(staff("ops", *PAUSER))

    with override_settings(LANGUAGE_CODE="zh-hans"), translation.override("zh-hans"):
        page = client.get(reverse(OVERVIEW)).text
        history = client.get(reverse(HISTORY)).text

    for english in ("Paused by staff", "Paused since", "Give the time back", "Resume close",
                    "Pause the timer", "Every pause and resume"):
        assert english not in page
    assert "恢复 close" in page and "归还时间" in page and "所有暂停与恢复" in page
    assert "暂停于" in history and "归还的秒数" in history


def test_in_a_browser_staff_pause_the_close_and_resume_it_giving_the_time_back(browser,  # noqa: F811
                                                                              live_server, make_order):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    staff("ops", *PAUSER)
    browser.get(f"{live_server.url}{reverse('admin:login')}")
    browser.find_element(By.NAME, "username").send_keys("ops")
    browser.find_element(By.NAME, "password").send_keys("pw")
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    browser.find_element(By.LINK_TEXT, "Order timeouts").click()

    Select(browser.find_element(By.ID, "pause-timer")).select_by_value("close")
    browser.find_element(By.ID, "pause-reason").send_keys("PSP outage")
    browser.find_element(By.CSS_SELECTOR, "#pause-form button").click()

    # The paused timer's row is on the page the form led to (the implicit wait waits for it).
    assert "PSP outage" in browser.find_element(By.ID, "paused-close").text
    assert "Paused close: PSP outage." in browser.find_element(By.CSS_SELECTOR, "ul.messagelist").text
    two_minutes_ago()
    order = make_order(in_seconds=-60)
    was = deadline(order)

    browser.find_element(By.ID, "give-back-close").click()
    browser.find_element(By.CSS_SELECTOR, "#resume-close button").click()

    assert browser.find_element(By.ID, "nothing-paused")  # the next page, not the one clicked on
    assert "back to 1 row due before" in browser.find_element(By.CSS_SELECTOR, "ul.messagelist").text
    given = Pause.objects.get().given_back_seconds
    assert deadline(order) == was + timedelta(seconds=given)
    assert timezone.now() < deadline(order)
