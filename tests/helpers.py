"""Reading order rows the same way whatever the model (its declared statuses, not raw values),
the queue's Redis state whatever the shards, the statements that differ between MariaDB and
PostgreSQL, and a Redis client that records its own round trips."""

from __future__ import annotations

import functools
import hashlib
import threading
from dataclasses import dataclass, field
from typing import Any

from redis.connection import Connection, ConnectionPool
from redis.exceptions import TimeoutError as RedisTimeoutError

from order_timeout.models import TimeoutOrderMixin
from testproject.shop.models import Expiry

from .parallel import cut_off_own_subscribers, delete_own_cluster_keys


def state(order: TimeoutOrderMixin) -> str:
    """'unpaid', 'paid', 'closed' or the raw status, read from the database row."""
    model = type(order)
    status = model._base_manager.filter(pk=order.pk).values_list(
        model.TIMEOUT_STATUS_FIELD, flat=True).get()
    if status in model.TIMEOUT_UNPAID_STATUSES:
        return "unpaid"
    return {model.TIMEOUT_PAID_STATUS: "paid", model.TIMEOUT_CLOSED_STATUS: "closed"}.get(status, status)


def count_in(model: type[TimeoutOrderMixin], name: str) -> int:
    """How many rows of ``model`` are 'unpaid', 'paid' or 'closed'."""
    if name == "unpaid":
        return model._base_manager.filter(model.unpaid_q()).count()
    value = {"paid": model.TIMEOUT_PAID_STATUS, "closed": model.TIMEOUT_CLOSED_STATUS}[name]
    return model._base_manager.filter(**{model.TIMEOUT_STATUS_FIELD: value}).count()


def set_state(order: TimeoutOrderMixin, name: str) -> None:
    """Write 'paid' or 'closed' behind the app's back (as SQL or another process would)."""
    model = type(order)
    value = {"paid": model.TIMEOUT_PAID_STATUS, "closed": model.TIMEOUT_CLOSED_STATUS}[name]
    model._base_manager.filter(pk=order.pk).update(**{model.TIMEOUT_STATUS_FIELD: value})


def expiries(order: Any) -> int:
    """How many ``order_expired`` deliveries for this order committed."""
    return Expiry.objects.filter(order_id=str(order.pk), model=type(order)._meta.label).count()


# MariaDB serves INNODB_TRX from a cache it refreshes only when nobody read it in the last
# 100 ms: a wait that polls it more often reads the same stale answer for ever.
INNODB_TRX_POLL = 0.25


def lock_waits() -> int:
    """Transactions of the test database waiting for a row lock right now.

    Of this database only: other test runs share the server, and their lock waits are not ours.
    Poll it with ``INNODB_TRX_POLL``, not faster (see there).
    """
    from django.db import connection

    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
                           "WHERE NOT l.granted AND a.datname = current_database()")
        else:
            cursor.execute("SELECT COUNT(*) FROM information_schema.INNODB_TRX t "
                           "JOIN information_schema.PROCESSLIST p ON p.ID = t.trx_mysql_thread_id "
                           "WHERE t.trx_state = 'LOCK WAIT' AND p.DB = DATABASE()")
        return int(cursor.fetchone()[0])


# -- the queue's Redis state, whatever the number of shards ------------------------------


def score_of(queue: Any, member: str) -> int | None:
    """The pending deadline (ms) of a member, or None."""
    score = queue.client.zscore(queue.shard_for(member).keys.pending, member)
    return None if score is None else int(score)


def pending_count(queue: Any) -> int:
    return sum(int(queue.client.zcard(shard.keys.pending)) for shard in queue.shards)


def leased_members(queue: Any) -> list[str]:
    return sorted(member.decode() for shard in queue.shards
                  for member in queue.client.zrange(shard.keys.leased, 0, -1))


def keys_for(queue: Any, member: str) -> Any:
    """The keys of the shard ``member`` lives in."""
    return queue.shard_for(member).keys


def hash_size(queue: Any, name: str) -> int:
    """Entries in one of the shards' hashes ("attempts", "takeovers", ...), all shards added."""
    return sum(int(queue.client.hlen(getattr(shard.keys, name))) for shard in queue.shards)


def claim_everywhere(queue: Any, due_ms: int, limit: int, lease_until_ms: int, token: str) -> list[str]:
    """Claim up to ``limit`` due members from every shard in turn (as a test's dead consumer)."""
    claimed: list[str] = []
    for shard in queue.shards:
        if len(claimed) < limit:
            claimed += shard.claim(due_ms, limit - len(claimed), lease_until_ms, token).members
    return claimed


def claim_next(worker: Any, now: Any) -> Any:
    """The consumer's next claim that takes members: it goes round the lanes (every kind's
    shards), some empty."""
    claim = worker.claim(now)
    for _ in range(len(worker.lanes.shards) - 1):
        if claim.members:
            break
        claim = worker.claim(now)
    return claim


def lose_redis_data(queue: Any) -> None:
    """The queue's Redis restarts empty (no persistence), whichever Redis it is."""
    from redis.cluster import RedisCluster

    if isinstance(queue.client, RedisCluster):
        delete_own_cluster_keys(queue.client)  # the part of the shared cluster that is this worker's
    else:
        queue.client.flushdb()


def cut_off_subscribers(queue: Any) -> None:
    """Every Redis node of the queue drops its pub/sub connections (a restart, a proxy's idle timeout)."""
    from redis.cluster import RedisCluster

    # This process's subscribers only: other workers' consumers share the servers.
    if isinstance(queue.client, RedisCluster):
        for node in queue.client.get_nodes():
            cut_off_own_subscribers(node.redis_connection)
    else:
        cut_off_own_subscribers(queue.client)


# -- the few statements that differ between MariaDB and PostgreSQL ---------------------------


def end_own_session() -> None:
    """The server ends this thread's database session, as a DBA's KILL or a crash would."""
    from django.db import connection

    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT pg_terminate_backend(pg_backend_pid())")
        else:
            cursor.execute("SELECT CONNECTION_ID()")
            cursor.execute(f"KILL {int(cursor.fetchone()[0])}")


def session_exists(sid: Any) -> bool:
    """Whether the server still has the session ``sid`` (MySQL thread id, PostgreSQL backend pid)."""
    from django.db import connection

    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [sid])
        else:
            cursor.execute("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = %s", [sid])
        return bool(cursor.fetchone()[0])


def open_transactions_elsewhere() -> int:
    """Transactions of the test database open in other sessions right now (a killed process's, until
    the server has rolled it back). Poll it with ``INNODB_TRX_POLL``, not faster."""
    from django.db import connection

    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                           "AND pid <> pg_backend_pid() AND xact_start IS NOT NULL")
        else:
            cursor.execute("SELECT COUNT(*) FROM information_schema.INNODB_TRX t "
                           "JOIN information_schema.PROCESSLIST p ON p.ID = t.trx_mysql_thread_id "
                           "WHERE p.DB = DATABASE() AND p.ID <> CONNECTION_ID()")
        return int(cursor.fetchone()[0])


def session_limits() -> tuple:
    """This thread's session's time limits, as the server holds them."""
    from django.db import connection

    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT current_setting('idle_in_transaction_session_timeout'), "
                           "current_setting('statement_timeout')")
        else:
            cursor.execute("SELECT @@SESSION.idle_transaction_timeout, @@SESSION.max_statement_time")
        return tuple(cursor.fetchone())


def set_isolation_level(level: str) -> None:
    """This thread's next transactions run at ``level`` ("READ COMMITTED", "REPEATABLE READ")."""
    from django.db import connection

    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(f"SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL {level}")
        else:
            cursor.execute(f"SET SESSION TRANSACTION ISOLATION LEVEL {level}")


def rename_table(old: str, new: str) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(f"ALTER TABLE {old} RENAME TO {new}")
        else:
            cursor.execute(f"RENAME TABLE {old} TO {new}")


# -- a Redis client that records its own round trips -------------------------------------------
#
# Server-wide figures (INFO commandstats) count every client of a shared server; these count
# only what one client sent, as it sent it, to the real server.

# Commands named with their subcommand ("CLIENT SETINFO", "SCRIPT LOAD").
_CONTAINERS = {"CLIENT", "SCRIPT", "CONFIG", "COMMAND"}


def command_names(packed: bytes) -> tuple[str, ...]:
    """The names of the commands in a packed (RESP) request, in order."""
    return tuple(_command_name(words) for words in _commands(packed))


def script_names(packed: bytes) -> tuple[str, ...]:
    """The queue's scripts an ``EVALSHA`` of a packed request runs ("claim", "forget"), in order."""
    by_sha = _scripts_by_sha()
    return tuple(by_sha.get(words[1].decode(), "?") for words in _commands(packed)
                 if words[0].upper() == b"EVALSHA")


@functools.cache
def _scripts_by_sha() -> dict[str, str]:
    from order_timeout.queue import SCRIPT_NAMES, load_script_source

    return {hashlib.sha1(load_script_source(name).encode()).hexdigest(): name for name in SCRIPT_NAMES}


def _command_name(words: list[bytes]) -> str:
    name = words[0].decode().upper()
    if name in _CONTAINERS and len(words) > 1:
        name += " " + words[1].decode().upper()
    return name


def _commands(packed: bytes) -> list[list[bytes]]:
    """Each command of a packed (RESP) request, as its words."""
    commands: list[list[bytes]] = []
    at = 0
    while at < len(packed):
        end = packed.index(b"\r\n", at)
        count, at = int(packed[at + 1:end]), end + 2
        words: list[bytes] = []
        for _ in range(count):
            end = packed.index(b"\r\n", at)
            size, at = int(packed[at + 1:end]), end + 2
            words.append(packed[at:at + size])
            at += size + 2
        commands.append(words)
    return commands


@dataclass
class RoundTrip:
    """Commands written to the server at once (one command, or a pipeline), and how it ended."""

    commands: tuple[str, ...]
    thread: str
    # Sent while connecting (HELLO, AUTH, SELECT, CLIENT SETINFO), not asked for by the caller.
    handshake: bool
    socket_timeout: float | None
    # "sent", then "answered", "timed out", or the error's class name ("NoScriptError").
    outcome: str = "sent"
    # The queue's scripts it runs, by name ("claim", "forget").
    scripts: tuple[str, ...] = ()


@dataclass
class Traffic:
    """Every round trip of the connections made by ``recording_pool`` with it."""

    trips: list[RoundTrip] = field(default_factory=list)

    def asked(self) -> list[RoundTrip]:
        """The round trips the callers asked for (connection handshakes left out)."""
        return [trip for trip in list(self.trips) if not trip.handshake]


class RecordingConnection(Connection):
    """A connection to the real server that records each round trip in its ``traffic``."""

    def __init__(self, *args: Any, traffic: Traffic, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.traffic = traffic
        self._handshaking = False
        self._last: RoundTrip | None = None

    # The handshake runs in on_connect() (redis-py 5.0), which newer redis-py makes call
    # on_connect_check_health(): both are marked, whichever this redis-py has.
    def on_connect(self) -> None:
        self._mark_handshake(super().on_connect)

    def on_connect_check_health(self, check_health: bool = True) -> None:
        self._mark_handshake(lambda: super(RecordingConnection, self).on_connect_check_health(
            check_health=check_health))

    def _mark_handshake(self, connect: Any) -> None:
        outer = self._handshaking
        self._handshaking = True
        try:
            connect()
        finally:
            self._handshaking = outer

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        parts = [command] if isinstance(command, (bytes, str, memoryview)) else command
        packed = b"".join(part.encode() if isinstance(part, str) else bytes(part) for part in parts)
        trip = RoundTrip(command_names(packed), threading.current_thread().name, self._handshaking,
                         self.socket_timeout, scripts=script_names(packed))
        self.traffic.trips.append(trip)
        self._last = trip
        super().send_packed_command(command, check_health=check_health)

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        trip = self._last
        try:
            response = super().read_response(*args, **kwargs)
        except RedisTimeoutError:
            if trip is not None:
                trip.outcome = "timed out"
            raise
        except Exception as exc:
            if trip is not None:
                trip.outcome = type(exc).__name__
            raise
        if trip is not None and trip.outcome == "sent":
            trip.outcome = "answered"
        return response


def recording_pool(url: str, traffic: Traffic, **kwargs: Any) -> ConnectionPool:
    """A pool of ``RecordingConnection`` to ``url`` (extra keywords as ``ConnectionPool.from_url``)."""
    return ConnectionPool.from_url(url, connection_class=RecordingConnection, traffic=traffic, **kwargs)
