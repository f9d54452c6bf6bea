"""Redis Cluster for django-redis, which has no cluster client of its own.

Point the queue's cache alias at a cluster with this connection factory::

    CACHES["order_timeout"] = {
        "BACKEND": "django_redis.cache.RedisCache",
        # Seed nodes: several (a comma-separated string or a list), so a process
        # that starts while one of them is down still finds the cluster; or one
        # DNS name that resolves to the nodes. rediss:// for TLS.
        "LOCATION": "redis://10.0.0.1:7000,redis://10.0.0.2:7000,redis://10.0.0.3:7000",
        "OPTIONS": {
            "CONNECTION_FACTORY": "order_timeout.redis_cluster.ClusterConnectionFactory",
            "SOCKET_CONNECT_TIMEOUT": 1, "SOCKET_TIMEOUT": 2,
            # "USERNAME": ..., "PASSWORD": ...            (or in the URLs)
            # "CONNECTION_POOL_KWARGS": {"ssl_ca_certs": "/etc/ssl/redis-ca.crt"},
        },
    }

Every node gets its own connection pool, with the options above
(``CONNECTION_POOL_KWARGS`` included); ``RedisCluster`` finds every node from
the seeds and follows failovers and slot moves. The app's own clients
(``TimeoutQueue.from_settings()``, the saves' bounded client) use every seed;
django-redis's own calls on the alias (its ``cache`` API,
``get_redis_connection``) connect through the first.

Cluster mode needs redis-py ``MIN_REDIS_PY`` or later (check ``order_timeout.E009``):
older versions drop every sharded pub/sub message on a cluster, so the
wake-ups never arrive, and 8.0.0 does not reconnect a client that has no
retries after a node restarts. A standalone Redis works with older redis-py
(``pyproject.toml``'s floor).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django_redis.pool import ConnectionFactory
from redis.cluster import REDIS_ALLOWED_KEYS, ClusterNode, RedisCluster
from redis.connection import SSLConnection, parse_url

from .redaction import masked

logger = logging.getLogger("order_timeout")

# The lowest redis-py whose cluster client the queue works on (CI tests this one).
MIN_REDIS_PY = "8.1"

# Connection options RedisCluster refuses in its keyword arguments: the nodes are
# found from the seeds, and retries happen at the cluster level.
_NOT_PER_NODE = ("host", "port", "db", "retry")


def seed_urls(location: str | Sequence[str]) -> list[str]:
    """The seed nodes a LOCATION names: a comma-separated string or a list, as django-redis takes servers."""
    items = location.split(",") if isinstance(location, str) else list(location)
    urls = [str(item).strip() for item in items if str(item).strip()]
    if not urls:
        raise ImproperlyConfigured("A Redis Cluster LOCATION must name at least one node, "
                                   f"got {masked(repr(location))}.")
    return urls


def _seed(url: str) -> tuple[ClusterNode, dict[str, Any]]:
    """The node a seed URL names, and what else the URL says (scheme, credentials, options)."""
    try:
        options = parse_url(url)
    except ValueError as exc:
        raise ImproperlyConfigured(masked(f"Redis Cluster seed {url!r}: {exc}")) from None
    if "path" in options or "host" not in options:
        raise ImproperlyConfigured(f"Redis Cluster seed {masked(repr(url))} must be redis://host:port or "
                                   "rediss://host:port.")
    if options.pop("db", 0) != 0:
        raise ImproperlyConfigured(f"Redis Cluster seed {masked(repr(url))} names a database other than 0; "
                                   "a cluster has only database 0.")
    node = ClusterNode(options.pop("host"), options.pop("port", 6379))
    return node, options


def seed_nodes(location: str | Sequence[str]) -> tuple[list[ClusterNode], dict[str, Any]]:
    """Every seed node of a LOCATION, and the connection options the seed URLs share."""
    nodes, shared = [], None
    for url in seed_urls(location):
        node, options = _seed(url)
        if shared is not None and options != shared:
            raise ImproperlyConfigured(
                f"The Redis Cluster seeds in LOCATION {masked(repr(location))} differ in scheme, "
                "credentials or options; give every seed the same (or put credentials in OPTIONS).")
        nodes.append(node)
        shared = options
    return nodes, shared or {}


def cluster_client(location: str | Sequence[str], /, **options: Any) -> RedisCluster:
    """A ``RedisCluster`` that starts from every seed of ``location``, with ``options`` for each node."""
    nodes, url_options = seed_nodes(location)
    first, *rest = nodes
    # A URL (any seed's host, the scheme's connection class in the options) makes
    # redis-py build each node's pool from the options, so pool options (the TLS CA,
    # a pool class and its size) reach every node; the other seeds come beside it.
    return RedisCluster(url=f"redis://{first.host}:{first.port}", startup_nodes=rest,
                        **{**url_options, **options})


def cluster_twin(template: RedisCluster, /, **changes: Any) -> RedisCluster:
    """A new ``RedisCluster`` on ``template``'s nodes and connection options, with ``changes``.

    Works on any ``RedisCluster``, however it was built: the nodes it knows now
    are the seeds, and its node connection options are redis-py's public
    ``nodes_manager.connection_kwargs``.
    """
    manager = template.nodes_manager
    options = {name: value for name, value in manager.connection_kwargs.items()
               if name != "redis_connect_func"}  # the template's own hook, bound to it
    if options.pop("ssl", False):
        # Built from host and port (not a URL): the pools take a connection class, not a flag.
        options["connection_class"] = SSLConnection
    cluster_wide: dict[str, Any] = {"reinitialize_steps": template.reinitialize_steps,
                                    "address_remap": manager.address_remap,
                                    "connection_pool_class": manager.connection_pool_class}
    if getattr(template, "load_balancing_strategy", None) is not None:
        cluster_wide["load_balancing_strategy"] = template.load_balancing_strategy
    elif template.read_from_replicas:
        cluster_wide["read_from_replicas"] = True
    nodes = template.get_nodes() or list(manager.startup_nodes.values())
    first, *rest = nodes
    return RedisCluster(url=f"redis://{first.host}:{first.port}",
                        startup_nodes=[ClusterNode(node.host, node.port) for node in rest],
                        **{**cluster_wide, **options, **changes})


def refreshed_in_the_background(client: RedisCluster, /) -> RedisCluster:
    """``client``, its map of slots to nodes refreshed by a thread of its own, never by the caller.

    After a node times out or refuses, redis-py refreshes the map there and
    then, on the caller's thread, asking each known node in turn under one lock:
    with the cluster hung, every save of a process would wait a timeout per node
    and then for every other save's refresh, seconds in all where a standalone
    server costs each save its own round trips. For the saves' client only: a
    save gives up at its first error anyway (the scan heals it), and the next
    saves find the map the refresh made. One refresh runs at a time; a failure
    while one runs starts none. The first map, built with the client, is not
    affected.
    """
    manager = client.nodes_manager
    refresh = manager.initialize
    running = threading.Lock()

    def in_its_own_thread(*args: Any, **kwargs: Any) -> None:
        if not running.acquire(blocking=False):
            return

        def run() -> None:
            try:
                refresh(*args, **kwargs)
            except Exception:  # the cluster still down: the next failure tries again
                logger.debug("Could not refresh the Redis Cluster's map of slots.", exc_info=True)
            finally:
                running.release()

        threading.Thread(target=run, name="order-timeout-cluster-map", daemon=True).start()

    manager.initialize = in_its_own_thread  # type: ignore[method-assign]
    return client


class ClusterConnectionFactory(ConnectionFactory):
    """django-redis connection factory that builds one ``RedisCluster`` per LOCATION and options, per process."""

    _clusters: dict[tuple[tuple[str, ...], str], RedisCluster] = {}
    _lock = threading.Lock()

    def connection_options(self) -> dict[str, Any]:
        """What each node's connections get: OPTIONS' credentials and timeouts, then
        ``CONNECTION_POOL_KWARGS`` (the TLS CA...), ``CONNECTION_POOL_CLASS`` if set, and
        ``REDIS_CLIENT_KWARGS`` (``RedisCluster``'s own: ``read_from_replicas``...)."""
        params = self.make_connection_params("")
        options = {name: params[name] for name in
                   ("username", "password", "socket_timeout", "socket_connect_timeout") if name in params}
        if self.options.get("USERNAME"):  # django-redis before 7.0 leaves it out
            options["username"] = self.options["USERNAME"]
        for name in self.pool_cls_kwargs:
            if name not in REDIS_ALLOWED_KEYS or name in _NOT_PER_NODE:
                raise ImproperlyConfigured(
                    f"OPTIONS['CONNECTION_POOL_KWARGS'] has {name!r}, which redis-py's RedisCluster "
                    "does not pass to its nodes; leave it out of a cluster's options.")
        options.update(self.pool_cls_kwargs)
        if "CONNECTION_POOL_CLASS" in self.options:
            options["connection_pool_class"] = self.pool_cls
        options.update(self.redis_client_cls_kwargs)
        return options

    def cluster(self, location: str | Sequence[str]) -> RedisCluster:
        """The process's ``RedisCluster`` for these seeds and this alias's options (built once)."""
        key = (tuple(seed_urls(location)), repr(self.options))
        with self._lock:
            client = self._clusters.get(key)
        if client is None:
            built = cluster_client(location, **self.connection_options())  # connects: not under the lock
            with self._lock:
                client = self._clusters.setdefault(key, built)
            if client is not built:
                built.close()
        return client

    def get_connection(self, params: dict[str, Any]) -> Any:
        # django-redis's own path: it splits LOCATION and hands over one server at a time.
        return self.cluster(params["url"])

    def disconnect(self, connection: Any) -> None:
        connection.close()
