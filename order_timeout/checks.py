"""System checks: configuration mistakes reported by ``manage.py check``, with a hint each."""

from __future__ import annotations

from typing import Any

from django.conf import settings as django_settings
from django.core import checks
from django.core.exceptions import FieldDoesNotExist, ImproperlyConfigured

from . import get_order_model
from .conf import settings


def _not_a_dict(alias: str, entry: Any) -> checks.Error:
    return checks.Error(
        f"CACHES[{alias!r}] is a {type(entry).__name__}, not a dict of cache settings.",
        hint="Write it out in full, e.g. {'BACKEND': 'django.core.cache.backends.locmem.LocMemCache'} "
             "(a '{...}' copied from documentation is a set holding Ellipsis).",
        id="order_timeout.E010",
    )


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
    if not isinstance(caches[alias], dict):
        return [_not_a_dict(alias, caches[alias])]
    backend = str(caches[alias].get("BACKEND", ""))
    if not backend.startswith("django_redis."):
        return [checks.Error(
            f"CACHES[{alias!r}] uses {backend!r}; the order timeout queue needs django-redis.",
            hint="Use BACKEND 'django_redis.cache.RedisCache' for that alias.",
            id="order_timeout.E002",
        )]
    options = caches[alias].get("OPTIONS", {})
    missing = [name for name in ("SOCKET_CONNECT_TIMEOUT", "SOCKET_TIMEOUT") if name not in options]
    if missing:
        return [checks.Warning(
            f"CACHES[{alias!r}] sets no {' or '.join(missing)}: a Redis that hangs (port open, "
            "no answer) stalls the consumer and the scan until it answers.",
            hint=f"Add to CACHES[{alias!r}]['OPTIONS']: "
                 "'SOCKET_CONNECT_TIMEOUT': 1, 'SOCKET_TIMEOUT': 2 (seconds). Saves are bounded "
                 "by ORDER_TIMEOUT['SCHEDULE_TIMEOUT'] whatever this says.",
            id="order_timeout.W003",
        )]
    return []


@checks.register(checks.Tags.compatibility)
def check_grace(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """The scan's grace must outlast a lease and every retry, or it races the consumer."""
    needed = settings.LEASE_SECONDS + sum(settings.RETRY_DELAYS)
    if settings.COMPENSATION_GRACE >= needed:
        return []
    return [checks.Warning(
        f"ORDER_TIMEOUT['COMPENSATION_GRACE'] is {settings.COMPENSATION_GRACE:g}s, shorter than "
        f"LEASE_SECONDS plus the RETRY_DELAYS ({needed:g}s): when Redis cannot tell it what the "
        "consumers hold, the scan runs the receivers of orders a consumer is still retrying.",
        hint=f"Set COMPENSATION_GRACE to {needed:g} or more.",
        id="order_timeout.W004",
    )]


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


@checks.register(checks.Tags.models)
def check_order_model(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """The order model's status declarations must fit its own status field."""
    try:
        model = get_order_model()
    except ImproperlyConfigured:
        return []  # already raised at start-up, naming the key
    return check_status_declarations(model)


def check_status_declarations(model: Any) -> list[checks.CheckMessage]:
    """What ``check_order_model`` reports for one model (any ``TimeoutOrderMixin`` subclass)."""
    name = model.TIMEOUT_STATUS_FIELD
    try:
        field = model._meta.get_field(name)
    except FieldDoesNotExist:
        return [checks.Error(
            f"{model.__name__}.TIMEOUT_STATUS_FIELD is {name!r}, which is not a field of "
            f"{model._meta.label}.",
            hint="Name the model's own status field in TIMEOUT_STATUS_FIELD.",
            obj=model, id="order_timeout.E004",
        )]
    return [*_declared_values(model, field), *_default_status(model, field), *_index(model)]


def _declared_values(model: Any, field: Any) -> list[checks.CheckMessage]:
    unpaid = tuple(model.TIMEOUT_UNPAID_STATUSES)
    drafts = tuple(model.TIMEOUT_DRAFT_STATUSES)
    declared = {"TIMEOUT_UNPAID_STATUSES": unpaid, "TIMEOUT_PAID_STATUS": (model.TIMEOUT_PAID_STATUS,),
                "TIMEOUT_CLOSED_STATUS": (model.TIMEOUT_CLOSED_STATUS,), "TIMEOUT_DRAFT_STATUSES": drafts}
    errors: list[checks.CheckMessage] = []
    settled = (model.TIMEOUT_PAID_STATUS, model.TIMEOUT_CLOSED_STATUS)
    if not unpaid or isinstance(model.TIMEOUT_UNPAID_STATUSES, str) or \
            isinstance(model.TIMEOUT_DRAFT_STATUSES, str) or \
            model.TIMEOUT_PAID_STATUS in unpaid or model.TIMEOUT_CLOSED_STATUS in unpaid or \
            model.TIMEOUT_PAID_STATUS == model.TIMEOUT_CLOSED_STATUS or \
            any(draft in unpaid or draft in settled for draft in drafts):
        errors.append(checks.Error(
            f"{model.__name__} must declare a tuple of one or more unpaid statuses and a paid and "
            f"a closed status, all different, and draft statuses (a tuple, maybe empty) that are "
            f"none of those; got unpaid={model.TIMEOUT_UNPAID_STATUSES!r}, "
            f"paid={model.TIMEOUT_PAID_STATUS!r}, closed={model.TIMEOUT_CLOSED_STATUS!r}, "
            f"drafts={model.TIMEOUT_DRAFT_STATUSES!r}.",
            hint="For example TIMEOUT_DRAFT_STATUSES = ('Draft',), TIMEOUT_UNPAID_STATUSES = "
                 "('Pending',), TIMEOUT_PAID_STATUS = 'Paid', TIMEOUT_CLOSED_STATUS = 'Cancelled'.",
            obj=model, id="order_timeout.E005",
        ))
    choices = {str(value) for value, _label in field.flatchoices} if field.choices else None
    for attribute, values in declared.items():
        for value in values:
            if choices is not None and str(value) not in choices:
                errors.append(checks.Error(
                    f"{model.__name__}.{attribute} holds {value!r}, which is not among the "
                    f"choices of {model._meta.label}.{field.name}.",
                    hint=f"Use one of {sorted(choices)} or add it to the field's choices.",
                    obj=model, id="order_timeout.E006",
                ))
            max_length = getattr(field, "max_length", None)
            if max_length is not None and len(str(value)) > max_length:
                errors.append(checks.Error(
                    f"{model.__name__}.{attribute} holds {value!r}, longer than the "
                    f"{max_length} characters of {model._meta.label}.{field.name}.",
                    hint="Shorten the value or widen the field.",
                    obj=model, id="order_timeout.E007",
                ))
    return errors


def _default_status(model: Any, field: Any) -> list[checks.CheckMessage]:
    default = field.get_default()
    if default in model.TIMEOUT_UNPAID_STATUSES or default in model.TIMEOUT_DRAFT_STATUSES:
        return []
    return [checks.Warning(
        f"New {model.__name__} orders start in status {default!r}, which is not one of "
        f"TIMEOUT_UNPAID_STATUSES {tuple(model.TIMEOUT_UNPAID_STATUSES)!r}: they are never "
        "scheduled and never closed until they move into an unpaid status.",
        hint="Add the initial status to TIMEOUT_UNPAID_STATUSES (or, if orders start as drafts, "
             "to TIMEOUT_DRAFT_STATUSES), or give the field an unpaid default (a base class "
             "earlier in the MRO may have set this one).",
        obj=model, id="order_timeout.W001",
    )]


def _index(model: Any) -> list[checks.CheckMessage]:
    wanted = [model.TIMEOUT_STATUS_FIELD, "expires_at"]
    if any(list(index.fields[:2]) == wanted for index in model._meta.indexes):
        return []
    return [checks.Warning(
        f"{model._meta.label} has no index on ({', '.join(wanted)}): the compensation scan and "
        "the status command would read the whole table.",
        hint="Combine the Meta classes: class Meta(YourBase.Meta, TimeoutOrderMixin.Meta), and "
             "if your Meta sets indexes, add *TimeoutOrderMixin.Meta.indexes to them.",
        obj=model, id="order_timeout.W002",
    )]


@checks.register(checks.Tags.caches)
def check_dedicated_alias(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """The queue must not sit where the shop's ``cache`` API writes: ``cache.clear()`` would wipe it."""
    from django.core.cache import DEFAULT_CACHE_ALIAS

    alias = settings.REDIS_ALIAS
    caches = django_settings.CACHES
    if alias not in caches or not isinstance(caches[alias], dict):
        return []  # check_redis_alias reports it
    default = caches.get(DEFAULT_CACHE_ALIAS)
    if alias != DEFAULT_CACHE_ALIAS and default is not None and not isinstance(default, dict):
        return [_not_a_dict(DEFAULT_CACHE_ALIAS, default)]
    shared = alias == DEFAULT_CACHE_ALIAS or (
        DEFAULT_CACHE_ALIAS in caches
        and caches[DEFAULT_CACHE_ALIAS].get("LOCATION") == caches[alias].get("LOCATION"))
    if not shared:
        return []
    return [checks.Warning(
        f"ORDER_TIMEOUT['REDIS_ALIAS'] is {alias!r}, the Redis database the shop's cache "
        "(django.core.cache.cache) writes to: any cache.clear() wipes every pending deadline.",
        hint="Give the queue a cache alias of its own, on a Redis database of its own, e.g. "
             "CACHES['order_timeout'] = {..., 'LOCATION': 'redis://host:6379/1'} and "
             "ORDER_TIMEOUT = {'REDIS_ALIAS': 'order_timeout'}.",
        id="order_timeout.W005",
    )]


# Redis 6.2: ZADD LT/GT and ZMSCORE.
MIN_REDIS = (6, 2)


@checks.register(checks.Tags.caches, deploy=True)
def check_redis_server(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``manage.py check --deploy``: the queue's Redis itself (version, eviction, persistence)."""
    from .exceptions import QueueUnavailable
    from .queue import TimeoutQueue, redis_errors

    try:
        with redis_errors("answer"):
            client = TimeoutQueue.from_settings().client
            server = _one_node(client.info("server"))
            memory = _one_node(client.info("memory"))
            persistence = _one_node(client.info("persistence"))
            saving = _one_node(client.config_get("save")).get("save", "")
    except (QueueUnavailable, ImproperlyConfigured) as exc:
        return [checks.Warning(f"Could not check the queue's Redis: {exc}",
                               hint="Run the deploy checks where Redis answers.",
                               id="order_timeout.W008")]
    messages = version_messages(str(server["redis_version"]))
    policy = memory.get("maxmemory_policy", "noeviction")
    if policy != "noeviction":
        messages.append(checks.Warning(
            f"The queue's Redis evicts keys (maxmemory-policy {policy}): an evicted member is an "
            "order that closes late, by the compensation scan.",
            hint="Set maxmemory-policy noeviction, or give the queue a Redis of its own.",
            id="order_timeout.W006"))
    if not int(persistence.get("aof_enabled", 0)) and not saving:
        messages.append(checks.Warning(
            "The queue's Redis persists nothing (no AOF, no RDB saves): a restart loses every "
            "pending deadline until the beat task and the scan put them back (minutes).",
            hint="Turn on AOF (appendonly yes), or accept the delay after a restart.",
            id="order_timeout.W007"))
    return messages


def version_messages(version: str) -> list[checks.CheckMessage]:
    """An error for a Redis older than the app needs."""
    if tuple(int(part) for part in version.split(".")[:2]) >= MIN_REDIS:
        return []
    return [checks.Error(f"The queue's Redis is {version}; the app needs 6.2 or later "
                         "(ZADD LT, ZMSCORE).", hint="Upgrade Redis.", id="order_timeout.E008")]


def _one_node(reply: Any) -> Any:
    """A Cluster answers INFO/CONFIG per node; the first node stands for all."""
    if isinstance(reply, dict) and reply and all(isinstance(v, dict) for v in reply.values()) \
            and not {"redis_version", "maxmemory_policy", "aof_enabled", "save"} & set(reply):
        return next(iter(reply.values()))
    return reply


@checks.register(checks.Tags.database)
def check_database_features(app_configs: Any = None, databases: Any = None, deploy: bool = False,
                            **kwargs: Any) -> list[checks.CheckMessage]:
    """The order model's database must skip locked rows (``migrate``, ``check --database``,
    ``check --deploy``): without SKIP LOCKED one row locked elsewhere holds its whole batch."""
    from django.db import connections, router

    try:
        alias = router.db_for_write(get_order_model())
    except ImproperlyConfigured:
        return []
    if not deploy and alias not in (databases or ()):
        return []
    connection = connections[alias]
    if connection.features.has_select_for_update_skip_locked:
        return []
    version = ".".join(map(str, getattr(connection, "mysql_version", ()) or ())) or "this version"
    return [checks.Error(
        f"The order model's database ({connection.display_name} {version}, alias {alias!r}) has no "
        "SELECT ... FOR UPDATE SKIP LOCKED: a row locked by another transaction would hold the "
        "consumer's whole batch until the lock wait times out.",
        hint="Use MariaDB 10.6 or later, MySQL 8.0.1 or later, or PostgreSQL 15 or later.",
        id="order_timeout.E011",
    )]


@checks.register(checks.Tags.database, deploy=True)
def check_database_features_on_deploy(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``check --deploy`` asks the database too, as it asks Redis (once: with ``--database``
    the check above has answered)."""
    return [] if kwargs.get("databases") else check_database_features(deploy=True)
