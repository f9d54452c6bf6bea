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
from django.utils import timezone
from django_redis import get_redis_connection

from order_timeout import get_order_model
from order_timeout.conf import settings as order_settings
from order_timeout.consumer import Consumer
from order_timeout.models import TimeoutOrderMixin
from order_timeout.queue import TimeoutQueue
from order_timeout.scheduling import connect_receivers, disconnect_receivers, order_kinds
from order_timeout.signals import order_expired

from . import parallel
from .backends import content_types_and_permissions_kept, use_test_backends
from .holding import HeldReceiver

PROJECT_ROOT = Path(__file__).resolve().parent.parent


# -- the test's own time: waits end with it, not with a budget of their own ----------------

# Seconds of a test's timeout (pytest-timeout) kept for its teardown once its waits gave up.
TEARDOWN_MARGIN = 15
# When no timeout is configured at all.
DEFAULT_TEST_TIMEOUT = 300
_test_deadline = time.monotonic() + DEFAULT_TEST_TIMEOUT - TEARDOWN_MARGIN


def timeout_of(item: pytest.Item) -> float:
    """The item's pytest-timeout: its marker, else --timeout, else the ini's ``timeout``."""
    marker = item.get_closest_marker("timeout")
    if marker is not None and (marker.args or "timeout" in marker.kwargs):
        value = marker.kwargs.get("timeout", marker.args[0] if marker.args else None)
    else:
        value = item.config.getoption("timeout", None) or item.config.getini("timeout")
    return float(value or 0) or DEFAULT_TEST_TIMEOUT


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    global _test_deadline
    _test_deadline = time.monotonic() + max(timeout_of(item) - TEARDOWN_MARGIN, 1)


def time_left() -> float:
    """Seconds until this test's waits must give up (its timeout, less the teardown's share)."""
    return max(_test_deadline - time.monotonic(), 0.0)


def wait_for(predicate: Callable[[], bool], timeout: float | None = None, interval: float = 0.05) -> None:
    """Poll until ``predicate()`` holds: an event, not a budget.

    Without ``timeout`` the wait lasts as long as the test's own timeout
    allows, so a loaded machine makes it slower but does not fail it; give
    ``timeout`` only where the budget itself is what the test proves.
    """
    started = time.monotonic()
    deadline = min(_test_deadline, started + timeout) if timeout is not None else _test_deadline
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {time.monotonic() - started:.0f}s waiting for {predicate}")
        time.sleep(interval)


def finish(thread: threading.Thread) -> None:
    """Join ``thread`` within the test's own time, and fail if it is still running."""
    thread.join(time_left())
    assert not thread.is_alive(), f"{thread.name} did not finish"


# -- the temp dir: one per run, and what a test leaves there is an error --------------------

# pytest's own tmp_path folders: it manages them (and they go with the run's folder).
PYTEST_TEMP = "pytest-of-"
_run_temp: Path | None = None


def pytest_configure(config: pytest.Config) -> None:
    """Give the run a temp dir of its own, its child processes too (redis-server, consumers,
    Chromium), so what the tests leave there is seen, whoever else uses the machine's; and, in a
    parallel run, give this worker its own Redis database, key prefix and test database."""
    global _run_temp
    if parallel.hands_out_tests(config):
        # xdist's controller runs no test; its workers each make their own temp dir (one nested in
        # the controller's would make a path too long for Chromium's socket in it).
        return
    parallel.isolate()
    if _run_temp is None:
        _run_temp = Path(tempfile.mkdtemp(prefix="order-timeout-tests-"))
        tempfile.tempdir = str(_run_temp)
        os.environ["TMPDIR"] = str(_run_temp)


def left_in_temp() -> set[str]:
    assert _run_temp is not None
    return {name for name in os.listdir(_run_temp) if not name.startswith(PYTEST_TEMP)}


@pytest.fixture(autouse=True)
def leaves_the_temp_dir_as_it_found_it() -> Iterator[None]:
    """A test removes every temp file and folder it made (its servers', its browser's, its own)."""
    before = left_in_temp()
    yield
    left = left_in_temp() - before
    for name in left:
        remove(_run_temp / name)  # type: ignore[operator]
    assert not left, f"the test left {sorted(left)} in the temp dir"


def remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The run's temp dir goes; anything in it but pytest's own folders fails the run."""
    if _run_temp is None or not _run_temp.exists():
        return
    left = sorted(left_in_temp())
    shutil.rmtree(_run_temp, ignore_errors=True)
    if left:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"ERROR: the tests left {left} in the temp dir", red=True)
            reporter.stats.setdefault("left in the temp dir", []).extend(left)  # on the result line
        if session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(autouse=True)
def leaves_the_settings_as_it_found_them() -> Iterator[None]:
    """A test's overrides end with it: a leaked ORDER_TIMEOUT or CACHES would change every later test."""
    before = {name: getattr(django_settings, name, None) for name in ("ORDER_TIMEOUT", "CACHES")}
    yield
    after = {name: getattr(django_settings, name, None) for name in before}
    for name in before:
        if after[name] != before[name]:
            setattr(django_settings, name, before[name])  # so one leak fails one test, not the rest
    assert after == before, "the test left its settings overridden"


@pytest.fixture(scope="session")
def django_db_modify_db_settings() -> None:
    """The worker's test database is its own (tests/parallel.py), as its Redis database is; a
    test's flush is one that suits a teardown (tests/backends)."""
    parallel.name_test_databases()
    use_test_backends(django_settings.DATABASES)


@pytest.fixture(scope="session", autouse=True)
def written_once(django_db_setup: None) -> Iterator[None]:
    """The content types and permissions the test databases' migrate wrote stay as they are."""
    with content_types_and_permissions_kept():
        yield


@pytest.fixture(scope="session", autouse=True)
def redis_has_this_workers_database() -> None:
    parallel.check_redis_databases()


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
    """Empty this worker's part of the cluster (its key prefix), on every master as it is now."""
    from redis.cluster import RedisCluster

    client = RedisCluster.from_url(django_settings.CACHES["cluster"]["LOCATION"])
    try:
        parallel.delete_own_cluster_keys(client)
    finally:
        client.close()


@pytest.fixture
def redis_backend(request: pytest.FixtureRequest, settings: Any) -> Iterator[str]:
    """The queue on the standalone Redis (default) or on the cluster (``both_redis``).

    Overrides go through pytest-django's ``settings``, as the test's own do: one wrapper
    undoes them all, last first. (An ``override_settings`` entered here and left at this
    fixture's teardown would be undone out of order with a test's ``settings.X = ...``,
    and the older override would leak into every later test.)
    """
    kind = getattr(request, "param", "standalone")
    if kind == "standalone":
        yield kind
        return
    if "cluster" not in django_settings.CACHES:
        pytest.skip("no REDIS_CLUSTER_URL: scripts/test starts a local Redis Cluster")
    flush_cluster()
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "REDIS_ALIAS": "cluster", "SHARDS": CLUSTER_SHARDS}
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
        # The order close (and its reminders, when the test asks for any): the kinds these tests
        # are about, so a claim goes to their lanes. tests/test_every_kind.py runs every kind.
        kwargs.setdefault("kinds", order_kinds())
        return Consumer(**kwargs)

    return build


# The order models the core behaviours are proven on: the app's own, and a
# shop's own model with its own status field, values and pipeline.
ORDER_MODELS = ["order_timeout.Order", "shop.ShopOrder"]
both_models = pytest.mark.parametrize("order_model", ORDER_MODELS, indirect=True,
                                      ids=["Order", "ShopOrder"])


@pytest.fixture
def order_model(request: pytest.FixtureRequest, redis_backend: str,
                settings: Any) -> Iterator[type[TimeoutOrderMixin]]:
    """The configured order model: ``Order`` unless a test is parametrized with ``both_models``."""
    label = getattr(request, "param", "order_timeout.Order")
    model = apps.get_model(label)
    if model is get_order_model():
        yield model
        return
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "ORDER_MODEL": label}
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
        raise RuntimeError("Process tests need the MariaDB or PostgreSQL test database (see CONTRIBUTING.md).")
    user, password = quote(s["USER"] or ""), quote(s["PASSWORD"] or "")
    return f"{scheme}://{user}:{password}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or port}/{s['NAME']}"


class ConsumerProcess:
    """``manage.py run_timeout_consumer`` in its own process, on the test database.

    Its output is read as it comes, into ``out`` and ``err`` (a pipe left
    full would stall a chatty consumer mid-test). ``command`` runs something else
    the same way, ``args`` after it (another release's consumer, a shop's process), from ``cwd``.
    A consumer leaves the fleet's housekeeping (the scan, the prune) to others unless
    ``housekeeping``: the tests of housekeeping start theirs with it, the rest need no scan beside them.
    """

    def __init__(self, *args: str, env: dict[str, str] | None = None, command: list[str] | None = None,
                 cwd: Path = PROJECT_ROOT, housekeeping: bool = False) -> None:
        if command is None and not housekeeping:
            args = (*args, "--no-housekeeping")
        # Unbuffered: a test waits on its lines (its banner) as they are written.
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "DATABASE_URL": database_url(),
                    "ORDER_TIMEOUT_ORDER_MODEL": order_settings.ORDER_MODEL,
                    "ORDER_TIMEOUT_REDIS_ALIAS": order_settings.REDIS_ALIAS,
                    "ORDER_TIMEOUT_SHARDS": str(order_settings.SHARDS), **(env or {})}
        self.proc = subprocess.Popen(
            [*(command or [sys.executable, str(PROJECT_ROOT / "manage.py"), "run_timeout_consumer"]), *args],
            cwd=cwd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True,
        )
        self._out: list[str] = []
        self._err: list[str] = []
        self._readers = [threading.Thread(target=self._read, args=(stream, lines), daemon=True)
                         for stream, lines in ((self.proc.stdout, self._out), (self.proc.stderr, self._err))]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(stream: Any, lines: list[str]) -> None:
        with stream:
            for line in stream:
                lines.append(line)

    @property
    def out(self) -> str:
        return "".join(self._out)

    @property
    def err(self) -> str:
        return "".join(self._err)

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def wait_until(self, predicate: Callable[[], bool]) -> None:
        """Wait for ``predicate`` while the process runs; fail at once, with its output, if it exits."""
        wait_for(lambda: predicate() or self.proc.poll() is not None)
        if not predicate():
            raise AssertionError(f"the consumer exited ({self.proc.returncode}) first:\n{self.err}")

    def wait(self) -> tuple[int, str, str]:
        """Its exit status and output, once it has exited (within the test's own time)."""
        try:
            self.proc.wait(time_left())
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the consumer is still running:\n{self.err}") from None
        for reader in self._readers:
            reader.join()
        return self.proc.returncode, self.out, self.err

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for reader in self._readers:
            reader.join()


@pytest.fixture
def consumer_process() -> Iterator[Callable[..., ConsumerProcess]]:
    started: list[ConsumerProcess] = []

    def start(*args: str, **options: Any) -> ConsumerProcess:
        process = ConsumerProcess(*args, **options)
        started.append(process)
        return process

    yield start
    for process in started:
        process.kill()


@contextmanager
def running(worker: Consumer, target: Callable[[], Any] | None = None) -> Iterator[threading.Thread]:
    """Run ``worker`` (or ``target``) in a thread for the block; stop it and check it stopped."""
    thread = threading.Thread(target=target or worker.run, name="the consumer")
    thread.start()
    try:
        yield thread
    finally:
        worker.request_stop()
        thread.join(time_left())
    assert not thread.is_alive(), "the consumer did not stop"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PrivateRedis:
    """A redis-server of the test's own, so a test can stop and restart it.

    Its working folder is made by ``start()`` and removed by ``stop()``: it
    holds no data (no RDB, no AOF), so a restart begins empty either way.
    """

    def __init__(self, *arguments: str, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        # More redis-server arguments: a password, TLS, a replica's --replicaof.
        self.arguments = arguments
        self.proc: subprocess.Popen[bytes] | None = None
        self.directory: str | None = None

    def start(self) -> None:
        binary = shutil.which("redis-server")
        assert binary, "redis-server is not installed (see CONTRIBUTING.md)"
        tls = "--tls-port" in self.arguments
        self.directory = self.directory or tempfile.mkdtemp(prefix="redis-")
        self.proc = subprocess.Popen(
            [binary, "--port", "0" if tls else str(self.port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--dir", self.directory, *self.arguments],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        wait_for(self._answers)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(time_left())
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None

    def crash_to_last_save(self) -> None:
        """SIGKILL it and start it again from its last ``SAVE``: back with an older copy, as after a
        failover to a replica that missed the last writes (a new run id, the same address)."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(time_left())
        self.start()

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
    settings.CACHES = caches
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "REDIS_ALIAS": "private"}
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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    parallel.slow_spread(config, items)
