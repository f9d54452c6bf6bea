"""Reading order rows the same way whatever the model: its declared statuses, not raw values."""

from __future__ import annotations

from typing import Any

from order_timeout.models import TimeoutOrderMixin
from testproject.shop.models import Expiry


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


def lock_waits() -> int:
    """Transactions of the test database waiting for a row lock right now."""
    from django.db import connection

    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT count(*) FROM pg_locks WHERE NOT granted")
        else:
            cursor.execute("SELECT COUNT(*) FROM information_schema.INNODB_TRX "
                           "WHERE trx_state = 'LOCK WAIT'")
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
    """The consumer's next claim that takes members: it goes round the shards, some empty."""
    claim = worker.claim(now)
    for _ in range(len(worker.queue.shards) - 1):
        if claim.members:
            break
        claim = worker.claim(now)
    return claim


def lose_redis_data(queue: Any) -> None:
    """The queue's Redis restarts empty (no persistence), whichever Redis it is."""
    from redis.cluster import RedisCluster

    if isinstance(queue.client, RedisCluster):
        queue.client.flushall(target_nodes=RedisCluster.PRIMARIES)
    else:
        queue.client.flushdb()


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
