"""The admin's "Order timeouts" page: the figures at a glance, for staff allowed to see them."""

from __future__ import annotations

import os
import shutil
import tempfile
import xml.etree.ElementTree as ET
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test import Client
from django.urls import reverse

from order_timeout.models import DeadLetter
from order_timeout.reporting.overview import MinuteOfCloses, _quantile, lateness_svg

from .conftest import PROJECT_ROOT

# The page and its buttons run on the real databases; the chart's own tests need none.
db = pytest.mark.django_db(transaction=True)

OVERVIEW = "admin:order_timeout_timeoutoverview_changelist"


def staff(username: str, *codenames: str) -> User:
    user = User.objects.create_user(username, password="pw", is_staff=True)
    user.user_permissions.add(*(Permission.objects.get(content_type__app_label="order_timeout", codename=codename)
                                for codename in codenames))
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


@db
def test_the_admin_index_links_to_order_timeouts(admin_client):
    response = admin_client.get(reverse("admin:index"))

    assert "Order timeouts" in response.text and reverse(OVERVIEW) in response.text


@db
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


@db
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


@db
def test_the_buttons_need_a_csrf_token(prepared):
    client = Client(enforce_csrf_checks=True)
    client.force_login(staff("ops", "view_timeoutoverview", "view_deadletter", "requeue_deadletter"))
    letter = DeadLetter.objects.get()

    response = client.post(reverse("admin:order_timeout_deadletter_changelist"),
                           {"action": "requeue", "_selected_action": [letter.pk], "index": 0})

    assert response.status_code == 403
    assert not DeadLetter.objects.get().is_resolved


def open_letters(count: int) -> list[DeadLetter]:
    from django.utils import timezone

    now = timezone.now()
    return [DeadLetter.objects.create(order_model="order_timeout.Order", order_id=str(n), attempts=4,
                                      error_type="StockServiceDown", first_failed_at=now,
                                      last_failed_at=now)
            for n in range(1, count + 1)]


@db
@pytest.mark.parametrize(("letters", "requeue", "close"), [
    (1, "Requeue the open dead letter", "Close its order now"),
    (3, "Requeue the 3 open dead letters", "Close their 3 orders now"),
])
def test_the_two_buttons_read_as_a_pair(admin_client, letters, requeue, close):
    open_letters(letters)

    response = admin_client.get(reverse(OVERVIEW))

    assert f'id="requeue-all" class="button">{requeue}</button>' in response.text
    assert f'id="close-all" class="button">{close}</button>' in response.text


@db
@pytest.mark.parametrize("url", ["add/", "1/", "1/change/", "1/history/", "1/delete/",
                                 "anything/else/"])
def test_the_overview_registers_no_url_but_its_page(url):
    """A staff user who may view the page gets a 403 or 404 from every other URL, never a 500."""
    client = Client(raise_request_exception=False)
    client.force_login(staff("ops", "view_timeoutoverview"))

    response = client.get(reverse(OVERVIEW) + url)

    assert response.status_code in (403, 404)


# Which links and buttons each set of permissions shows (besides view_timeoutoverview).
PERMISSION_SETS = {
    "overview only": ((), set()),
    "view dead letters": (("view_deadletter",), {"open-dead-letters"}),
    "requeue without view": (("requeue_deadletter",), set()),
    "close without view": (("close_deadletter_order",), set()),
    "view and requeue": (("view_deadletter", "requeue_deadletter"),
                         {"open-dead-letters", "requeue-all"}),
    "view and close": (("view_deadletter", "close_deadletter_order"),
                       {"open-dead-letters", "close-all"}),
    "change and both": (("change_deadletter", "requeue_deadletter", "close_deadletter_order"),
                        {"open-dead-letters", "requeue-all", "close-all"}),
    "view orders": (("view_order",), {"overdue-orders"}),
}


@db
@pytest.mark.parametrize("permissions", PERMISSION_SETS)
def test_links_and_buttons_show_only_to_users_who_may_use_them(prepared, permissions):
    codenames, shown = PERMISSION_SETS[permissions]
    second = prepared["overdue"][1]  # a letter for each button to resolve
    DeadLetter.objects.create(order_model="order_timeout.Order", order_id=str(second.pk), attempts=4,
                              error_type="StockServiceDown", first_failed_at=second.expires_at,
                              last_failed_at=second.expires_at)
    client = Client(raise_request_exception=False)
    client.force_login(staff("ops", "view_timeoutoverview", *codenames))

    page = client.get(reverse(OVERVIEW)).text

    ids = {"open-dead-letters", "overdue-orders", "requeue-all", "close-all"}
    assert {element for element in ids if f'id="{element}"' in page} == shown
    # What shows works: each link opens, each button's action runs (no 403).
    for link, url in (("open-dead-letters", reverse("admin:order_timeout_deadletter_changelist")),
                      ("overdue-orders", reverse("admin:order_timeout_order_changelist"))):
        if link in shown:
            assert client.get(url).status_code == 200
    for button, action in (("requeue-all", "requeue"), ("close-all", "close_now")):
        if button in shown:
            letter = DeadLetter.objects.filter(resolved_at__isnull=True).order_by("pk").first()
            response = client.post(reverse("admin:order_timeout_deadletter_changelist"),
                                   {"action": action, "_selected_action": [letter.pk], "index": 0})
            assert response.status_code == 302
            assert DeadLetter.objects.get(pk=letter.pk).is_resolved


# -- the lateness chart --------------------------------------------------------------------

SVG = "{http://www.w3.org/2000/svg}"
NOW = datetime(2026, 12, 1, 12, 7, tzinfo=UTC)


def minute(minutes_ago: int, p50: float = 0.2, p99: float = 0.8) -> MinuteOfCloses:
    """The closes of the minute starting ``minutes_ago`` before NOW (a whole minute)."""
    return MinuteOfCloses(NOW - timedelta(minutes=minutes_ago), 10, p50, p99, p99)


def chart(minutes: list[MinuteOfCloses], now: datetime = NOW) -> ET.Element:
    return ET.fromstring(str(lateness_svg(minutes, now=now)))


def group(svg: ET.Element, css_class: str) -> ET.Element:
    found = svg.find(f".//{SVG}g[@class='{css_class}']")
    assert found is not None, f"no <g class={css_class!r}> in the chart"
    return found


def x_axis_ends(svg: ET.Element) -> tuple[float, float]:
    line = group(svg, "x-axis").find(f"{SVG}line[@class='axis']")
    assert line is not None
    return float(line.get("x1", "")), float(line.get("x2", ""))


def dots_x(svg: ET.Element, series: str) -> list[float]:
    return [float(dot.get("cx", "")) for dot in group(svg, f"series {series}").iter(f"{SVG}circle")]


@pytest.mark.parametrize(("values", "q", "expected"), [
    ([0.001, 0.9], 0.5, 0.001),   # the median of two is the lower one, not the max
    ([0.001, 0.9], 0.99, 0.9),
    ([0.4], 0.5, 0.4),
    ([float(n) for n in range(1, 101)], 0.5, 50.0),
    ([float(n) for n in range(1, 101)], 0.99, 99.0),
    ([float(n) for n in range(100, 0, -1)], 0.99, 99.0),  # order does not matter
])
def test_a_quantile_is_the_nearest_rank(values, q, expected):
    assert _quantile(values, q) == expected


def test_the_x_axis_spans_the_last_hour_ending_now():
    left, right = x_axis_ends(chart([minute(30)]))

    assert dots_x(chart([minute(30)]), "p50") == [pytest.approx((left + right) / 2, abs=0.1)]
    assert dots_x(chart([minute(60), minute(0)]), "p50") == [pytest.approx(left, abs=0.1),
                                                             pytest.approx(right, abs=0.1)]


def test_a_single_minute_is_placed_where_its_time_is_not_at_the_left_edge():
    left, right = x_axis_ends(chart([minute(15)]))

    assert dots_x(chart([minute(15)]), "p99") == [pytest.approx(left + 0.75 * (right - left), abs=0.1)]


def test_the_x_axis_has_a_time_label_every_quarter_hour_in_the_site_time_zone(settings):
    settings.TIME_ZONE = "Asia/Kolkata"  # UTC+5:30: NOW, 12:07 UTC, is 17:37 there
    svg = chart([minute(30)])
    left, right = x_axis_ends(svg)
    labels = [(text.text, float(text.get("x", "")))
              for text in group(svg, "x-axis").iter(f"{SVG}text") if text.get("class") == "tick"]

    assert [text for text, _ in labels] == ["16:45", "17:00", "17:15", "17:30"]
    # 16:45 there is 11:15 UTC, 52 minutes before NOW; then every 15 minutes.
    assert [x for _, x in labels] == [pytest.approx(left + (60 - ago) / 60 * (right - left), abs=0.1)
                                      for ago in (52, 37, 22, 7)]
    title = group(svg, "x-axis").find(f"{SVG}text[@class='axis-title']")
    assert title is not None and "Asia/Kolkata" in (title.text or "")


@pytest.mark.parametrize(("p99", "unit", "top_label"), [(0.8, "ms", "800"), (3.3, "s", "4")])
def test_the_y_axis_is_labelled_with_its_unit(p99, unit, top_label):
    axis = group(chart([minute(5, p50=0.1, p99=p99)]), "y-axis")

    title = axis.find(f"{SVG}text[@class='axis-title']")
    ticks = [text.text for text in axis.iter(f"{SVG}text") if text.get("class") == "tick"]
    assert title is not None and title.text == f"Lateness ({unit})"
    assert ticks[0] == "0" and ticks[-1] == top_label and len(ticks) >= 3


def test_a_legend_names_p50_and_p99_in_their_colours():
    svg = chart([minute(5)])
    legend = group(svg, "legend")
    colours = {series: group(svg, f"series {series}").find(f"{SVG}circle").get("fill")
               for series in ("p50", "p99")}

    names = [text.text for text in legend.iter(f"{SVG}text")]
    swatches = [line.get("stroke") for line in legend.iter(f"{SVG}line")]
    assert names == ["p50", "p99"]
    assert swatches == [colours["p50"], colours["p99"]] and colours["p50"] != colours["p99"]


def test_p50_is_drawn_over_p99_and_both_show_where_they_are_equal():
    svg = chart([minute(5, p50=0.3, p99=0.3)])
    groups = [g.get("class") for g in svg.iter(f"{SVG}g")]
    p50_dot = group(svg, "series p50").find(f"{SVG}circle")
    p99_dot = group(svg, "series p99").find(f"{SVG}circle")

    assert groups.index("series p50") > groups.index("series p99")  # later is on top
    assert (p50_dot.get("cx"), p50_dot.get("cy")) == (p99_dot.get("cx"), p99_dot.get("cy"))
    assert float(p99_dot.get("r", "")) > float(p50_dot.get("r", ""))  # a ring around the p50 dot


def test_minutes_without_closes_break_the_line():
    svg = chart([minute(40), minute(39), minute(10)])

    lines = group(svg, "series p50").findall(f"{SVG}polyline")
    assert [len(line.get("points", "").split()) for line in lines] == [2]
    assert len(dots_x(svg, "p50")) == 3


def test_no_close_in_the_last_hour_says_so():
    assert "No order closed by its deadline in the last hour." in str(lateness_svg([], now=NOW))


# -- in a real browser --------------------------------------------------------------------

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
ARTIFACTS = Path(os.environ.get("TEST_ARTIFACTS", PROJECT_ROOT / "test-artifacts"))


@pytest.fixture
def browser():
    if not (shutil.which(CHROMIUM) and shutil.which(CHROMEDRIVER)):
        missing = (f"no {CHROMIUM} and {CHROMEDRIVER}: scripts/test installs Debian's chromium and "
                   "chromium-driver where it can")
        if os.environ.get("REQUIRE_BROWSER") == "1":  # CI: a browser test that did not run is a failure
            pytest.fail(missing)
        pytest.skip(missing)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    # Chromium's profile and the singleton folder it makes in TMPDIR both go in here, and
    # leave with it.
    with tempfile.TemporaryDirectory(prefix="chromium-") as scratch:
        for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--disable-background-networking", "--disable-component-update", "--disable-sync",
                     "--no-first-run", "--window-size=1280,1500", f"--user-data-dir={scratch}/profile"):
            options.add_argument(flag)
        service = Service(CHROMEDRIVER, env={**os.environ, "TMPDIR": scratch})
        driver = webdriver.Chrome(service=service, options=options)
        driver.implicitly_wait(5)
        try:
            yield driver
        finally:
            driver.quit()


@pytest.fixture
def an_hour_of_closes(order_model):
    """Closes over the last hour, a few per minute, with a quiet gap: what a chart is for."""
    from django.utils import timezone

    from order_timeout.models import TIMEOUT_REASON

    now = timezone.now()
    rows = []
    for ago in [*range(58, 34, -1), *range(24, 0, -1)]:
        for n in range(6):
            expires_at = now - timedelta(minutes=ago, seconds=10 * n)
            lateness = 0.02 + 0.01 * ((ago * 7 + n * 13) % 9) + (0.6 if n == 5 and ago % 4 == 0 else 0)
            rows.append(order_model(status=order_model.TIMEOUT_CLOSED_STATUS, expires_at=expires_at,
                                    closed_at=expires_at + timedelta(seconds=lateness),
                                    close_reason=TIMEOUT_REASON))
    order_model.objects.bulk_create(rows)  # no signal: nothing is scheduled


@db
def test_in_a_browser_staff_read_the_figures_and_requeue_a_dead_letter(browser, live_server,
                                                                      prepared, an_hour_of_closes,
                                                                      queue):
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
    chart = browser.find_element(By.CSS_SELECTOR, "#lateness-chart svg")
    assert len(chart.find_elements(By.CSS_SELECTOR, "g.series.p50 polyline")) == 2  # the gap
    assert [t.text for t in chart.find_elements(By.CSS_SELECTOR, "g.legend text")] == ["p50", "p99"]
    # A label every quarter hour: four in an hour, five when now falls on one.
    assert len(chart.find_elements(By.CSS_SELECTOR, "g.x-axis text.tick")) in (4, 5)
    # One file per database: a run on the other does not overwrite it.
    screenshot = ARTIFACTS / f"order-timeouts-overview-{connection.vendor}.png"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(screenshot))

    browser.find_element(By.ID, "requeue-all").click()

    assert "1 order requeued." in browser.find_element(By.CSS_SELECTOR, "ul.messagelist").text
    assert DeadLetter.objects.get().resolution == DeadLetter.Resolution.REQUEUED
    assert screenshot.stat().st_size > 10_000
