"""One worker of a parallel run (pytest-xdist): what it shares with no other worker.

Workers share the servers, so each takes its own part of them, all named by one number: its Redis
database, REDIS_URL's plus the worker's index (``gw0`` takes REDIS_URL's own, ``gw1`` the next).
That number also names its key prefix (``<ORDER_TIMEOUT_KEY_PREFIX>-<database>``: its keys and
wake-up channels on the standalone Redis and on the cluster, which has only database 0) and its
test database (``test_<name>_r<database>``). Two runs side by side (scripts/test's MariaDB and
PostgreSQL passes, CI's later stages) are kept apart by giving them REDIS_URLs whose ranges do not
overlap; a run without xdist is worker 0. Servers a test starts itself take free ports.

Child processes (consumers, Celery workers, a shop's commands) inherit the worker's environment,
so they land on the same database, Redis database and prefix.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from django.conf import settings
from django.core.signals import setting_changed


def worker_index() -> int:
    """0 for ``gw0`` (or a run without xdist), 1 for ``gw1``, ..."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(worker[2:]) if worker.startswith("gw") else 0


def hands_out_tests(config: pytest.Config) -> bool:
    """Whether this process is xdist's controller, which runs no test but hands them to workers."""
    return not hasattr(config, "workerinput") and config.getoption("dist", "no") != "no"


def with_database(url: str, number: int) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{number}"))


def database_of(url: str) -> int:
    path = urlsplit(url).path.strip("/")
    return int(path) if path else 0


# The Redis database this worker runs on, set by isolate(): it names the worker's other parts too.
slot: int | None = None
# The worker's key prefix: every key and channel of its queues starts with "{" and it.
key_prefix = ""


def isolate() -> None:
    """Move this worker onto its own Redis database, key prefix and (through slot) test database."""
    global slot, key_prefix
    caches: dict[str, Any] = settings.CACHES
    shared = caches["order_timeout"]["LOCATION"]
    slot = database_of(shared) + worker_index()
    own = with_database(shared, slot)
    prefix = key_prefix = f"{settings.ORDER_TIMEOUT.get('KEY_PREFIX', 'order_timeout')}-{slot}"

    changed = {"CACHES": {**caches, "order_timeout": {**caches["order_timeout"], "LOCATION": own}},
               "ORDER_TIMEOUT": {**settings.ORDER_TIMEOUT, "KEY_PREFIX": prefix}}
    # Celery's broker and results ride on the same Redis database when the settings derive them.
    for name in ("REDIS_URL", "CELERY_BROKER_URL", "CELERY_RESULT_BACKEND"):
        if getattr(settings, name, None) == shared:
            changed[name] = own
    for name, value in changed.items():
        setattr(settings, name, value)
        # As override_settings tells them: the app's settings and Django's caches read them again.
        setting_changed.send(sender=type(settings._wrapped), setting=name, value=value, enter=True)
    # What child processes read (testproject/settings.py builds the same from these).
    os.environ["REDIS_URL"] = own
    os.environ["ORDER_TIMEOUT_KEY_PREFIX"] = prefix
    if os.environ.get("CELERY_BROKER_URL") == shared:
        os.environ["CELERY_BROKER_URL"] = own


def check_redis_databases() -> None:
    """One clear error, not a failure in every test, when the server has too few databases."""
    from redis import Redis, ResponseError

    url = settings.CACHES["order_timeout"]["LOCATION"]
    client = Redis.from_url(url)
    try:
        client.ping()
    except ResponseError as e:
        if "out of range" not in str(e):
            raise
        server = f"{urlsplit(url).hostname}:{urlsplit(url).port}"
        raise pytest.UsageError(
            f"This worker's Redis database is {slot} (REDIS_URL's plus the worker's index), more than the "
            f"server at {server} has: start it with --databases 64 (scripts/test does), or give REDIS_URL "
            f"a lower database.") from e
    finally:
        client.close()


def name_test_databases() -> None:
    """Each test database is named by the worker's Redis database, so no two workers share one."""
    for database in settings.DATABASES.values():
        test = database.setdefault("TEST", {})
        if database["ENGINE"].endswith("sqlite3") and not test.get("NAME"):
            continue  # in memory, the worker's own
        name = test.get("NAME") or f"test_{database['NAME']}"
        test["NAME"] = f"{name}_r{slot}"


def delete_own_cluster_keys(client: Any) -> None:
    """Empty this worker's part of a shared Redis Cluster: every key under its prefix, on every
    primary as the cluster is now (a test may have failed one over). Others' keys stay."""
    prefix = key_prefix
    for node in client.get_nodes():
        if node.server_type != "primary":
            continue
        redis = node.redis_connection or client.get_redis_connection(node)
        for pattern in (f"{{{prefix}}}*", f"{{{prefix}:*", f"{{{prefix}-*"):
            batch = []
            for key in redis.scan_iter(match=pattern, count=1000):
                batch.append(key)
                if len(batch) == 500:
                    _unlink_each(redis, batch)
                    batch = []
            _unlink_each(redis, batch)


def _unlink_each(redis: Any, keys: list[bytes]) -> None:
    # One key a command: keys of different slots cannot share one, even on the same node.
    pipe = redis.pipeline(transaction=False)
    for key in keys:
        pipe.unlink(key)
    pipe.execute()


def own_addresses() -> set[str]:
    """The local ``ip:port`` of this process's TCP sockets: how Redis's CLIENT LIST names them."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    addresses = set()
    with open("/proc/self/net/tcp") as table:
        for line in list(table)[1:]:
            fields = line.split()
            if fields[9] in inodes:
                address, port = fields[1].split(":")
                ip = ".".join(str(int(address[i:i + 2], 16)) for i in (6, 4, 2, 0))
                addresses.add(f"{ip}:{int(port, 16)}")
    return addresses


def cut_off_own_subscribers(redis: Any) -> None:
    """Drop this process's pub/sub connections to one Redis server (others' stay subscribed)."""
    mine = own_addresses()
    for client in redis.client_list(_type="pubsub"):
        if client["addr"] in mine:
            redis.client_kill_filter(_id=client["id"])


@contextmanager
def taken_alone(name: str) -> Iterator[None]:
    """Hold a lock of the whole machine for the block: for what every run shares, such as a fixed
    port a documented command binds. An abstract socket, so a killed holder leaves nothing behind."""
    lock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        while True:
            try:
                lock.bind(f"\0order-timeout-tests:{name}")
                break
            except OSError:
                time.sleep(0.1)
        yield
    finally:
        lock.close()


def slow_spread(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In a parallel run, hand out the slow suites (consumers as processes: the longest tests)
    spread evenly over the first three quarters of the run: none left for the end, when the
    other workers would be idle, and not all at once at the start, when they would make each
    other's consumers starve (a receiver thread that waits over a second for the CPU is taken
    for a stuck one)."""
    if not hasattr(config, "workerinput"):
        return
    slow = [item for item in items if item.get_closest_marker("slow") is not None]
    rest = [item for item in items if item.get_closest_marker("slow") is None]
    if not slow:
        return
    stride = max(1, (len(rest) * 3 // 4) // len(slow))
    spread: list[pytest.Item] = []
    for index, item in enumerate(rest):
        if index % stride == 0 and slow:
            spread.append(slow.pop(0))
        spread.append(item)
    items[:] = spread + slow
