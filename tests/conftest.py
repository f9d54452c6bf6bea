"""Fixtures over the real servers: MariaDB through pytest-django, Redis through django-redis."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from django.apps import apps
from django.conf import settings as django_settings
from django.db import connection
from django.test import override_settings
from django.utils import timezone
from django_redis import get_redis_connection

from order_timeout import get_order_model
from order_timeout.conf import settings as order_settings
from order_timeout.consumer import Consumer
from order_timeout.models import TimeoutOrderMixin
from order_timeout.queue import TimeoutQueue
from order_timeout.scheduling import connect_receivers, disconnect_receivers
from order_timeout.signals import order_expired

from .holding import HeldReceiver

PROJECT_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def redis_client() -> Iterator[Any]:
    """The queue's Redis, emptied before each test."""
    client = get_redis_connection("order_timeout")
    client.flushdb()
    yield client
    client.flushdb()


# Where the queue lives: the standalone Redis, or the local Redis Cluster with
# 16 shards spread over its 3 masters.
REDIS_BACKENDS = ["standalone", "cluster"]
both_redis = pytest.mark.parametrize("redis_backend", REDIS_BACKENDS, indirect=True)
CLUSTER_SHARDS = 16


def flush_cluster() -> None:
    """Empty every master, as the cluster is now (a test may have failed one over)."""
    from redis.cluster import RedisCluster

    client = RedisCluster.from_url(django_settings.CACHES["cluster"]["LOCATION"])
    try:
        client.flushall(target_nodes=RedisCluster.PRIMARIES)
    finally:
        client.close()


@pytest.fixture
def redis_backend(request: pytest.FixtureRequest) -> Iterator[str]:
    """The queue on the standalone Redis (default) or on the cluster (``both_redis``)."""
    kind = getattr(request, "param", "standalone")
    if kind == "standalone":
        yield kind
        return
    if "cluster" not in django_settings.CACHES:
        pytest.skip("no REDIS_CLUSTER_URL: scripts/test starts a local Redis Cluster")
    flush_cluster()
    with override_settings(ORDER_TIMEOUT={**django_settings.ORDER_TIMEOUT, "REDIS_ALIAS": "cluster",
                                          "SHARDS": CLUSTER_SHARDS}):
        yield kind
    flush_cluster()


@pytest.fixture
def queue(redis_client: Any, redis_backend: str) -> TimeoutQueue:
    return TimeoutQueue.from_settings()


class Clock:
    """A clock the test moves by hand, so no test sleeps waiting for a deadline."""

    def __init__(self, start: datetime | None = None) -> None:
        self.current = start or timezone.now()

    def __call__(self) -> datetime:
        return self.current

    def advance(self, seconds: float) -> datetime:
        self.current += timedelta(seconds=seconds)
        return self.current


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def consumer(clock: Clock) -> Callable[..., Consumer]:
    """A consumer on the test's clock, which the test moves by hand (so the database's is not followed)."""

    def build(**kwargs: Any) -> Consumer:
        kwargs.setdefault("now", clock)
        kwargs.setdefault("follow_database_clock", False)
        return Consumer(**kwargs)

    return build


# The order models the core behaviours are proven on: the app's own, and a
# shop's own model with its own status field, values and pipeline.
ORDER_MODELS = ["order_timeout.Order", "shop.ShopOrder"]
both_models = pytest.mark.parametrize("order_model", ORDER_MODELS, indirect=True,
                                      ids=["Order", "ShopOrder"])


@pytest.fixture
def order_model(request: pytest.FixtureRequest, redis_backend: str) -> Iterator[type[TimeoutOrderMixin]]:
    """The configured order model: ``Order`` unless a test is parametrized with ``both_models``."""
    label = getattr(request, "param", "order_timeout.Order")
    model = apps.get_model(label)
    if model is get_order_model():
        yield model
        return
    with override_settings(ORDER_TIMEOUT={**django_settings.ORDER_TIMEOUT, "ORDER_MODEL": label}):
        connect_receivers(model)
        try:
            yield model
        finally:
            disconnect_receivers(model)


@pytest.fixture
def make_order(clock: Clock, order_model: type[TimeoutOrderMixin]) -> Callable[..., Any]:
    """Create an order whose deadline is ``in_seconds`` from the test clock's now."""

    def make(in_seconds: float = -1, **fields: Any) -> Any:
        return order_model.objects.create(expires_at=clock() + timedelta(seconds=in_seconds), **fields)

    return make


def database_url() -> str:
    """DATABASE_URL of the test database, for consumers run as separate processes."""
    s = connection.settings_dict
    scheme, port = {"mysql": ("mysql", 3306), "postgresql": ("postgres", 5432)}.get(
        connection.vendor, (None, None))
    if scheme is None:
        raise RuntimeError("Process tests need the MariaDB or PostgreSQL test database (see README).")
    user, password = quote(s["USER"] or ""), quote(s["PASSWORD"] or "")
    return f"{scheme}://{user}:{password}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or port}/{s['NAME']}"


class ConsumerProcess:
    """``manage.py run_timeout_consumer`` in its own process, on the test database."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        full_env = {**os.environ, "DATABASE_URL": database_url(),
                    "ORDER_TIMEOUT_ORDER_MODEL": order_settings.ORDER_MODEL,
                    "ORDER_TIMEOUT_REDIS_ALIAS": order_settings.REDIS_ALIAS,
                    "ORDER_TIMEOUT_SHARDS": str(order_settings.SHARDS), **(env or {})}
        self.proc = subprocess.Popen(
            [sys.executable, str(PROJECT_ROOT / "manage.py"), "run_timeout_consumer", *args],
            cwd=PROJECT_ROOT, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True,
        )

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def wait(self, timeout: float = 60) -> tuple[int, str, str]:
        out, err = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, out, err

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


@pytest.fixture
def consumer_process() -> Iterator[Callable[..., ConsumerProcess]]:
    started: list[ConsumerProcess] = []

    def start(*args: str, env: dict[str, str] | None = None) -> ConsumerProcess:
        process = ConsumerProcess(*args, env=env)
        started.append(process)
        return process

    yield start
    for process in started:
        process.kill()


@contextmanager
def running(worker: Consumer, target: Callable[[], Any] | None = None) -> Iterator[threading.Thread]:
    """Run ``worker`` (or ``target``) in a thread for the block; stop it and check it stopped."""
    thread = threading.Thread(target=target or worker.run)
    thread.start()
    try:
        yield thread
    finally:
        worker.request_stop()
        thread.join(10)
    assert not thread.is_alive(), "the consumer did not stop"


def wait_for(predicate: Callable[[], bool], timeout: float = 30, interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {predicate}")
        time.sleep(interval)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PrivateRedis:
    """A redis-server of the test's own, so a test can stop and restart it."""

    def __init__(self, *arguments: str, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        # More redis-server arguments: a password, TLS, a replica's --replicaof.
        self.arguments = arguments
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        binary = shutil.which("redis-server")
        assert binary, "redis-server is not installed (see README)"
        tls = "--tls-port" in self.arguments
        self.proc = subprocess.Popen(
            [binary, "--port", "0" if tls else str(self.port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--dir", tempfile.mkdtemp(prefix="redis-"),
             *self.arguments],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        wait_for(self._answers, timeout=10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(10)

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                return True
        except OSError:
            return False


@pytest.fixture
def private_redis(settings: Any) -> Iterator[PrivateRedis]:
    """The queue moved onto a private Redis (alias "private") that the test may stop."""
    server = PrivateRedis()
    server.start()
    caches = {**settings.CACHES, "private": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": server.url,
    }}
    with override_settings(CACHES=caches,
                           ORDER_TIMEOUT={**settings.ORDER_TIMEOUT, "REDIS_ALIAS": "private"}):
        yield server
    server.stop()


@pytest.fixture
def receiver() -> Iterator[Callable[[Callable[..., None]], Callable[..., None]]]:
    """Connect a test receiver to order_expired for the length of the test."""
    connected: list[Callable[..., None]] = []

    def connect(func: Callable[..., None]) -> Callable[..., None]:
        order_expired.connect(func, weak=False)
        connected.append(func)
        return func

    yield connect
    for func in connected:
        order_expired.disconnect(func)


@pytest.fixture
def held_receiver(receiver: Callable[[Callable[..., None]], Callable[..., None]]) -> Iterator[HeldReceiver]:
    """A receiver that holds each close inside its transaction until ``.release`` is set."""
    held = HeldReceiver()
    receiver(held)
    yield held
    held.release.set()
