"""Behind PgBouncer in transaction mode (``DATABASE_POOLING = "transaction"``).

A transaction pooler gives a client a server connection for one transaction
only: a session-level limit stays on that server connection for whichever
client it serves next, and the backend pid the driver reports is PgBouncer's
(its cancel key), no backend of ours for the lease guard to end. So the
limits go on each transaction that locks orders (``SET LOCAL``), and nothing
is ended by pid.

The tests at the top need only PostgreSQL (or prove MySQL/MariaDB refuse the
mode); those under "through a real PgBouncer" run ``run_timeout_consumer``
processes through a PgBouncer of their own on a free loopback port (Debian's
``pgbouncer``, which scripts/lib/prepare.sh installs), and skip without it.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import connection, connections, transaction
from django.db.models import Count
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from order_timeout import schedule, unschedule
from order_timeout.checks import check_database_pooling
from order_timeout.conf import settings as order_settings
from order_timeout.consumer import Consumer
from order_timeout.db.session import (
    _transaction_limits,
    limit_session,
    limit_transaction,
    limited_session,
    session_id,
)
from order_timeout.models import DeadLetter, Order
from order_timeout.scans.compensation import compensate
from order_timeout.signals import deadline_approaching
from order_timeout.timers.staff import close_now
from order_timeout.timers.watchdog import EXIT_STUCK
from testproject.shop.models import Expiry

from .conftest import free_port, time_left, wait_for
from .helpers import count_in, expiries, leased_members, pending_count, session_limits, state

pytestmark = pytest.mark.django_db(transaction=True)

postgresql_only = pytest.mark.skipif("connection.vendor != 'postgresql'",
                                     reason="SET LOCAL and PgBouncer are PostgreSQL's")

# Seconds of LEASE_SECONDS in the tests below: far from any default limit, so a leaked one shows.
LEASE = 7


@pytest.fixture
def transaction_pooling(settings: Any) -> Iterator[None]:
    """``DATABASE_POOLING = "transaction"`` for the test; this thread's connection forgets the
    limits its consumer gave it, so no later test inherits them."""
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "DATABASE_POOLING": "transaction",
                              "LEASE_SECONDS": LEASE}
    yield
    _transaction_limits.pop(connections["default"], None)


def limits_now() -> tuple[str, str]:
    """This connection's statement and idle-in-transaction limits, as the server holds them now."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('statement_timeout'), "
                       "current_setting('idle_in_transaction_session_timeout')")
        return tuple(cursor.fetchone())


# -- the setting, the check, and MySQL/MariaDB ----------------------------------------------


@pytest.mark.parametrize("value", ["statement", "", None, 1])
def test_an_unknown_pooling_mode_is_improperly_configured_naming_the_key(settings, value):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "DATABASE_POOLING": value}

    with pytest.raises(ImproperlyConfigured, match=r"ORDER_TIMEOUT\['DATABASE_POOLING'\] must be "
                                                   r"'session' or 'transaction'"):
        order_settings.load()


def test_session_pooling_is_the_default_and_asks_nothing_of_the_database():
    with transaction.atomic(), CaptureQueriesContext(connection) as queries:
        limit_transaction("default")

    assert order_settings.DATABASE_POOLING == "session"
    assert check_database_pooling() == []
    assert len(queries) == 0  # the closing batch's statement count is today's


def test_transaction_pooling_is_refused_on_mysql_and_mariadb(transaction_pooling):
    """No SET LOCAL there: the limits would leak to the pool's next client, or be missing."""
    messages = check_database_pooling()

    if connection.vendor == "mysql":
        assert [(m.level, m.id) for m in messages] == [(checks.ERROR, "order_timeout.E016")]
        with pytest.raises(ImproperlyConfigured, match="needs PostgreSQL"):
            limit_session(connection, LEASE)
        with pytest.raises(ImproperlyConfigured, match="needs PostgreSQL"), \
                limited_session("default", LEASE):
            pass
    else:
        assert "order_timeout.E016" not in [m.id for m in messages]


@postgresql_only
def test_transaction_pooling_without_disable_server_side_cursors_is_warned_about(transaction_pooling):
    assert [m.id for m in check_database_pooling()] == ["order_timeout.W010"]

    connection.settings_dict["DISABLE_SERVER_SIDE_CURSORS"] = True
    try:
        assert check_database_pooling() == []
    finally:
        del connection.settings_dict["DISABLE_SERVER_SIDE_CURSORS"]


# -- SET LOCAL, in the transactions that lock orders -------------------------------------------


@postgresql_only
def test_under_transaction_pooling_the_session_is_never_limited_nor_named(transaction_pooling):
    before = limits_now()
    with CaptureQueriesContext(connection) as queries:
        limit_session(connection, LEASE)

    assert len(queries) == 0 and limits_now() == before
    assert session_id(connection) is None  # a backend pid through a pooler is not ours to end


@postgresql_only
def test_the_limits_hold_for_the_transaction_only_set_in_one_statement(transaction_pooling):
    limit_session(connection, LEASE)
    before = limits_now()

    with transaction.atomic():
        with CaptureQueriesContext(connection) as queries:
            limit_transaction("default")
        inside = limits_now()

    assert len(queries) == 1 and "set_config" in queries[0]["sql"]
    assert inside == (f"{LEASE}s", f"{LEASE}s")
    assert limits_now() == before


def close_by_consumer(order: Any) -> None:
    Consumer(max_wait=0.05).run(once=True)


def close_by_scan(order: Any) -> None:
    unschedule([order])  # a failover lost its member: the scan's to close
    compensate(now=timezone.now())


def close_by_staff(order: Any) -> None:
    letter = DeadLetter.objects.create(order_model=Order._meta.label, order_id=str(order.pk), attempts=4,
                                       error_type="builtins.RuntimeError", first_failed_at=order.expires_at,
                                       last_failed_at=order.expires_at)
    close_now([letter], user=None, now=timezone.now())


@postgresql_only
@pytest.mark.parametrize("close", [close_by_consumer, close_by_scan, close_by_staff],
                         ids=["consumer", "compensation-scan", "close-now"])
def test_every_closing_transaction_carries_the_limits_and_leaves_the_session_as_it_was(
        transaction_pooling, receiver, queue, close):
    """What a receiver of order_expired sees is what bounds the row locks it holds."""
    seen: list[tuple[str, str]] = []
    receiver(lambda sender, order, **kwargs: seen.append(limits_now()))
    order = Order.objects.create(expires_at=timezone.now() - timedelta(seconds=600))  # past the grace
    before = session_limits()

    close(order)

    assert seen == [(f"{LEASE}s", f"{LEASE}s")] and state(order) == "closed"
    assert session_limits() == before


@postgresql_only
def test_a_reminders_transaction_carries_the_limits(transaction_pooling, settings, queue):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "REMINDERS": [60]}
    seen: list[tuple[str, str]] = []

    def remind(sender: Any, order: Any, **kwargs: Any) -> None:
        seen.append(limits_now())

    deadline_approaching.connect(remind, weak=False)
    try:
        Order.objects.create(expires_at=timezone.now() + timedelta(seconds=30))
        Consumer(max_wait=0.05).run(once=True)
    finally:
        deadline_approaching.disconnect(remind)

    assert seen == [(f"{LEASE}s", f"{LEASE}s")]


# -- through a real PgBouncer --------------------------------------------------------------


class PrivatePgBouncer:
    """A PgBouncer of the test's own, pool_mode=transaction, in front of the test's PostgreSQL.

    ``POOL_SIZE`` server connections per database and user: few, so the
    consumer's and the probes' transactions share them, and a probe of each
    (``limits_of_every_server_connection``) sees all of them.
    """

    POOL_SIZE = 2

    def __init__(self, database: dict[str, Any]) -> None:
        self.database = database
        self.port = free_port()
        self.directory: str | None = None
        self.proc: subprocess.Popen[bytes] | None = None

    def url(self, name: str | None = None) -> str:
        db = self.database
        return (f"postgres://{db['USER']}:{db['PASSWORD']}@127.0.0.1:{self.port}/"
                f"{name or db['NAME']}")

    def start(self, binary: str) -> None:
        db = self.database
        self.directory = tempfile.mkdtemp(prefix="pgbouncer-")
        folder = Path(self.directory)
        (folder / "users.txt").write_text(f'"{db["USER"]}" "{db["PASSWORD"]}"\n')
        (folder / "pgbouncer.ini").write_text(f"""\
[databases]
* = host={db['HOST'] or '127.0.0.1'} port={db['PORT'] or 5432}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = scram-sha-256
auth_file = {folder / 'users.txt'}
pool_mode = transaction
default_pool_size = {self.POOL_SIZE}
max_client_conn = 100
ignore_startup_parameters = extra_float_digits
log_connections = 0
log_disconnections = 0
""")
        # PgBouncer will not run as root: it reads these files first, then becomes postgres
        # (which could not write in this run's temp dir: its log goes to our file instead).
        user = ["-u", "postgres"] if os.geteuid() == 0 else []
        with open(folder / "pgbouncer.log", "wb") as log:
            self.proc = subprocess.Popen([binary, *user, str(folder / "pgbouncer.ini")],
                                         stdout=subprocess.DEVNULL, stderr=log)
        wait_for(self._answers)

    def log(self) -> str:
        path = Path(self.directory or "/nonexistent") / "pgbouncer.log"
        return path.read_text() if path.exists() else ""

    def _answers(self) -> bool:
        import psycopg

        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"pgbouncer exited ({self.proc.returncode}):\n{self.log()}")
        try:
            with psycopg.connect(self.url(), connect_timeout=1) as probe:
                probe.execute("SELECT 1")
        except psycopg.Error:
            return False
        return True

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(time_left())
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None


def pgbouncer_binary() -> str | None:
    return shutil.which("pgbouncer") or shutil.which("pgbouncer", path="/usr/sbin:/usr/local/sbin")


@pytest.fixture
def pgbouncer() -> Iterator[PrivatePgBouncer]:
    if connection.vendor != "postgresql":
        pytest.skip("PgBouncer pools PostgreSQL: run with a postgres:// DATABASE_URL")
    binary = pgbouncer_binary()
    if binary is None:
        pytest.skip("pgbouncer is not installed (scripts/lib/prepare.sh installs Debian's package)")
    pool = PrivatePgBouncer(connection.settings_dict)
    try:
        pool.start(binary)
        yield pool
    finally:
        pool.stop()


# The test project behind that PgBouncer, in a settings module of the test's own.
POOLED_SETTINGS = '''\
from testproject.settings import *  # noqa: F403

ORDER_TIMEOUT = {{**ORDER_TIMEOUT, "DATABASE_POOLING": {mode!r}}}  # noqa: F405
DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True  # noqa: F405
'''


@pytest.fixture
def through(pgbouncer: PrivatePgBouncer, tmp_path: Path) -> Callable[..., dict[str, str]]:
    """The environment of a consumer process on the test database through ``pgbouncer``."""

    def env(mode: str = "transaction", **more: str) -> dict[str, str]:
        module = f"pooled_{mode}"
        (tmp_path / f"{module}.py").write_text(POOLED_SETTINGS.format(mode=mode))
        return {"DATABASE_URL": pgbouncer.url(), "DJANGO_SETTINGS_MODULE": module,
                "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])),
                "ORDER_TIMEOUT_LEASE_SECONDS": str(LEASE), **more}

    return env


def due_orders(count: int) -> list[Order]:
    orders = Order.objects.bulk_create(
        [Order(expires_at=timezone.now() - timedelta(seconds=1)) for _ in range(count)])
    schedule(orders)
    return orders


def limits_of_every_server_connection(pool: PrivatePgBouncer) -> dict[int, tuple[str, str]]:
    """Each server connection's limits, as a plain client of the pool sees them: one probe per
    server connection, each holding a transaction open so the next is given another."""
    import psycopg

    seen: dict[int, tuple[str, str]] = {}
    with ExitStack() as stack:
        for _ in range(pool.POOL_SIZE):
            probe = stack.enter_context(psycopg.connect(pool.url(), connect_timeout=5))
            row = probe.execute("SELECT pg_backend_pid(), current_setting('statement_timeout'), "
                                "current_setting('idle_in_transaction_session_timeout')").fetchone()
            assert row is not None
            seen[row[0]] = (row[1], row[2])
    assert len(seen) == pool.POOL_SIZE, "two probes were given one server connection"
    return seen


def server_defaults() -> tuple[str, str]:
    """The limits a new session of the test database gets (the role's, the database's, the server's)."""
    import psycopg

    db = connection.settings_dict
    with psycopg.connect(host=db["HOST"] or "127.0.0.1", port=db["PORT"] or 5432, user=db["USER"],
                         password=db["PASSWORD"], dbname=db["NAME"]) as plain:
        row = plain.execute("SELECT current_setting('statement_timeout'), "
                            "current_setting('idle_in_transaction_session_timeout')").fetchone()
    assert row is not None
    return row[0], row[1]


def closed_count(stdout: str) -> int:
    return int(re.search(r"(\d+) closed", stdout).group(1))


def run_until_all_closed(consumer_process: Callable[..., Any], env: dict[str, str], count: int,
                         consumers: int = 1) -> list[tuple[int, str, str]]:
    racers = [consumer_process("--batch-size", "50", env=env) for _ in range(consumers)]
    for racer in racers:
        racer.wait_until(lambda racer=racer: "running" in racer.out)
    due_orders(count)
    wait_for(lambda: count_in(Order, "closed") >= count)
    for racer in racers:
        racer.signal(signal.SIGTERM)
    return [racer.wait() for racer in racers]


@pytest.mark.slow
def test_through_pgbouncer_racing_consumers_close_every_due_order_exactly_once(
        pgbouncer, through, consumer_process, queue):
    count = 600
    results = run_until_all_closed(consumer_process, through(), count, consumers=3)

    assert [code for code, _, _ in results] == [0, 0, 0], [err for _, _, err in results]
    assert count_in(Order, "closed") == count
    assert Expiry.objects.count() == count
    assert not Expiry.objects.values("order_id").annotate(n=Count("id")).filter(n__gt=1).exists()
    assert sum(closed_count(out) for _, out, _ in results) == count
    assert pending_count(queue) == 0 and leased_members(queue) == []
    assert not any("order_timeout.W010" in err or "batch failed" in err for _, _, err in results)


@pytest.mark.slow
def test_through_pgbouncer_the_limits_never_reach_another_client_of_the_pool(
        pgbouncer, through, consumer_process, queue):
    defaults = server_defaults()
    assert defaults != (f"{LEASE}s", f"{LEASE}s")

    [(code, _, err)] = run_until_all_closed(consumer_process, through(), 200)

    assert code == 0, err
    assert set(limits_of_every_server_connection(pgbouncer).values()) == {defaults}


@pytest.mark.slow
def test_through_pgbouncer_session_pooling_leaks_the_limits_which_is_why_the_setting_exists(
        pgbouncer, through, consumer_process, queue):
    """The probe sees what a leak looks like: "session" behind a transaction pooler."""
    [(code, _, err)] = run_until_all_closed(consumer_process, through("session"), 200)

    assert code == 0, err
    assert (f"{LEASE}s", f"{LEASE}s") in limits_of_every_server_connection(pgbouncer).values()


def sessions_ended() -> tuple[int, int]:
    """This database's sessions ended by a FATAL error (an idle-in-transaction timeout among them)
    and by an operator (pg_terminate_backend), since the statistics began."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT sessions_fatal, sessions_killed FROM pg_stat_database "
                       "WHERE datname = current_database()")
        fatal, killed = cursor.fetchone()
    return int(fatal), int(killed)


@pytest.mark.slow
def test_through_pgbouncer_a_hung_batch_is_given_up_and_the_server_frees_its_rows_without_a_kill(
        pgbouncer, through, consumer_process, queue, tmp_path):
    """The receiver hangs inside the closing transaction. The guard gives the batch up after
    LEASE_SECONDS and hands its member over without ending any backend by pid; the limits the
    transaction set end it server-side (the payment waiting on its row gets its answer while
    the consumer still runs); then the consumer exits as stuck, for its supervisor to restart."""
    stalled = tmp_path / "stalled"
    [order] = due_orders(1)
    fatal_before, killed_before = sessions_ended()

    # LEASE_SECONDS of 7: the consumer exits as stuck 2.3 s after the give-up, long after the
    # server's limits have ended the transaction (LEASE_SECONDS after its last statement).
    hung = consumer_process(env=through(SHOP_STALL_FILE=str(stalled)))
    hung.wait_until(stalled.exists)  # inside the receiver: the row is locked, the transaction idle
    started = time.monotonic()
    paid = Order.objects.get(pk=order.pk).mark_paid()  # waits for that row lock
    waited = time.monotonic() - started
    still_running = hung.proc.poll() is None
    code, _, err = hung.wait()

    assert paid is True and state(order) == "paid" and expiries(order) == 0
    assert still_running, f"the row was freed by the consumer's exit, not by the server ({waited:.1f}s)"
    assert code == EXIT_STUCK, err
    assert "its transaction is left to the server's time limits" in err
    assert "session is ended" not in err
    wait_for(lambda: sessions_ended()[0] > fatal_before)  # the idle-in-transaction timeout
    assert sessions_ended()[1] == killed_before  # no pg_terminate_backend()
