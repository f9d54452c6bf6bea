"""System checks: configuration mistakes reported by ``manage.py check``, with a hint each."""

from __future__ import annotations

from typing import Any

from django.conf import settings as django_settings
from django.core import checks

from .conf import settings


@checks.register(checks.Tags.compatibility)
def check_redis_alias(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    alias = settings.REDIS_ALIAS
    caches = django_settings.CACHES
    if alias not in caches:
        return [checks.Error(
            f"ORDER_TIMEOUT['REDIS_ALIAS'] is {alias!r}, which is not a key of CACHES.",
            hint="Add a django-redis cache under that alias, or point REDIS_ALIAS at one.",
            id="order_timeout.E001",
        )]
    backend = caches[alias].get("BACKEND", "")
    if not backend.startswith("django_redis."):
        return [checks.Error(
            f"CACHES[{alias!r}] uses {backend!r}; the order timeout queue needs django-redis.",
            hint="Use BACKEND 'django_redis.cache.RedisCache' for that alias.",
            id="order_timeout.E002",
        )]
    return []


@checks.register(checks.Tags.compatibility)
def check_use_tz(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    if not django_settings.USE_TZ:
        return [checks.Error(
            "order_timeout needs USE_TZ = True: deadlines are instants shared by "
            "every host, and naive datetimes are not.",
            hint="Set USE_TZ = True.",
            id="order_timeout.E003",
        )]
    return []
