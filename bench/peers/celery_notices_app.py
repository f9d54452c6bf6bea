"""The common way to tell the outside world of a close: Celery's ``delay()`` from ``on_commit()``.

What the README told shops before notices (issue 26), and what most Django
shops write: an ``order_expired`` receiver registers
``transaction.on_commit(lambda: send_webhook.delay(order.pk))``, so the task is
published only once the close committed, and a Celery worker POSTs the webhook.
The task is written as Celery's docs advise for a call to a remote service:
``autoretry_for`` its errors with ``retry_backoff``, acked when it starts (Celery's
default). The broker is the Redis one the bench's Celery rows use
(CELERY_BROKER_URL: database 11), with its default visibility timeout (an hour).

Installed in our consumers' processes by bench/apps.py when
BENCH_CELERY_NOTICES=1; the POST goes to BENCH_SINK_URL (the harness's sink,
bench/sink.py), with the key the notices row's webhook carries
(``bench.notices.key_of``) as its ``Idempotency-Key``.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")

QUEUE = "bench_notices"

# Not the current app where it is only imported (the harness finds the peers by importing their
# modules, and the consumers publish with it): the worker makes it current in its own processes.
app = Celery("bench_notices", set_as_current=False)
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.update(task_default_queue=QUEUE, result_backend=None, task_ignore_result=True,
                broker_connection_retry_on_startup=True)


class WebhookFailed(Exception):
    """The target answered something other than a 2xx: retried, as a connection error is."""


_pool: Any = None
_pool_lock = threading.Lock()


def _connections() -> Any:
    """One urllib3 pool per process (a prefork child makes its own), connections kept alive."""
    global _pool
    import urllib3

    with _pool_lock:
        if _pool is None or _pool[0] != os.getpid():
            _pool = (os.getpid(), urllib3.PoolManager(maxsize=16, block=False))
        return _pool[1]


def _retried() -> tuple[type[BaseException], ...]:
    import urllib3

    return (urllib3.exceptions.HTTPError, WebhookFailed)


@app.task(name="bench.notices.send_webhook", ignore_result=True, autoretry_for=_retried(), retry_backoff=True,
          max_retries=5)
def send_webhook(pk: int) -> None:
    """POST the order's "expired" webhook, its key the same on every attempt."""
    from bench.notices import key_of

    key = key_of(pk)
    response = _connections().request(
        "POST", os.environ["BENCH_SINK_URL"],
        body=json.dumps({"order": pk, "event": "order.expired", "key": key}).encode(),
        headers={"Content-Type": "application/json", "Idempotency-Key": key}, timeout=5.0, retries=False)
    if not 200 <= response.status < 300:
        raise WebhookFailed(f"the webhook answered {response.status}")


def on_expired(sender: Any, order: Any, **kwargs: Any) -> None:
    """The shop's receiver: the webhook's task, published once the close has committed."""
    from django.db import transaction

    pk = order.pk
    transaction.on_commit(lambda: send_webhook.delay(pk))
