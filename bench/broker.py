"""Celery's broker for the ETA peers (bench/celery_eta.py): its client, its backlog, its emptying.

Apart from the workloads and the systems, which both use it, so that neither imports the other.
"""

from __future__ import annotations

from typing import Any

from .ownership import keep_mark


def broker_client() -> Any:
    from redis import Redis

    from .celery_eta import app

    return Redis.from_url(app.conf.broker_url)


def broker_backlog() -> int:
    """Tasks the broker still holds for the ETA workers."""
    from .celery_eta import app

    with app.connection_for_write() as conn:
        return int(conn.default_channel.client.llen("bench_eta"))


def flush_broker() -> None:
    client = broker_client()
    client.flushdb()
    keep_mark(client)
