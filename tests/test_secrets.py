"""No password ever appears in a check message, a log line or an exception text of the app.

Tried: a Redis Cluster LOCATION whose two seeds carry different passwords (a rotation half
done) was reported with both passwords in clear, raised by ``Order.objects.create()`` after its
row had committed. Now ``check`` reports it (E014) with the passwords masked, and a save never
raises for Redis once its row is committed.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from urllib.parse import urlsplit

import pytest
from django.conf import settings as django_settings
from django.core import checks

from order_timeout.models import Order
from order_timeout.redaction import masked
from order_timeout.redis_cluster import seed_nodes

from .conftest import PROJECT_ROOT, database_url

PASSWORD_ONE, PASSWORD_TWO, STANDALONE_PASSWORD = "rotated-out-s3cret", "rotated-in-s3cret", "standalone-s3cret"
PASSWORDS = (PASSWORD_ONE, PASSWORD_TWO, STANDALONE_PASSWORD)


def cluster_seeds(first: str = PASSWORD_ONE, second: str = PASSWORD_TWO) -> str:
    return f"redis://:{first}@127.0.0.1:7101,redis://user:{second}@127.0.0.1:7102"


@pytest.fixture
def half_rotated_cluster(settings):
    caches = {**settings.CACHES, "rotating": {
        "BACKEND": "django_redis.cache.RedisCache", "LOCATION": cluster_seeds(),
        "OPTIONS": {"CONNECTION_FACTORY": "order_timeout.redis_cluster.ClusterConnectionFactory",
                    "SOCKET_CONNECT_TIMEOUT": 1, "SOCKET_TIMEOUT": 2}}}
    settings.CACHES = caches
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "REDIS_ALIAS": "rotating"}


def test_masked_hides_every_password_of_a_url_or_a_list_of_them():
    text = masked(f"LOCATION {cluster_seeds()!r} and rediss://u:{STANDALONE_PASSWORD}@h:6380/1")

    assert not any(password in text for password in PASSWORDS)
    assert "redis://:***@127.0.0.1:7101" in text and "redis://user:***@127.0.0.1:7102" in text
    assert "rediss://u:***@h:6380/1" in text


def test_seeds_that_differ_are_reported_without_their_passwords():
    with pytest.raises(Exception) as raised:
        seed_nodes(cluster_seeds())

    assert "differ" in str(raised.value)
    assert not any(password in str(raised.value) for password in PASSWORDS)


def test_check_reports_cluster_seeds_that_differ_as_an_error_without_the_passwords(half_rotated_cluster):
    messages = checks.run_checks(tags=["order_timeout"])

    errors = [message for message in messages if message.id == "order_timeout.E014"]
    assert errors, [message.id for message in messages]
    assert not any(password in f"{message.msg} {message.hint}" for message in messages for password in PASSWORDS)


@pytest.mark.django_db(transaction=True)
def test_a_save_never_raises_for_redis_once_its_row_committed(half_rotated_cluster, caplog):
    with caplog.at_level(logging.WARNING, logger="order_timeout"):
        order = Order.objects.create()

    assert Order.objects.filter(pk=order.pk).exists()
    assert "compensation scan" in caplog.text
    assert not any(password in caplog.text for password in PASSWORDS)


def run_manage(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(PROJECT_ROOT / "manage.py"), *args], cwd=PROJECT_ROOT,
                          env={**os.environ, "DATABASE_URL": database_url(), **env},
                          capture_output=True, text=True, timeout=120)


SAVE = ("import django; django.setup(); from order_timeout.models import Order; "
        "print('saved', Order.objects.create().pk)")


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("alias", ["order_timeout", "cluster"], ids=["standalone", "cluster"])
def test_no_password_in_the_output_of_check_the_consumer_or_a_save(alias):
    if alias == "cluster" and "cluster" not in django_settings.CACHES:
        pytest.skip("no REDIS_CLUSTER_URL: scripts/test starts a local Redis Cluster")
    queue = urlsplit(django_settings.CACHES["order_timeout"]["LOCATION"])  # this worker's database
    env = {"REDIS_URL": f"redis://:{STANDALONE_PASSWORD}@{queue.hostname}:{queue.port}{queue.path}",
           "REDIS_CLUSTER_URL": cluster_seeds(), "ORDER_TIMEOUT_REDIS_ALIAS": alias,
           "DJANGO_SETTINGS_MODULE": "testproject.settings"}

    outputs = [run_manage("check", "--deploy", "--tag", "order_timeout", env=env),
               run_manage("run_timeout_consumer", "--once", env=env),
               subprocess.run([sys.executable, "-c", SAVE], cwd=PROJECT_ROOT, capture_output=True, text=True,
                              env={**os.environ, "DATABASE_URL": database_url(), **env}, timeout=120)]

    text = "\n".join(f"{result.stdout}\n{result.stderr}" for result in outputs)
    assert "saved" in outputs[2].stdout, text  # the save went through, whatever Redis said
    assert not any(password in text for password in PASSWORDS), text
