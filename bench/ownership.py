"""The benchmark empties the Redis databases it runs on: only ever databases that are its own.

A database is the benchmark's when it is empty, or holds the mark the
benchmark left there on an earlier run. Anything else (a shop's cache on a
shared Redis, another project's keys) makes the harness refuse to start.
"""

from __future__ import annotations

from typing import Any

MARK = "order-timeout-bench:owner"


class NotOurs(Exception):
    pass


def claim(client: Any, where: str) -> None:
    """Check that ``client``'s database is ours, then mark it so.

    A cluster counts as one database: the mark lives on whichever master owns
    its slot, and the keys of every master count.
    """
    keys = _key_count(client)
    if keys and not client.exists(MARK):
        raise NotOurs(
            f"{where} holds {keys} keys the benchmark did not write; it empties the databases "
            "it runs on, so point it at empty ones (BENCH_REDIS_URL, BENCH_BROKER_URL) or "
            "empty this one yourself.")
    keep_mark(client)


def keep_mark(client: Any) -> None:
    """After a FLUSHDB (or a FLUSHALL on every master): the database is still ours."""
    client.set(MARK, "1")


def _key_count(client: Any) -> int:
    from redis.cluster import RedisCluster

    if isinstance(client, RedisCluster):
        return sum(node.redis_connection.dbsize() for node in client.get_primaries())
    return int(client.dbsize())
