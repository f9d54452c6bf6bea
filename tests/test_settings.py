"""ORDER_TIMEOUT is validated as a whole; mistakes name the key."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from io import StringIO

import pytest
from django.conf import settings as django_settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import models
from django.db.models import Q
from django.test import override_settings
from django.test.utils import isolate_apps
from django_redis import get_redis_connection

from order_timeout import get_order_model
from order_timeout.checks import (
    TAG,
    check_dedicated_alias,
    check_grace,
    check_heartbeat,
    check_redis_alias,
    check_redis_server,
    check_use_tz,
    version_messages,
)
from order_timeout.conf import DEFAULTS, settings as order_settings
from order_timeout.models import Order
from testproject.shop.models import Purchase

from .conftest import PROJECT_ROOT


@pytest.fixture
def no_order_timeout_setting():
    with override_settings():
        del django_settings.ORDER_TIMEOUT
        yield


def test_defaults_apply_when_the_setting_is_absent(no_order_timeout_setting):

    assert order_settings.load() == DEFAULTS
    assert order_settings.BATCH_SIZE == 200
    assert order_settings.LEASE_SECONDS == 30
    assert order_settings.MAX_WAIT == 1.0
    assert order_settings.BATCH_WINDOW == 0.003
    assert order_settings.DEFAULT_TIMEOUT == 1800


@pytest.mark.parametrize("key, value", [
    ("BATCH_SIZE", 0), ("BATCH_SIZE", "200"), ("BATCH_SIZE", 10**6), ("BATCH_SIZE", True),
    ("LEASE_SECONDS", -1), ("LEASE_SECONDS", None), ("MAX_WAIT", 0), ("DEFAULT_TIMEOUT", "30m"),
    ("KEY_PREFIX", ""), ("KEY_PREFIX", "a{b}"), ("REDIS_ALIAS", ""), ("ORDER_MODEL", "Order"),
    ("BATCH_WINDOW", -0.001), ("BATCH_WINDOW", 2), ("BATCH_WINDOW", "3ms"),
    ("BATCH_TIME_LIMIT", 0), ("BATCH_TIME_LIMIT", "30s"),
])
def test_bad_value_raises_improperly_configured_naming_the_key(settings, key, value):
    settings.ORDER_TIMEOUT = {key: value}

    with pytest.raises(ImproperlyConfigured, match=key):
        order_settings.load()


def test_unknown_key_is_rejected_with_the_known_ones_listed(settings):
    settings.ORDER_TIMEOUT = {"BATCHSIZE": 10}

    with pytest.raises(ImproperlyConfigured, match="BATCHSIZE.*known keys are"):
        order_settings.load()


def test_setting_that_is_not_a_dict_is_rejected(settings):
    settings.ORDER_TIMEOUT = [("BATCH_SIZE", 10)]

    with pytest.raises(ImproperlyConfigured, match="ORDER_TIMEOUT must be a dict"):
        order_settings.load()


def test_bad_setting_stops_manage_py_at_start_up():
    code = (
        "import django, os; os.environ['DJANGO_SETTINGS_MODULE'] = 'testproject.settings';"
        "from django.conf import settings; settings.ORDER_TIMEOUT = {'LEASE_SECONDS': 0};"
        "django.setup()"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=PROJECT_ROOT,
                            capture_output=True, text=True, timeout=60)

    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr and "LEASE_SECONDS" in result.stderr


def test_get_order_model_returns_the_default_order():
    assert get_order_model() is Order


def test_get_order_model_returns_a_shops_own_model(settings):
    settings.ORDER_TIMEOUT = {"ORDER_MODEL": "shop.Purchase"}

    assert get_order_model() is Purchase


@pytest.mark.parametrize("label, message", [
    ("shop.Missing", "has not been installed"),
    ("shop.Expiry", "does not inherit"),
])
def test_get_order_model_explains_a_bad_model(settings, label, message):
    settings.ORDER_TIMEOUT = {"ORDER_MODEL": label}

    with pytest.raises(ImproperlyConfigured, match=message):
        get_order_model()


def test_check_reports_a_redis_alias_missing_from_caches(settings):
    settings.ORDER_TIMEOUT = {"REDIS_ALIAS": "queue"}

    assert [e.id for e in check_redis_alias()] == ["order_timeout.E001"]


def test_check_reports_a_cache_that_is_not_django_redis(settings):
    settings.CACHES = {**settings.CACHES,
                       "order_timeout": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

    assert [e.id for e in check_redis_alias()] == ["order_timeout.E002"]


def test_check_requires_use_tz(settings):
    settings.USE_TZ = False

    assert [e.id for e in check_use_tz()] == ["order_timeout.E003"]


def test_checks_pass_on_the_test_project():
    assert check_redis_alias() == [] and check_use_tz() == [] and check_dedicated_alias() == []


@pytest.mark.django_db
def test_migrations_match_the_models():
    from django.core.management import call_command

    call_command("makemigrations", "--check", "--dry-run", verbosity=0)


def test_check_warns_when_the_queues_alias_has_no_socket_timeouts(settings):
    settings.CACHES = {**settings.CACHES, "order_timeout": {"BACKEND": "django_redis.cache.RedisCache",
                                                            "LOCATION": "redis://127.0.0.1:6379/9"}}

    messages = check_redis_alias()

    assert [m.id for m in messages] == ["order_timeout.W003"]
    assert "'SOCKET_CONNECT_TIMEOUT': 1, 'SOCKET_TIMEOUT': 2" in messages[0].hint


def test_check_warns_when_the_scans_grace_is_shorter_than_a_lease_and_the_retries(settings):
    settings.ORDER_TIMEOUT = {"LEASE_SECONDS": 30, "RETRY_DELAYS": [10, 30, 60], "COMPENSATION_GRACE": 60}

    messages = check_grace()

    assert [m.id for m in messages] == ["order_timeout.W004"]
    assert "130" in messages[0].hint


def test_check_warns_when_the_heartbeat_outlasts_the_lease(settings):
    settings.ORDER_TIMEOUT = {"LEASE_SECONDS": 5, "HEARTBEAT_SECONDS": 5}

    messages = check_heartbeat()

    assert [m.id for m in messages] == ["order_timeout.W013"]
    assert "HEARTBEAT_SECONDS" in messages[0].msg


def test_the_default_heartbeat_is_shorter_than_the_default_lease():
    assert check_heartbeat() == []


def test_the_default_grace_covers_the_default_lease_and_retries():
    assert check_grace() == []


def test_check_warns_when_the_queue_shares_the_shops_default_cache(settings):
    settings.ORDER_TIMEOUT = {"REDIS_ALIAS": "default"}

    assert [m.id for m in check_dedicated_alias()] == ["order_timeout.W005"]


def test_check_warns_when_the_queues_alias_points_at_the_default_caches_database(settings):
    queue = settings.CACHES["order_timeout"]
    settings.CACHES = {"default": {**queue}, "queue": {**queue}}
    settings.ORDER_TIMEOUT = {"REDIS_ALIAS": "queue"}

    assert [m.id for m in check_dedicated_alias()] == ["order_timeout.W005"]


def test_deploy_check_warns_on_eviction_and_no_persistence(private_redis):
    client = get_redis_connection("private")
    client.config_set("maxmemory-policy", "allkeys-lru")

    messages = check_redis_server()

    assert sorted(m.id for m in messages) == ["order_timeout.W006", "order_timeout.W007"]
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("save", "3600 1")  # RDB snapshots: some persistence
    assert check_redis_server() == []


@pytest.mark.parametrize("version, problem", [("6.0.16", True), ("6.2.0", False), ("7.0.15", False)])
def test_a_redis_older_than_6_2_is_an_error(version, problem):
    assert [m.id for m in version_messages(version)] == (["order_timeout.E008"] if problem else [])


def test_deploy_check_says_when_it_cannot_reach_redis(private_redis):
    private_redis.stop()

    assert [m.id for m in check_redis_server()] == ["order_timeout.W008"]


def test_a_cache_entry_that_is_not_a_dict_is_reported_not_a_crash(settings):
    """The README's snippet once read ``"default": {...},``: pasted as written, that is a set."""
    settings.CACHES = {"default": {...}, "order_timeout": settings.CACHES["order_timeout"]}

    messages = [*check_redis_alias(), *check_dedicated_alias()]

    assert [m.id for m in messages] == ["order_timeout.E012"]
    assert "CACHES['default']" in messages[0].msg and "set" in messages[0].msg


def test_a_queue_cache_entry_that_is_not_a_dict_is_reported_not_a_crash(settings):
    settings.CACHES = {"default": settings.CACHES["default"], "order_timeout": ["redis://x"]}

    messages = [*check_redis_alias(), *check_dedicated_alias()]

    assert [m.id for m in messages] == ["order_timeout.E012"]
    assert "CACHES['order_timeout']" in messages[0].msg


@pytest.mark.django_db
def test_a_database_without_skip_locked_is_an_error_at_migrate_and_deploy_check():
    """MariaDB before 10.6 (which Django 5.2 still supports) has no SKIP LOCKED: one locked row
    would hold its whole batch for the lock wait timeout."""
    from django.db import connection

    from order_timeout.checks import check_database_features

    assert check_database_features(databases=["default"]) == []
    connection.features.has_select_for_update_skip_locked = False  # as on MariaDB 10.5
    try:
        messages = check_database_features(databases=["default"])
        deploy = check_database_features(deploy=True)
        unasked = check_database_features()
    finally:
        del connection.features.has_select_for_update_skip_locked

    assert [m.id for m in messages] == ["order_timeout.E011"] == [m.id for m in deploy]
    assert "SKIP LOCKED" in messages[0].msg and "10.6" in messages[0].hint
    assert unasked == []  # plain `check` does not connect to the database


def test_every_check_of_the_app_carries_its_tag_so_a_project_can_ask_only_these():
    """``check --deploy --tag order_timeout`` is the README's command: a check without the tag
    would silently drop out of it."""
    from django.core.checks.registry import registry

    from order_timeout import checks as app_checks

    ours = [check for check in registry.get_checks(include_deployment_checks=True)
            if check.__module__ == app_checks.__name__]
    assert len(ours) >= 10
    assert [check.__name__ for check in ours if app_checks.TAG not in check.tags] == []


# -- every number finite and bounded; the hold condition compiled against the order model ------

INF, NAN = float("inf"), float("nan")


@pytest.mark.parametrize("key, value", [
    ("DEFAULT_TIMEOUT", INF), ("DEFAULT_TIMEOUT", NAN), ("DEFAULT_TIMEOUT", 1e12),
    ("LEASE_SECONDS", INF), ("MAX_WAIT", INF), ("MAX_WAIT", NAN), ("SCHEDULE_TIMEOUT", INF),
    ("HOLD_RECHECK", NAN), ("MAX_HOLD", INF), ("MAX_HOLD", NAN), ("MAX_HOLD", 1e12),
    ("COMPENSATION_GRACE", INF), ("COMPENSATION_INTERVAL", NAN), ("COMPENSATION_LOCK_SECONDS", INF),
    ("RETRY_DELAYS", [10, INF]), ("RETRY_DELAYS", [NAN]), ("REMINDERS", [INF]), ("REMINDERS", [NAN]),
    ("REMINDERS", [1e12]), ("BATCH_WINDOW", NAN),
])
def test_a_number_that_is_infinite_nan_or_past_what_a_deadline_can_hold_names_its_key(settings, key, value):
    settings.ORDER_TIMEOUT = {key: value}

    with pytest.raises(ImproperlyConfigured, match=key):
        order_settings.load()


def check_ids(tag: str = "order_timeout") -> list[str]:
    from django.core import checks

    return [message.id for message in checks.run_checks(tags=[tag])]


@pytest.mark.parametrize("condition", [Q(no_such_field=1), Q(payments__no_such_field="pending"),
                                       "tests.test_settings.not_a_q", "tests.test_settings.raises"],
                         ids=["unknown-field", "unknown-related-field", "returns-a-str", "raises"])
def test_a_hold_condition_that_does_not_fit_the_order_model_is_a_check_error(settings, condition):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "HOLD_CONDITION": condition}

    assert "order_timeout.E013" in check_ids()


def test_a_hold_condition_that_fits_passes_the_check(settings):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "HOLD_CONDITION": Q(payments__state="pending")}

    assert "order_timeout.E013" not in check_ids()


def not_a_q() -> str:
    return "payments__state=pending"


def raises() -> Q:
    raise RuntimeError("the payments app is not ready")


@pytest.mark.django_db
def test_the_consumer_refuses_to_start_with_a_hold_condition_that_does_not_fit(settings):
    from django.core.management import CommandError, call_command

    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "HOLD_CONDITION": Q(no_such_field=1)}

    with pytest.raises(CommandError, match="HOLD_CONDITION.*no_such_field"):
        call_command("run_timeout_consumer", "--once")


# -- the order model's key must fit the columns that record it ---------------------------------


@isolate_apps("testproject.shop")
@pytest.mark.parametrize("key, fits", [
    (lambda: models.BigAutoField(primary_key=True), True),
    (lambda: models.UUIDField(primary_key=True), True),
    (lambda: models.CharField(primary_key=True, max_length=64), True),
    (lambda: models.CharField(primary_key=True, max_length=65), False),
    (lambda: models.TextField(primary_key=True), False),
], ids=["bigint", "uuid", "char-64", "char-65", "text"])
def test_a_check_errors_when_the_order_models_key_cannot_fit_the_dead_letter_and_reminder_columns(key, fits):
    from order_timeout.checks import check_key_fits
    from order_timeout.models import TimeoutOrderMixin

    class LongKeyOrder(TimeoutOrderMixin):
        id = key()
        status = models.CharField(max_length=16, default="unpaid")

        class Meta(TimeoutOrderMixin.Meta):
            app_label = "shop"

    ids = [message.id for message in check_key_fits(LongKeyOrder)]
    assert ids == ([] if fits else ["order_timeout.E015"])


@contextmanager
def a_failing_check(tag: str) -> Iterator[str]:
    """A check under ``tag`` that fails, registered for the block; yields its id."""
    check_id = f"shop.E{abs(hash(tag)) % 1000:03d}"

    def failing(**kwargs: object) -> list[checks.CheckMessage]:
        return [checks.Error(f"broken under {tag}", id=check_id)]

    checks.register(failing, tag)
    try:
        yield check_id
    finally:
        checks.registry.registry.registered_checks.discard(failing)


@pytest.mark.django_db(transaction=True)
def test_the_consumer_starts_on_the_apps_own_checks_and_leaves_the_web_checks_to_the_web_process():
    """A worker starts often (deploys, restarts after a crash): it runs the checks tagged
    ``order_timeout`` (its settings, its model, its Redis), not the admin's or the URLs'."""
    with a_failing_check(checks.Tags.admin):
        call_command("run_timeout_consumer", "--once", skip_checks=False, stdout=StringIO())

    with a_failing_check(TAG), pytest.raises(SystemCheckError, match="broken under order_timeout"):
        call_command("run_timeout_consumer", "--once", skip_checks=False, stdout=StringIO())


def test_a_read_of_the_settings_that_began_before_a_change_is_not_kept(settings, monkeypatch):
    """Seen in CI: a thread left over from an earlier test read ORDER_TIMEOUT while the next test's
    settings were restored; its read, cached after the reload, gave every later test the old alias."""
    from order_timeout.conf import OrderTimeoutSettings

    conf = OrderTimeoutSettings()
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "BATCH_SIZE": 7}
    read = OrderTimeoutSettings._read

    def read_while_another_thread_changes_it(source: object) -> dict:
        old = read(source)
        settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "BATCH_SIZE": 8}
        conf.reload()  # what the change's setting_changed does
        return old

    monkeypatch.setattr(OrderTimeoutSettings, "_read", staticmethod(read_while_another_thread_changes_it))
    assert conf.BATCH_SIZE == 7  # that read gets what it read
    monkeypatch.setattr(OrderTimeoutSettings, "_read", staticmethod(read))
    assert conf.BATCH_SIZE == 8  # and the next one the change



def test_values_read_while_the_setting_was_deleted_are_not_served_once_it_is_back():
    """Seen in CI: pytest-django's ``del settings.ORDER_TIMEOUT`` and its undoing send no
    setting_changed; the defaults read in between (REDIS_ALIAS 'default') were served to every
    later test of that worker, and a shop's own tests that delete the setting would do the same."""
    from order_timeout.conf import OrderTimeoutSettings

    conf = OrderTimeoutSettings()
    with override_settings():  # what pytest-django's `del settings.X` does
        del django_settings.ORDER_TIMEOUT
        assert conf.REDIS_ALIAS == "default"

    assert conf.REDIS_ALIAS == django_settings.ORDER_TIMEOUT["REDIS_ALIAS"] == "order_timeout"
