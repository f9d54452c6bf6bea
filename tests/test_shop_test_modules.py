"""The shops' own test modules (testproject/*/tests), written only with order_timeout.testing as a
shop would write them, pass the way a shop's CI runs them: in a pytest run of their own, with the
project's Redis, and with ``TESTING_WITHOUT_REDIS`` where no Redis is reachable at all.

Their timers are declared at start-up, as in a shop's project (``SHOP_DECLARES_EVERY_TIMER``); the
app's own suite registers them per test instead, so each run is a process of its own, on a test
database of its own.
"""

from __future__ import annotations

import os
import subprocess
import sys
from urllib.parse import urlsplit, urlunsplit

import pytest
from django.db import connection

from .conftest import PROJECT_ROOT, database_url

SHOP_MODULES = ["testproject/shop/tests", "testproject/saleorlike/tests", "testproject/tickets/tests"]


def shops_database_url(mode: str) -> str:
    """The suite's database server, another database on it: the run creates test_<name> itself."""
    parts = urlsplit(database_url())
    name = f"{connection.settings_dict['NAME'].removeprefix('test_')}_shops_{mode.replace(' ', '_')}"
    return urlunsplit(parts._replace(path=f"/{name}"))


@pytest.mark.slow
@pytest.mark.django_db
@pytest.mark.parametrize("mode", ["redis", "no redis"])
def test_the_shops_timer_tests_pass_with_and_without_redis(mode: str) -> None:
    env = {**os.environ, "SHOP_DECLARES_EVERY_TIMER": "1", "DATABASE_URL": shops_database_url(mode),
           "ORDER_TIMEOUT_TESTING_WITHOUT_REDIS": "1" if mode == "no redis" else "0"}
    env.pop("PYTEST_XDIST_WORKER", None)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", *SHOP_MODULES, "-q", "-p", "no:cacheprovider", "--create-db",
         "-o", "addopts=", "-W", "error::RuntimeWarning"],
        cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)

    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    assert "13 passed" in run.stdout.splitlines()[-1], run.stdout[-2000:]
