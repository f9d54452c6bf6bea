"""What shops import keeps working, whatever moves inside the package (the contract of 0.2)."""

from __future__ import annotations

import importlib

import pytest
from django.core.management import get_commands

PUBLIC = {
    "order_timeout": ["get_order_model", "schedule", "unschedule", "aschedule", "aunschedule"],
    "order_timeout.models": ["TimeoutOrderMixin", "AbstractTimeoutOrder", "Order", "DeadLetter", "Reminder",
                             "Deadline", "Status", "TIMEOUT_REASON", "HOLD_EXPIRED_REASON"],
    "order_timeout.signals": ["order_expired", "orders_expired", "deadline_approaching", "timeout_state_changed"],
    "order_timeout.redis_cluster": ["ClusterConnectionFactory"],
    "order_timeout.views": ["metrics"],
    "order_timeout.beat": ["beat_schedule", "install_periodic_task"],
    "order_timeout.tasks": ["compensate"],
    "order_timeout.exceptions": ["OrderTimeoutError", "OrderClosed", "StaleOrderStatus", "QueueUnavailable"],
    "order_timeout.admin": ["TimeoutOrderAdminMixin", "extend_registered_admin"],
    "order_timeout.timers": ["Timer", "register", "NOW", "registry"],
    "order_timeout.testing": ["run_due", "travel", "clock", "queued_deadline", "capture_notices", "Outbox",
                              "refused_writes", "empty_queues", "Ran", "TimersClock"],
    "order_timeout.testing.plugin": ["timeout_runner", "timeout_clock", "timeout_outbox"],
}
COMMANDS = ["run_timeout_consumer", "order_timeout_compensate", "order_timeout_status", "order_timeout_backfill",
            "order_timeout_reshard"]


@pytest.mark.parametrize("module, names", PUBLIC.items(), ids=list(PUBLIC))
def test_what_shops_import_is_where_they_import_it_from(module, names):
    imported = importlib.import_module(module)

    assert [name for name in names if not hasattr(imported, name)] == []


def test_the_management_commands_keep_their_names():
    assert {name: get_commands().get(name) for name in COMMANDS} == dict.fromkeys(COMMANDS, "order_timeout")


def test_the_celery_task_keeps_its_name():
    from order_timeout.tasks import compensate

    assert compensate.name == "order_timeout.tasks.compensate"


def test_the_cluster_factory_is_found_by_its_dotted_path_in_caches():
    from django.utils.module_loading import import_string

    from order_timeout.redis_cluster import ClusterConnectionFactory

    assert import_string("order_timeout.redis_cluster.ClusterConnectionFactory") is ClusterConnectionFactory


def test_the_pytest_plugin_is_installed_with_the_app_and_loads_before_django_is_set_up():
    """pytest loads a plugin before pytest-django configures Django: importing it, or the kit's
    package, must not touch Django's settings."""
    import subprocess
    import sys
    from importlib.metadata import entry_points

    assert [entry.value for entry in entry_points(group="pytest11") if entry.name == "order_timeout"] == [
        "order_timeout.testing.plugin"]
    loaded = subprocess.run([sys.executable, "-c", "import order_timeout.testing.plugin, order_timeout.testing"],
                            env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, check=False)
    assert loaded.returncode == 0, loaded.stderr
