"""Redis Cluster for django-redis, which has no cluster client of its own.

Point the queue's cache alias at a cluster with this connection factory::

    CACHES["order_timeout"] = {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": "redis://10.0.0.1:7000",          # any node; rediss:// for TLS
        "OPTIONS": {
            "CONNECTION_FACTORY": "order_timeout.redis_cluster.ClusterConnectionFactory",
            "SOCKET_CONNECT_TIMEOUT": 1, "SOCKET_TIMEOUT": 2,
            # "USERNAME": ..., "PASSWORD": ...            (or in the URL)
        },
    }

Every node gets its own connection pool (redis-py's ``RedisCluster`` finds
the nodes from the one you name, and follows failovers and slot moves).
"""

from __future__ import annotations

from typing import Any

from django_redis.pool import ConnectionFactory
from redis.cluster import RedisCluster

# Arguments a client was built with, kept so a twin with other timeouts can be built.
_BUILT_WITH = "_order_timeout_built_with"


def cluster_client(template: RedisCluster | None = None, /, **kwargs: Any) -> RedisCluster:
    """A ``RedisCluster`` from ``url`` and options, or a twin of ``template`` with ``kwargs`` changed."""
    if template is not None:
        kwargs = {**getattr(template, _BUILT_WITH), **kwargs}
    url = kwargs.pop("url")
    client = RedisCluster.from_url(url, **kwargs)
    setattr(client, _BUILT_WITH, {"url": url, **kwargs})
    return client


class ClusterConnectionFactory(ConnectionFactory):
    """django-redis connection factory that builds one ``RedisCluster`` per LOCATION, per process."""

    _clusters: dict[str, RedisCluster] = {}

    def get_connection(self, params: dict[str, Any]) -> Any:
        key = params["url"]
        if key not in self._clusters:
            options = {name: params[name] for name in
                       ("username", "password", "socket_timeout", "socket_connect_timeout")
                       if name in params}
            self._clusters[key] = cluster_client(url=params["url"], **options,
                                                 **self.redis_client_cls_kwargs)
        return self._clusters[key]

    def disconnect(self, connection: Any) -> None:
        connection.close()
