"""The Redis clients of the queue: a cache alias's, and the bounded one every save of a process shares."""

from __future__ import annotations

import threading
from typing import Any

from redis import BlockingConnectionPool, Redis
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry as RedisRetry
from redis.sentinel import SentinelConnectionPool

from .errors import redis_errors

# Most connections the saves of one process open to each Redis node (fewer if the
# alias's own pool allows fewer): a save waits at most SCHEDULE_TIMEOUT for one to come
# free. Saves hold one for a round trip, so a few serve every thread of a web process.
SAVE_CONNECTIONS = 10


def _cluster_factory(alias: str) -> Any:
    """The alias's ``ClusterConnectionFactory``, or None for any other connection factory."""
    from django.core.cache import caches

    from ..redis_cluster import ClusterConnectionFactory

    factory = getattr(getattr(caches[alias], "client", None), "connection_factory", None)
    return factory if isinstance(factory, ClusterConnectionFactory) else None


def _location(alias: str) -> Any:
    from django.conf import settings as django_settings

    return django_settings.CACHES[alias].get("LOCATION", "")


def alias_client(alias: str) -> Any:
    """The Redis client of a cache alias: django-redis's, or a Cluster seeded with every node LOCATION names.

    django-redis hands a connection factory one server of LOCATION at a time;
    a cluster needs them all, so that a process started while one seed is down
    still finds the others.
    """
    from django.core.exceptions import ImproperlyConfigured
    from django_redis import get_redis_connection

    with redis_errors("connect"):
        factory = _cluster_factory(alias)
        client = factory.cluster(_location(alias)) if factory is not None else get_redis_connection(alias)
    if not isinstance(client, (Redis, RedisCluster)):
        raise ImproperlyConfigured(f"CACHES[{alias!r}] gives a {type(client).__name__} client; the order "
                                   "timeout queue needs redis-py's Redis or RedisCluster.")
    return client


def _limits(timeout: float) -> dict[str, Any]:
    return {"socket_timeout": timeout, "socket_connect_timeout": timeout,
            "retry": RedisRetry(NoBackoff(), 0)}


def bounded_client(client: Any, timeout: float) -> Any:
    """A client on the same servers whose every round trip gives up after ``timeout`` seconds.

    For work done inside a web request (scheduling on commit): a Redis that
    hangs must cost the request a bounded time, not the alias's timeouts
    (often none) times redis-py's retries. Its pool holds ``SAVE_CONNECTIONS``
    at most (per node), and a save waits ``timeout`` at most for one. Any
    ``RedisCluster`` will do, however it was built.
    """
    if isinstance(client, RedisCluster):
        from ..redis_cluster import cluster_twin, refreshed_in_the_background

        size = min(SAVE_CONNECTIONS, client.nodes_manager.connection_kwargs.get("max_connections")
                   or SAVE_CONNECTIONS)
        return refreshed_in_the_background(cluster_twin(client, **_limits(timeout), **_pool_limits(timeout, size)))
    pool = client.connection_pool
    kwargs = {**pool.connection_kwargs, **_limits(timeout), "retry_on_timeout": False,
              "connection_class": pool.connection_class}
    if isinstance(pool, SentinelConnectionPool):
        # The pool finds the current master through the sentinels; its connections point back to it.
        kwargs.pop("connection_pool", None)
        return Redis(connection_pool=SentinelConnectionPool(
            pool.service_name, pool.sentinel_manager, is_master=pool.is_master, **kwargs))
    size = min(SAVE_CONNECTIONS, getattr(pool, "max_connections", None) or SAVE_CONNECTIONS)
    return Redis(connection_pool=BlockingConnectionPool(max_connections=size, timeout=timeout, **kwargs))


def _pool_limits(timeout: float, size: int) -> dict[str, Any]:
    """Each node's pool: at most ``size`` connections, waiting ``timeout`` at most for one."""
    return {"connection_pool_class": BlockingConnectionPool, "max_connections": size, "timeout": timeout}


def saves_client(alias: str, timeout: float) -> Any:
    """The process's bounded client for saves through ``alias`` (built on first use, then shared)."""
    from django.conf import settings as django_settings

    key = (alias, repr(django_settings.CACHES.get(alias)), timeout)
    with _bounded_lock:
        client = _bounded_clients.get(key)
    if client is not None:
        return client
    # Built outside the lock: a cluster client connects while it is built, and a save
    # must not wait for another save's connection attempt as well as its own.
    with redis_errors("connect"):
        factory = _cluster_factory(alias)
        if factory is not None:
            from ..redis_cluster import cluster_client, refreshed_in_the_background

            options = factory.connection_options()
            size = min(SAVE_CONNECTIONS, options.get("max_connections") or SAVE_CONNECTIONS)
            built = refreshed_in_the_background(cluster_client(
                _location(alias), **{**options, **_limits(timeout), **_pool_limits(timeout, size)}))
        else:
            built = bounded_client(alias_client(alias), timeout)
    with _bounded_lock:
        client = _bounded_clients.setdefault(key, built)
    if client is not built:
        built.close()
    return client


# One bounded client per (alias, its CACHES entry, timeout), shared by every thread and request of a process.
_bounded_clients: dict[tuple[str, str, float], Any] = {}
_bounded_lock = threading.Lock()
