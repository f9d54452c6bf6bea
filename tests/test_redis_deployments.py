"""The queue on the Redis deployments shops run: AUTH, a least-privilege ACL user, TLS, Sentinel."""

from __future__ import annotations

import logging
import socket
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import django_redis
import pytest
from django.conf import settings as django_settings
from django.test import override_settings
from django_redis import get_redis_connection
from redis import Redis

from order_timeout.checks import (
    DJANGO_REDIS_USERNAME,
    check_client_libraries,
    check_redis_permissions,
    check_redis_server,
    cluster_library_messages,
    username_messages,
)
from order_timeout.consumer import Consumer
from order_timeout.reporting.health import measure
from order_timeout.reporting.housekeeping import last_runs
from order_timeout.scans.turns import run_prune, run_scan

from .conftest import PrivateRedis, free_port, running, wait_for
from .helpers import pending_count, state

pytestmark = pytest.mark.django_db(transaction=True)

# The least privilege the app needs: its own keys and channels, and these commands
# (scripts run their commands as the user, so those count too). docs/operations.md shows it.
# The keys and channels are the configured prefix's (a developer's own, ORDER_TIMEOUT_KEY_PREFIX).
PREFIX = django_settings.ORDER_TIMEOUT.get("KEY_PREFIX", "order_timeout")
ACL_RULES = (
    f"on >s3cret ~{{{PREFIX}* &{{{PREFIX}* resetchannels &{{{PREFIX}* "
    "-@all +select +evalsha +eval +script|load +ping +info +zadd +zrem +zrange +zrangebyscore +zcard "
    "+zcount +zscore +zmscore +zscan +hget +hmget +hset +hsetnx +hdel +hlen +hincrby +set +get "
    "+del +pexpire +publish +spublish +subscribe +ssubscribe +unsubscribe +sunsubscribe"
)


# What a shop's application user often is: everything but the dangerous commands
# (INFO, CONFIG, KEYS, FLUSHALL, DEBUG...), on every key and channel.
NOT_DANGEROUS = "on >s3cret ~* &* +@all -@dangerous"


def use_alias(settings: Any, location: str, **options: Any) -> Any:
    caches = {**settings.CACHES, "deployment": {
        "BACKEND": "django_redis.cache.RedisCache", "LOCATION": location,
        "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 1, "SOCKET_TIMEOUT": 2, **options}}}
    return override_settings(CACHES=caches,
                             ORDER_TIMEOUT={**settings.ORDER_TIMEOUT, "REDIS_ALIAS": "deployment"})


def close_one_order_through_the_queue(make_order: Any) -> None:
    """Schedule on commit, wake a sleeping consumer, claim, close, ack, report.

    The consumer would sleep an hour (MAX_WAIT) without a wake-up: the order
    closes within the wait only if the new deadline's message woke it.
    """
    worker = Consumer(max_wait=3600)
    with running(worker):
        wait_for(lambda: worker._listener is not None and worker._listener.subscribed, timeout=10)
        order = make_order(in_seconds=0.2)
        wait_for(lambda: state(order) == "closed", timeout=30)
    health = measure()
    assert (health.pending, health.leased, health.drift) == (0, 0, 0)


@pytest.fixture
def server() -> Iterator[list[PrivateRedis]]:
    started: list[PrivateRedis] = []
    yield started
    for redis in started:
        redis.stop()


def test_a_password_protected_redis(server, settings, make_order):
    redis = PrivateRedis("--requirepass", "s3cret")
    server.append(redis)
    redis.start()

    with use_alias(settings, f"redis://:s3cret@127.0.0.1:{redis.port}/0"):
        close_one_order_through_the_queue(make_order)


def redis_with_user(server: list[PrivateRedis], rules: str) -> PrivateRedis:
    """A private redis-server with the ACL user "order_timeout" (password s3cret) made of ``rules``."""
    redis = PrivateRedis()
    server.append(redis)
    redis.start()
    Redis(port=redis.port).execute_command("ACL", "SETUSER", "order_timeout", *rules.split())
    return redis


def as_user(settings: Any, redis: PrivateRedis, db: int = 0, *, in_options: bool = False) -> Any:
    """The alias logs in as "order_timeout": in LOCATION (any django-redis), or in OPTIONS (7.0 and later)."""
    if in_options:
        return use_alias(settings, f"redis://127.0.0.1:{redis.port}/{db}", USERNAME="order_timeout",
                         PASSWORD="s3cret")
    return use_alias(settings, f"redis://order_timeout:s3cret@127.0.0.1:{redis.port}/{db}")


@pytest.mark.parametrize("in_options", [
    False,
    pytest.param(True, marks=pytest.mark.skipif(
        django_redis.VERSION[:2] < DJANGO_REDIS_USERNAME,
        reason="this django-redis ignores OPTIONS['USERNAME'] (check order_timeout.E010 says so)")),
], ids=["user-in-location", "user-in-options"])
def test_a_least_privilege_acl_user(server, settings, make_order, queue, in_options):
    redis = redis_with_user(server, ACL_RULES)

    # A database of its own, as the README's LOCATION.
    with as_user(settings, redis, db=1, in_options=in_options):
        close_one_order_through_the_queue(make_order)
        # The fleet's housekeeping turns, and the record the status reads, need no more.
        assert run_scan("consumer") is not None and run_prune("consumer", due_only=False) is not None
        assert last_runs()["scan"].complete and last_runs()["prune"].complete
        client = get_redis_connection("deployment")
        # And nothing else: another key, or a command the app does not use, is refused.
        with pytest.raises(Exception, match="NOPERM|no permissions"):
            client.set("someone-else", 1)
        with pytest.raises(Exception, match="NOPERM|no permissions"):
            client.flushdb()


def test_a_user_without_the_dangerous_commands_is_woken_for_a_new_early_deadline(server, settings, make_order):
    """INFO is refused to such a user; the wake-up thread must not need it."""
    redis = redis_with_user(server, NOT_DANGEROUS)

    with as_user(settings, redis):
        close_one_order_through_the_queue(make_order)


def test_a_user_refused_the_wake_up_subscription_gives_it_up_once_and_the_consumer_still_polls(
        server, settings, make_order, caplog):
    redis = redis_with_user(server, NOT_DANGEROUS + " -ssubscribe -subscribe")

    with as_user(settings, redis), caplog.at_level(logging.INFO, logger="order_timeout"):
        worker = Consumer(max_wait=0.2)
        with running(worker):
            wait_for(lambda: worker._listener is not None and not worker._listener.thread.is_alive(),
                     timeout=10)
            order = make_order(in_seconds=0.2)
            wait_for(lambda: state(order) == "closed", timeout=15)

    about_wake_ups = [record for record in caplog.records if "wake-up" in record.getMessage()]
    assert [record.levelname for record in about_wake_ups] == ["ERROR"], about_wake_ups
    assert "ssubscribe" in about_wake_ups[0].getMessage()


def test_deploy_check_names_the_commands_the_user_lacks(server, settings):
    redis = redis_with_user(server, ACL_RULES.replace(" +zmscore", "").replace(" +ssubscribe", ""))

    with as_user(settings, redis):
        messages = check_redis_permissions()

    assert [message.id for message in messages] == ["order_timeout.W009"]
    assert "may not run SSUBSCRIBE, ZMSCORE " in messages[0].msg
    assert "+ssubscribe +zmscore" in messages[0].hint


def test_deploy_check_names_the_keys_and_channels_the_user_may_not_touch(server, settings):
    """The queue's keys are named by their pattern, {prefix* (a brace the message is built around,
    not a format field: the check raised ValueError here)."""
    redis = redis_with_user(server, ACL_RULES.replace(f"{{{PREFIX}*", "{someone-else*"))

    with as_user(settings, redis):
        messages = check_redis_permissions()

    assert [message.id for message in messages] == ["order_timeout.W009"]
    assert f"may not touch the queue's keys ({{{PREFIX}*, with " in messages[0].msg
    assert f"~{{{PREFIX}* &{{{PREFIX}*" in messages[0].hint


def test_deploy_check_says_a_location_with_a_database_number_needs_select(server, settings):
    redis = redis_with_user(server, ACL_RULES.replace(" +select", ""))

    with as_user(settings, redis, db=1):
        messages = check_redis_permissions()

    assert [message.id for message in messages] == ["order_timeout.W009"]
    assert messages[0].msg.startswith("The queue's Redis user may not run SELECT ")


def test_deploy_checks_find_nothing_missing_for_the_least_privilege_rule(server, settings):
    redis = redis_with_user(server, ACL_RULES)

    with as_user(settings, redis, db=1):
        permissions, server_checks = check_redis_permissions(), check_redis_server()

    assert permissions == []
    # CONFIG is not in the rule (CONFIG GET would show secrets): the RDB saves go unchecked, and it says so.
    assert [message.id for message in server_checks] == ["order_timeout.W008"]
    assert "CONFIG" in server_checks[0].msg and "persist" in server_checks[0].msg


def test_deploy_checks_run_for_a_user_without_the_dangerous_commands(server, settings):
    redis = redis_with_user(server, NOT_DANGEROUS)

    with as_user(settings, redis):
        permissions, server_checks = check_redis_permissions(), check_redis_server()

    assert permissions == []
    # The version is still checked (through a script); eviction and persistence need INFO.
    assert [message.id for message in server_checks] == ["order_timeout.W008"]
    assert "INFO" in server_checks[0].msg and "evict" in server_checks[0].msg


CLUSTER_FACTORY = {"CONNECTION_FACTORY": "order_timeout.redis_cluster.ClusterConnectionFactory"}


@pytest.mark.parametrize("redis_py, too_old", [("5.0.0", True), ("8.0.1", True), ("8.1.0", False),
                                               ("9.0.0b1", False)])
def test_a_cluster_alias_needs_redis_py_8_1_and_a_standalone_one_does_not(redis_py, too_old):
    assert [m.id for m in cluster_library_messages(CLUSTER_FACTORY, redis_py)] == (
        ["order_timeout.E009"] if too_old else [])
    assert cluster_library_messages({}, redis_py) == []


@pytest.mark.parametrize("django_redis_version, ignored", [((5, 4, 0), True), ((6, 0, 0), True),
                                                           ((7, 0, 0), False)])
def test_a_username_in_options_needs_a_django_redis_that_sends_it(django_redis_version, ignored):
    options = {"USERNAME": "order_timeout", "PASSWORD": "s3cret"}

    assert [m.id for m in username_messages(options, django_redis_version)] == (
        ["order_timeout.E010"] if ignored else [])
    assert username_messages({**options, **CLUSTER_FACTORY}, django_redis_version) == []  # reads it itself
    assert username_messages({"PASSWORD": "s3cret"}, django_redis_version) == []


def test_the_installed_client_libraries_fit_the_test_projects_aliases():
    assert check_client_libraries() == []


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A private CA and a server certificate for 127.0.0.1."""
    directory = tmp_path_factory.mktemp("tls")

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)

    # The extensions a strict verifier (Python 3.13's default VERIFY_X509_STRICT) asks
    # for: a CA that says it signs certificates, a leaf that names its issuer's key.
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=test-ca",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign",
            "-addext", "subjectKeyIdentifier=hash",
            "-keyout", "ca.key", "-out", "ca.crt")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout",
            "server.key", "-out", "server.csr")
    (directory / "server.cnf").write_text(
        "subjectAltName=IP:127.0.0.1\n"
        "basicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth,clientAuth\n"  # cluster nodes are each other's clients
        "subjectKeyIdentifier=hash\n"
        "authorityKeyIdentifier=keyid\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "2", "-extfile", "server.cnf", "-out", "server.crt")
    return directory


def test_tls(server, settings, make_order, certificates):
    port = free_port()
    redis = PrivateRedis("--tls-port", str(port), "--tls-cert-file", str(certificates / "server.crt"),
                         "--tls-key-file", str(certificates / "server.key"),
                         "--tls-ca-cert-file", str(certificates / "ca.crt"),
                         "--tls-auth-clients", "no", port=port)
    server.append(redis)
    redis.start()

    with use_alias(settings, f"rediss://127.0.0.1:{port}/0",
                   CONNECTION_POOL_KWARGS={"ssl_ca_certs": str(certificates / "ca.crt")}):
        close_one_order_through_the_queue(make_order)


def cluster_port() -> int:
    """A free port whose cluster bus port (+10000) is a port too, and free."""
    while True:
        port = free_port()
        if port + 10000 <= 65535:
            try:
                with socket.socket() as bus:
                    bus.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
            return port


@pytest.mark.slow
def test_a_redis_cluster_over_tls_with_a_private_ca(server, settings, make_order, certificates):
    """CONNECTION_POOL_KWARGS (the CA) reach every node's connections, the wake-ups' included."""
    tls = ["--tls-cert-file", str(certificates / "server.crt"), "--tls-key-file",
           str(certificates / "server.key"), "--tls-ca-cert-file", str(certificates / "ca.crt"),
           "--tls-auth-clients", "no", "--tls-cluster", "yes", "--tls-replication", "yes"]
    nodes = []
    for _ in range(3):
        port = cluster_port()
        nodes.append(PrivateRedis("--tls-port", str(port), "--cluster-enabled", "yes",
                                  "--cluster-node-timeout", "2000", *tls, port=port))
    server.extend(nodes)
    for node in nodes:
        node.start()
    subprocess.run(["redis-cli", "--tls", "--cacert", str(certificates / "ca.crt"), "--cluster", "create",
                    *(f"127.0.0.1:{node.port}" for node in nodes), "--cluster-yes"],
                   check=True, capture_output=True, timeout=60)
    admins = [Redis(host="127.0.0.1", port=node.port, ssl=True, ssl_ca_certs=str(certificates / "ca.crt"))
              for node in nodes]
    wait_for(lambda: all(b"cluster_state:ok" in admin.execute_command("CLUSTER", "INFO") for admin in admins),
             timeout=30)

    with use_alias(settings, ",".join(f"rediss://127.0.0.1:{node.port}" for node in nodes),
                   CONNECTION_FACTORY="order_timeout.redis_cluster.ClusterConnectionFactory",
                   CONNECTION_POOL_KWARGS={"ssl_ca_certs": str(certificates / "ca.crt")}):
        with override_settings(ORDER_TIMEOUT={**settings.ORDER_TIMEOUT, "SHARDS": 6}):
            close_one_order_through_the_queue(make_order)


@pytest.mark.slow
def test_sentinel_and_a_failover_the_consumer_rides_through(server, settings, make_order, tmp_path):
    primary = PrivateRedis()
    replica = PrivateRedis("--replicaof", "127.0.0.1", str(primary.port))
    sentinel_port = free_port()
    config = tmp_path / "sentinel.conf"
    config.write_text(textwrap.dedent(f"""\
        port {sentinel_port}
        bind 127.0.0.1
        sentinel monitor shop 127.0.0.1 {primary.port} 1
        sentinel down-after-milliseconds shop 1000
        sentinel failover-timeout shop 5000
    """))
    server.extend([primary, replica])
    primary.start()
    replica.start()
    sentinel_proc = subprocess.Popen(["redis-server", str(config), "--sentinel"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: _sentinel_knows_replica(sentinel_port), timeout=20)
        with use_alias(settings, "redis://shop/0",
                       CONNECTION_FACTORY="django_redis.pool.SentinelConnectionFactory",
                       CLIENT_CLASS="django_redis.client.SentinelClient",
                       SENTINELS=[("127.0.0.1", sentinel_port)]):
            close_one_order_through_the_queue(make_order)
            worker = Consumer(max_wait=0.2)
            with running(worker):
                Redis(port=sentinel_port).execute_command("SENTINEL", "FAILOVER", "shop")
                wait_for(lambda: Redis(port=replica.port).info("replication")["role"] == "master",
                         timeout=30)
                orders = [make_order(in_seconds=0.3) for _ in range(3)]
                wait_for(lambda: all(state(o) == "closed" for o in orders), timeout=30)
            assert pending_count(worker.queue) == 0
            # The fleet's housekeeping turns on the new primary, through Sentinel.
            assert run_scan("consumer") is not None and last_runs()["scan"].complete
    finally:
        sentinel_proc.terminate()
        sentinel_proc.wait(10)


def _sentinel_knows_replica(port: int) -> bool:
    try:
        replicas = Redis(port=port).execute_command("SENTINEL", "REPLICAS", "shop")
    except Exception:
        return False
    return bool(replicas)
