"""Settings of the test project, which is also the demo.

Reads DATABASE_URL (default: a SQLite file beside this project) and
REDIS_URL (default: redis://127.0.0.1:6379/0) from the environment.
"""

import os
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import dj_database_url

from order_timeout.beat import beat_schedule

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = os.environ.get("SECRET_KEY", "order-timeout-test-project-not-secret")
DEBUG = os.environ.get("DEBUG", "") == "1"
ALLOWED_HOSTS = ["*"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "order_timeout",
    "testproject.shop",
    "testproject.saleorlike",
    "testproject.tickets",
]
if os.environ.get("BENCH") == "1":  # the benchmark's commit-time recorder (bench/)
    INSTALLED_APPS.append("bench")
# The benchmark's peers that keep their jobs in models of their own (bench/peers), only when it
# names them: scripts/bench sets BENCH_PEER_APPS for its harness, whose migrate creates their
# tables, and so for every closer it starts.
if "django_tasks_db" in os.environ.get("BENCH_PEER_APPS", "").split(","):
    if find_spec("django.tasks") is None:  # before Django 6.0: the backport, an app of its own
        INSTALLED_APPS.append("django_tasks")
    INSTALLED_APPS.append("django_tasks_db")
    TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}
# django-celery-beat users: see order_timeout.beat.install_periodic_task(). Only where
# Celery itself is installed (the demo's environment has neither).
if find_spec("celery") is not None and find_spec("django_celery_beat") is not None:
    INSTALLED_APPS.append("django_celery_beat")
# The shops' REST APIs (testproject/shop/api.py, testproject/tickets/api.py), where Django REST
# framework is installed (the test dependency group has it); the app's refusals answer 409.
if find_spec("rest_framework") is not None:
    INSTALLED_APPS.append("rest_framework")
    # Token authentication, for the docs' blocks run against a project that uses it.
    INSTALLED_APPS.append("rest_framework.authtoken")
    REST_FRAMEWORK = {"EXCEPTION_HANDLER": "order_timeout.contrib.rest_framework.exception_handler"}

MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

ROOT_URLCONF = "testproject.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

DATABASES = {
    "default": dj_database_url.parse(
        os.environ.get("DATABASE_URL", f"sqlite:///{BASE_DIR / 'testproject.sqlite3'}"),
        # The benchmark keeps connections (as production does); tests and the demo do not.
        conn_max_age=int(os.environ.get("CONN_MAX_AGE", "0")),
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.mysql":
    DATABASES["default"]["OPTIONS"] = {"charset": "utf8mb4"}
    DATABASES["default"]["TEST"] = {"CHARSET": "utf8mb4", "COLLATION": "utf8mb4_unicode_ci"}
elif DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # The demo runs the consumer beside the process creating orders: take the
    # write lock up front and wait for it rather than failing with "locked".
    DATABASES["default"]["OPTIONS"] = {"timeout": 20, "transaction_mode": "IMMEDIATE"}

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
CACHES: dict[str, dict[str, Any]] = {
    # The shop's own cache. The queue never shares it: a cache.clear() would wipe
    # every pending deadline (check order_timeout.W005).
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    # The queue's alias: a Redis database nothing else writes to.
    "order_timeout": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": REDIS_URL,
        "OPTIONS": {"CLIENT_CLASS": "django_redis.client.DefaultClient",
                    "SOCKET_CONNECT_TIMEOUT": 1, "SOCKET_TIMEOUT": 2},
    }
}

# A Redis Cluster, when the tests have one (scripts/test starts it).
if os.environ.get("REDIS_CLUSTER_URL"):
    CACHES["cluster"] = {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": os.environ["REDIS_CLUSTER_URL"],
        "OPTIONS": {"CONNECTION_FACTORY": "order_timeout.redis_cluster.ClusterConnectionFactory",
                    "SOCKET_CONNECT_TIMEOUT": 1, "SOCKET_TIMEOUT": 2},
    }

ORDER_TIMEOUT: dict[str, Any] = {
    "REDIS_ALIAS": "order_timeout",
    "KEY_PREFIX": os.environ.get("ORDER_TIMEOUT_KEY_PREFIX", "order_timeout"),
    # Tests run the core behaviours against the app's Order and the shop's own ShopOrder.
    "ORDER_MODEL": os.environ.get("ORDER_TIMEOUT_ORDER_MODEL", "order_timeout.Order"),
}
# Tests that run the consumer or a Celery worker in another process tune them here.
for _key in ("LEASE_SECONDS", "BATCH_TIME_LIMIT", "HEARTBEAT_SECONDS", "MAX_WAIT", "BATCH_WINDOW",
             "COMPENSATION_GRACE", "COMPENSATION_INTERVAL", "COMPENSATION_LOCK_SECONDS", "PRUNE_INTERVAL"):
    if f"ORDER_TIMEOUT_{_key}" in os.environ:
        ORDER_TIMEOUT[_key] = float(os.environ[f"ORDER_TIMEOUT_{_key}"])
# A save's round trip to Redis waits SCHEDULE_TIMEOUT (0.1 s by default) for the answer: scripts/test
# sets it longer, since on two cores running several suites at once a busy test process came back
# later than that for no fault of Redis's, and left its row to a scan no test ran.
if "ORDER_TIMEOUT_SCHEDULE_TIMEOUT" in os.environ:
    ORDER_TIMEOUT["SCHEDULE_TIMEOUT"] = float(os.environ["ORDER_TIMEOUT_SCHEDULE_TIMEOUT"])
if "ORDER_TIMEOUT_COMPENSATION_CHUNK" in os.environ:
    ORDER_TIMEOUT["COMPENSATION_CHUNK"] = int(os.environ["ORDER_TIMEOUT_COMPENSATION_CHUNK"])
if "ORDER_TIMEOUT_SHARDS" in os.environ:
    ORDER_TIMEOUT["SHARDS"] = int(os.environ["ORDER_TIMEOUT_SHARDS"])
if "ORDER_TIMEOUT_REDIS_ALIAS" in os.environ:
    ORDER_TIMEOUT["REDIS_ALIAS"] = os.environ["ORDER_TIMEOUT_REDIS_ALIAS"]
# Payments take time: holds, deadline policy and reminders, for consumers in other processes.
for _key in ("HOLD_CONDITION", "DEADLINE_POLICY"):
    if os.environ.get(f"ORDER_TIMEOUT_{_key}"):
        ORDER_TIMEOUT[_key] = os.environ[f"ORDER_TIMEOUT_{_key}"]
# Notices: their retry delays, for consumers in other processes (the fault runs, the benchmark).
if os.environ.get("ORDER_TIMEOUT_NOTICE_RETRY_DELAYS"):
    ORDER_TIMEOUT["NOTICE_RETRY_DELAYS"] = [
        float(s) for s in os.environ["ORDER_TIMEOUT_NOTICE_RETRY_DELAYS"].split(",")]
if os.environ.get("ORDER_TIMEOUT_REMINDERS"):
    ORDER_TIMEOUT["REMINDERS"] = [float(s) for s in os.environ["ORDER_TIMEOUT_REMINDERS"].split(",")]

# The shops' own test modules (testproject/*/tests) run once with the suite's Redis and once as a
# shop's CI with no Redis would run them: the kit's setting on, and the queue's Redis nowhere.
if os.environ.get("ORDER_TIMEOUT_TESTING_WITHOUT_REDIS") == "1":
    ORDER_TIMEOUT["TESTING_WITHOUT_REDIS"] = True
    CACHES["order_timeout"]["LOCATION"] = "redis://127.0.0.1:9/0"  # the discard port: nothing listens

# Celery: Redis as broker and result backend (CELERY_BROKER_URL overrides).
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", REDIS_URL)
CELERY_RESULT_BACKEND = CELERY_BROKER_URL
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("CELERY_TASK_DEFAULT_QUEUE", "celery")

# Plain Celery beat: the compensation scan every COMPENSATION_INTERVAL seconds.
CELERY_BEAT_SCHEDULE = {
    **beat_schedule(interval=ORDER_TIMEOUT.get("COMPENSATION_INTERVAL", 300)),
}

# The shop's e-mails (notices, testproject/shop/notices.py): kept in memory unless the
# environment names a backend (the demo prints them: the console backend).
EMAIL_BACKEND = os.environ.get("EMAIL_BACKEND", "django.core.mail.backends.locmem.EmailBackend")
if os.environ.get("EMAIL_FILE_PATH"):  # the file-based backend's folder (a test counts the e-mails there)
    EMAIL_FILE_PATH = os.environ["EMAIL_FILE_PATH"]
DEFAULT_FROM_EMAIL = "shop@example.com"

USE_TZ = True
TIME_ZONE = "UTC"
LANGUAGE_CODE = "en-us"
STATIC_URL = "static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {"order_timeout": {"handlers": ["console"], "level": "INFO"}},
}
if os.environ.get("LOGGING_SHOP_ONLY") == "1":
    # A shop that configured its own logger and nothing else (the root has no handler).
    LOGGING["loggers"] = {"shop": {"handlers": ["console"], "level": "INFO"}}
