"""The admin's "Order timeouts" page: the figures at a glance, for staff allowed to see them."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse

from order_timeout.models import DeadLetter

from .conftest import PROJECT_ROOT

pytestmark = pytest.mark.django_db(transaction=True)

OVERVIEW = "admin:order_timeout_timeoutoverview_changelist"


def staff(username: str, *codenames: str) -> User:
    user = User.objects.create_user(username, password="pw", is_staff=True)
    user.user_permissions.add(*(Permission.objects.get(codename=codename) for codename in codenames))
    return user


@pytest.fixture
def prepared(make_order, consumer):
    """3 pending ahead, 2 overdue waiting, 2 closed a while after their deadline, 1 open dead letter."""
    for seconds in (60, 120, 180):
        make_order(in_seconds=seconds)
    closed = [make_order(in_seconds=-3) for _ in range(2)]
    consumer(follow_database_clock=True, now=None).run(once=True)
    overdue = [make_order(in_seconds=-5) for _ in range(2)]
    DeadLetter.objects.create(order_model="order_timeout.Order", order_id=str(overdue[0].pk), attempts=4,
                              error_type="StockServiceDown", first_failed_at=overdue[0].expires_at,
                              last_failed_at=overdue[0].expires_at)
    return {"closed": closed, "overdue": overdue}


def test_the_admin_index_links_to_order_timeouts(admin_client):
    response = admin_client.get(reverse("admin:index"))

    assert "Order timeouts" in response.text and reverse(OVERVIEW) in response.text


def test_staff_with_the_view_permission_see_the_figures(prepared):
    client = Client()
    client.force_login(staff("ops", "view_timeoutoverview"))

    response = client.get(reverse(OVERVIEW))

    assert response.status_code == 200
    health = response.context["overview"].health
    assert (health.pending, health.due_unclaimed, health.dead_letters) == (5, 2, 1)
    assert '<td id="pending">5</td>' in response.text
    assert "<svg" in response.text and response.context["overview"].closes == 2
    assert 'id="requeue-all"' not in response.text  # no permission to act


@pytest.mark.parametrize("user", ["no-permission", "not-staff"])
def test_without_staff_and_the_view_permission_there_is_no_page(user):
    client = Client()
    if user == "no-permission":
        client.force_login(staff("ops"))
    else:
        client.force_login(User.objects.create_user("customer", password="pw"))

    response = client.get(reverse(OVERVIEW))

    assert response.status_code in (302, 403)
    assert "figures" not in response.text


def test_the_buttons_need_a_csrf_token(prepared):
    client = Client(enforce_csrf_checks=True)
    client.force_login(staff("ops", "view_timeoutoverview", "view_deadletter", "requeue_deadletter"))
    letter = DeadLetter.objects.get()

    response = client.post(reverse("admin:order_timeout_deadletter_changelist"),
                           {"action": "requeue", "_selected_action": [letter.pk], "index": 0})

    assert response.status_code == 403
    assert not DeadLetter.objects.get().is_resolved


# -- in a real browser --------------------------------------------------------------------

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
ARTIFACTS = Path(os.environ.get("TEST_ARTIFACTS", PROJECT_ROOT / "test-artifacts"))


@pytest.fixture
def browser():
    if not (shutil.which(CHROMIUM) and shutil.which(CHROMEDRIVER)):
        pytest.skip(f"no {CHROMIUM} and {CHROMEDRIVER}: scripts/test installs Debian's chromium and "
                    "chromium-driver where it can")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--no-first-run", "--window-size=1280,1500"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.implicitly_wait(5)
    yield driver
    driver.quit()


def test_in_a_browser_staff_read_the_figures_and_requeue_a_dead_letter(browser, live_server,
                                                                      prepared, queue):
    from selenium.webdriver.common.by import By

    staff("ops", "view_timeoutoverview", "view_deadletter", "requeue_deadletter",
          "close_deadletter_order")
    browser.get(f"{live_server.url}{reverse('admin:login')}")
    browser.find_element(By.NAME, "username").send_keys("ops")
    browser.find_element(By.NAME, "password").send_keys("pw")
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    browser.find_element(By.LINK_TEXT, "Order timeouts").click()

    figures = {cell: browser.find_element(By.ID, cell).text
               for cell in ("pending", "due", "dead-letters", "overdue")}
    assert figures == {"pending": "5", "due": "2", "dead-letters": "1", "overdue": "2"}
    assert browser.find_element(By.CSS_SELECTOR, "#lateness-chart svg polyline")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(ARTIFACTS / "order-timeouts-overview.png"))

    browser.find_element(By.ID, "requeue-all").click()

    assert "1 order requeued." in browser.find_element(By.CSS_SELECTOR, "ul.messagelist").text
    assert DeadLetter.objects.get().resolution == DeadLetter.Resolution.REQUEUED
    assert (ARTIFACTS / "order-timeouts-overview.png").stat().st_size > 10_000
