"""Redis errors, as the app's own: ``QueueUnavailable``, naming what failed, passwords masked."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from redis.exceptions import RedisClusterException, RedisError

from ..exceptions import QueueUnavailable
from ..redaction import masked


@contextmanager
def redis_errors(action: str) -> Iterator[None]:
    """Any Redis or Redis Cluster error, as ``QueueUnavailable`` naming what failed."""
    try:
        yield
    except (RedisError, RedisClusterException) as exc:
        raise QueueUnavailable(masked(f"Redis failed to {action}: {type(exc).__name__}: {exc}")) from exc
