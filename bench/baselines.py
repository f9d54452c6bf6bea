"""The seeds' two designs as long-running closers: ``python -m bench.baselines polling|seed_zset``.

polling:   every second, ``status='unpaid' AND expires_at < now LIMIT 500``
           from the orders table, then one transaction per order.
seed_zset: every second, the seeds' Lua ZRANGEBYSCORE+ZREM claim of 200 from
           a sorted set, then one transaction per order.
Both drain what is due before sleeping to the next one-second tick, and stop
on SIGTERM after the order in hand.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from importlib import resources

from bench.stopping import stop_on_sigterm

SEED_KEY = "bench:seed:zset"
POLL_LIMIT = 500
SEED_LIMIT = 200
stopping = threading.Event()


def poll_database() -> int:
    from django.utils import timezone

    from order_timeout.models import Order, Status

    from .closers import close_one

    pks = list(Order.objects.filter(status=Status.UNPAID, expires_at__lt=timezone.now())
               .values_list("pk", flat=True)[:POLL_LIMIT])
    for pk in pks:
        close_one(pk)  # a not-yet-due row is simply found again by a later poll
    return len(pks)


def claim_seed_zset() -> int:
    from django_redis import get_redis_connection

    from .closers import close_one

    client = get_redis_connection("order_timeout")
    script = client.register_script(
        resources.files("bench").joinpath("lua", "seed_claim.lua").read_text())
    members = script(keys=[SEED_KEY], args=[int(time.time() * 1000), SEED_LIMIT])
    for member in members:
        not_yet = close_one(int(member))
        if not_yet is not None:  # put it back, as the seeds' retry advice says
            client.zadd(SEED_KEY, {member: int(not_yet.timestamp() * 1000) + 1})
    return len(members)


def main(kind: str) -> None:
    import django

    django.setup()
    step, batch = {"polling": (poll_database, POLL_LIMIT),
                   "seed_zset": (claim_seed_zset, SEED_LIMIT)}[kind]
    stop_on_sigterm(stopping)
    print("ready", flush=True)
    while not stopping.is_set():
        if step() < batch:  # drained: wait for the next one-second tick
            stopping.wait(1 - time.time() % 1)


if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    main(sys.argv[1])
