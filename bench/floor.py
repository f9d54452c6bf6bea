"""The floor: the least work that closes a due order through the same MariaDB (or PostgreSQL) and Redis.

    python -m bench.floor

A hand-written closer with nothing else: one Lua claim of a batch
(ZRANGEBYSCORE + ZREM, no lease, nothing kept for a crash), then one
``UPDATE ... WHERE id IN (...) AND status = 'unpaid' AND expires_at <= now``
and one COMMIT per batch through the database driver (no ORM, no row read,
no signal, no retry, no clock of its own), and a sleep until the next score,
at most ``IDLE_POLL`` (it has no wake-up: a short poll stands in for one),
when nothing is due. It promises nothing; it tells what this machine's
servers allow, so our rows can be read as ratios to it.

Its commit times go to BENCH_RECORD_DIR in the recorder's format (at exit; as they commit
with BENCH_RECORD_EAGER=1, as the recorder does).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

FLOOR_KEY = "bench:floor:zset"
BATCH = 500
# Longest idle sleep: new members may fall due before the head it slept for.
IDLE_POLL = 0.01
CLAIM = """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
if #due > 0 then redis.call('ZREM', KEYS[1], unpack(due)) end
return due
"""
stopping = threading.Event()


def main() -> None:
    import django

    django.setup()
    from django.db import connection
    from django_redis import get_redis_connection

    from order_timeout.models import Order

    from . import recorder

    eager = recorder.eager()
    client = get_redis_connection("order_timeout")
    claim = client.register_script(CLAIM)
    table = Order._meta.db_table
    now_sql = "UTC_TIMESTAMP(6)" if connection.vendor == "mysql" else "STATEMENT_TIMESTAMP()"
    commits: list[tuple[int, float]] = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    connection.ensure_connection()
    raw = connection.connection
    raw.autocommit(False) if connection.vendor == "mysql" else setattr(raw, "autocommit", False)
    cursor = raw.cursor()
    placeholder = "%s"
    print("ready", flush=True)
    while not stopping.is_set():
        due = claim(keys=[FLOOR_KEY], args=[int(time.time() * 1000), BATCH])
        if not due:
            head = client.zrange(FLOOR_KEY, 0, 0, withscores=True)
            wait = (head[0][1] / 1000 - time.time()) if head else IDLE_POLL
            stopping.wait(min(max(wait, 0.0), IDLE_POLL))
            continue
        pks = [int(member) for member in due]
        cursor.execute(
            f"UPDATE {table} SET status = 'closed', closed_at = {now_sql}, close_reason = 'timeout' "
            f"WHERE id IN ({', '.join([placeholder] * len(pks))}) AND status = 'unpaid' "
            f"AND expires_at <= {now_sql}", pks)
        raw.commit()
        at = time.time()
        if eager:  # the crash workload: records that outlive a SIGKILL
            recorder.append([(pk, at) for pk in pks])
        else:
            commits += [(pk, at) for pk in pks]
    directory = os.environ.get("BENCH_RECORD_DIR")
    if directory and commits:
        with (Path(directory) / f"commits-{os.getpid()}.txt").open("a") as out:
            out.write("".join(f"{pk} {at:.6f}\n" for pk, at in commits))


if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    main()
