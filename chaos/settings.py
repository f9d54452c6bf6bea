"""Settings of the chaos harness's processes: the test project, tuned small, plus the ``chaos`` app.

Every process the harness starts (consumers, scans) and the harness itself
run with ``DJANGO_SETTINGS_MODULE=chaos.settings``. The test project already
reads DATABASE_URL, REDIS_URL and a few ``ORDER_TIMEOUT_*`` variables; the
keys it does not read are read here, as ``ORDER_TIMEOUT_<KEY>`` holding JSON
(``ORDER_TIMEOUT_RETRY_DELAYS='[1, 2]'``), so the harness tunes every process
the same way from one place (``chaos.tuning``).
"""

import json
import os
from typing import Any

from testproject.settings import *  # noqa: F403
from testproject.settings import CACHES, INSTALLED_APPS, ORDER_TIMEOUT, REDIS_URL

# Faster migrations and process start-up: nothing here needs django-celery-beat's tables.
INSTALLED_APPS = [app for app in INSTALLED_APPS if app != "django_celery_beat"]
INSTALLED_APPS.append("chaos")

# The queue in a Redis database of its own, as check order_timeout.W005 advises
# (the shop's cache stays where the test project puts it); in a --redis-cluster run, on the
# harness's private cluster (the test project's "cluster" alias, from REDIS_CLUSTER_URL).
if "cluster" in CACHES:
    CACHES["order_timeout"] = CACHES["cluster"]
else:
    _queue_cache: Any = CACHES.get("order_timeout", CACHES["default"])
    CACHES["order_timeout"] = {**_queue_cache, "LOCATION": REDIS_URL.rsplit("/", 1)[0] + "/1"}
ORDER_TIMEOUT["REDIS_ALIAS"] = "order_timeout"

# The keys the test project does not read itself.
for _key in ("RETRY_DELAYS", "MAX_TAKEOVERS", "BATCH_SIZE", "MAX_WAIT", "SCHEDULE_TIMEOUT",
             "COMPENSATION_LOCK_SECONDS", "COMPENSATION_CHUNK", "HOLD_RECHECK", "MAX_HOLD",
             # The soak's short ages (chaos.soak): the scan's full walk, the retentions and the prune.
             "COMPENSATION_FULL_INTERVAL", "NOTICE_RETENTION", "REMINDER_RETENTION", "DEAD_LETTER_RETENTION",
             "PRUNE_INTERVAL", "PRUNE_CHUNK"):
    if f"ORDER_TIMEOUT_{_key}" in os.environ:
        ORDER_TIMEOUT[_key] = json.loads(os.environ[f"ORDER_TIMEOUT_{_key}"])
