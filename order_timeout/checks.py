"""System checks: configuration mistakes reported by ``manage.py check``, with a hint each."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from django.conf import settings as django_settings
from django.core import checks
from django.core.exceptions import FieldDoesNotExist, ImproperlyConfigured
from django.db import models

from .conf import settings
from .ordermodel import get_order_model
from .redaction import masked

# Every check of this app also carries this tag, so ``check --deploy --tag order_timeout``
# asks only what this app needs (the queue's Redis, the database), whatever else the
# project's deploy checks would report (Django 6.1 errors on a development mailer).
TAG = "order_timeout"


def _not_a_dict(alias: str, entry: Any) -> checks.Error:
    return checks.Error(
        f"CACHES[{alias!r}] is a {type(entry).__name__}, not a dict of cache settings.",
        hint="Write it out in full, e.g. {'BACKEND': 'django.core.cache.backends.locmem.LocMemCache'} "
             "(a '{...}' copied from documentation is a set holding Ellipsis).",
        id="order_timeout.E012",
    )


@checks.register(checks.Tags.compatibility, TAG)
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


@checks.register(checks.Tags.compatibility, TAG)
def check_grace(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """The scan's grace must outlast a batch in hand and every retry, or it races the consumer."""
    needed = settings.longest_in_hand() + sum(settings.RETRY_DELAYS)
    if settings.COMPENSATION_GRACE >= needed:
        return []
    return [checks.Warning(
        f"ORDER_TIMEOUT['COMPENSATION_GRACE'] is {settings.COMPENSATION_GRACE:g}s, shorter than "
        f"the longer of BATCH_TIME_LIMIT and LEASE_SECONDS plus the RETRY_DELAYS ({needed:g}s): "
        "when Redis cannot tell it what the consumers hold, the scan runs the receivers of orders a "
        "consumer is still retrying.",
        hint=f"Set COMPENSATION_GRACE to {needed:g} or more.",
        id="order_timeout.W004",
    )]


@checks.register(checks.Tags.compatibility, TAG)
def check_heartbeat(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """A heartbeat that outlasts the lease tells nothing the lease does not."""
    if settings.HEARTBEAT_SECONDS < settings.LEASE_SECONDS:
        return []
    return [checks.Warning(
        f"ORDER_TIMEOUT['HEARTBEAT_SECONDS'] is {settings.HEARTBEAT_SECONDS:g}s, not shorter than "
        f"LEASE_SECONDS ({settings.LEASE_SECONDS:g}s): a dead consumer's batch waits out its lease "
        "before anyone takes it over, as if there were no heartbeat.",
        hint="Keep HEARTBEAT_SECONDS a few seconds (the default is 1.5); the longest a batch may "
             "run is BATCH_TIME_LIMIT.",
        id="order_timeout.W013",
    )]


@checks.register(checks.Tags.compatibility, TAG)
def check_use_tz(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    if not django_settings.USE_TZ:
        return [checks.Error(
            "order_timeout needs USE_TZ = True: deadlines are instants shared by "
            "every host, and naive datetimes are not.",
            hint="Set USE_TZ = True.",
            id="order_timeout.E003",
        )]
    return []


@checks.register(checks.Tags.models, TAG)
def check_order_model(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """The order model's status declarations must fit its own status field."""
    try:
        model = get_order_model()
    except ImproperlyConfigured:
        return []  # already raised at start-up, naming the key
    return check_status_declarations(model)


@checks.register(checks.Tags.compatibility, TAG)
def check_notice_handlers(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """A notice handler's timeout must end well inside BATCH_TIME_LIMIT: a batch of notices is given
    up (and its consumer exits 75) when it is still in hand that long after its claim."""
    from .notices.registry import handlers

    limit = settings.batch_time_limit()
    longest = limit / 2
    return [checks.Warning(
        f"Notice handler {name!r} has a timeout of {handlers.get(name).timeout:g} s, more than half of "
        f"BATCH_TIME_LIMIT ({limit:g} s): one slow delivery would cost its batch its time "
        "(given up, its consumer exiting 75) before its own timeout ends it.",
        hint=f"Give it a timeout of at most {longest:g} s (notices.handler(..., timeout=...)), or raise "
             "BATCH_TIME_LIMIT.",
        id="order_timeout.W012") for name in handlers.names() if handlers.get(name).timeout > longest]


@checks.register(checks.Tags.models, TAG)
def check_order_table(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """The app's own order model, as ORDER_MODEL, needs the table that ``WithoutOrderTable`` keeps
    from migrate: every close would fail on a missing table."""
    from django.db import router

    from .models import Order
    from .routers import migrates_order_table

    if settings.ORDER_MODEL is None or settings.ORDER_MODEL.lower() != Order._meta.label_lower \
            or migrates_order_table(router.db_for_write(Order)):
        return []
    return [checks.Error(
        "ORDER_TIMEOUT['ORDER_MODEL'] is 'order_timeout.Order', but DATABASE_ROUTERS keep its table "
        "from migrate (order_timeout.routers.WithoutOrderTable).",
        hint="Set ORDER_MODEL to None (no order close: your timers only), or drop the router.",
        id="order_timeout.E019")]


@checks.register(checks.Tags.models, TAG)
def check_conditions(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """HOLD_CONDITION and SETTLED_CONDITION must compile against the order model: a mistake here
    would fail every due order."""
    from .db.locks import validate_conditions

    if not settings.closes_orders():
        return []  # no order close: nothing reads these conditions (the settings refuse them)
    try:
        model = get_order_model()
        validate_conditions(model)
    except ImproperlyConfigured as exc:
        return [checks.Error(
            str(exc),
            hint="A Q over the order model's own fields and relations, e.g. "
                 "Q(payments__state='pending'), or the dotted path of a callable returning one. "
                 "Consumers refuse to start until it fits.",
            id="order_timeout.E013")]
    return []


@checks.register(checks.Tags.models, TAG)
def check_close_fields(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Each field CLOSE_FIELDS names must exist on the order model and hold what it gets: a close
    that writes a wrong column would fail every due order."""
    try:
        model = get_order_model()
    except ImproperlyConfigured:
        return []
    return close_field_messages(model)


def close_field_messages(model: Any) -> list[checks.CheckMessage]:
    """What ``check_close_fields`` reports for ``model``."""
    from .models import HOLD_EXPIRED_REASON, TIMEOUT_REASON

    longest_reason = max(len(TIMEOUT_REASON), len(HOLD_EXPIRED_REASON))
    written = {model.TIMEOUT_STATUS_FIELD, "closed_at", "close_reason"}
    messages: list[checks.CheckMessage] = []
    for name, what in settings.CLOSE_FIELDS.items():
        problem = None
        try:
            field = model._meta.get_field(name)
        except FieldDoesNotExist:
            problem = f"is not a field of {model._meta.label}"
        else:
            if name in written or not getattr(field, "concrete", False) or field.primary_key:
                problem = "is written by the close already, or is not a column the close may write"
            elif what == "time" and not isinstance(field, models.DateTimeField):
                problem = f"gets the close's time but is not a DateTimeField ({type(field).__name__})"
            elif what == "reason" and not isinstance(field, (models.CharField, models.TextField)):
                problem = f"gets the close's reason but is not a text field ({type(field).__name__})"
            elif what == "reason" and isinstance(field, models.CharField) and field.max_length is not None \
                    and field.max_length < longest_reason:
                problem = f"gets the close's reason but holds {field.max_length} characters, not {longest_reason}"
        if problem:
            messages.append(checks.Error(
                f"ORDER_TIMEOUT['CLOSE_FIELDS'] names {name!r}, which {problem}.",
                hint="Name the order model's own columns: a DateTimeField for 'time' (Saleor's "
                     "{'expired_at': 'time'}), a CharField or TextField for 'reason'.",
                obj=model, id="order_timeout.E018"))
    return messages


@checks.register(checks.Tags.models, TAG)
def check_order_key(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    try:
        model = get_order_model()
    except ImproperlyConfigured:
        return []
    return check_key_fits(model)


# The longest text of each kind of key (an integer's sign and 19 digits, a UUID's 36).
_KEY_LENGTHS = {"AutoField": 20, "BigAutoField": 20, "SmallAutoField": 6, "IntegerField": 11,
                "BigIntegerField": 20, "SmallIntegerField": 6, "PositiveIntegerField": 10,
                "PositiveBigIntegerField": 20, "PositiveSmallIntegerField": 5, "UUIDField": 36}


def check_key_fits(model: Any, whose: str = "the order model") -> list[checks.CheckMessage]:
    """The order's key, as text, must fit the columns that record it: a dead letter's or a
    reminder's ``order_id``. One that does not fails its INSERT, and a failing close would be
    tried again every retry delay for ever instead of becoming a dead letter."""
    from .models import DeadLetter, Reminder

    room: int = min(field.max_length or 0 for field in (DeadLetter._meta.get_field("order_id"),
                                                        Reminder._meta.get_field("order_id")))
    key = model._meta.pk
    longest: int | None = _KEY_LENGTHS.get(key.get_internal_type(), getattr(key, "max_length", None))
    if longest is not None and longest <= room:
        return []
    size = "of unbounded length" if longest is None else f"up to {longest} characters long"
    return [checks.Error(
        f"{model._meta.label}'s primary key {key.name!r} ({type(key).__name__}) is {size} as text; "
        f"dead letters and reminders record it in {room} characters.",
        hint=f"Give {whose} a primary key that fits in {room} characters (an integer, a UUID, "
             f"a CharField of max_length <= {room}).",
        obj=model, id="order_timeout.E015")]


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
    declared = _declared_values(model, field)
    # The default's warning reads the declarations: only once they are sound.
    return [*declared, *([] if declared else _default_status(model, field)), *_index(model)]


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
    """A new order born paid or closed is a mistake; born in any other status it is scheduled
    when it enters an unpaid status (a row never scheduled may, from any status)."""
    default = field.get_default()
    if default not in (model.TIMEOUT_PAID_STATUS, model.TIMEOUT_CLOSED_STATUS):
        return []
    return [checks.Warning(
        f"New {model.__name__} orders start in status {default!r}, the "
        f"{'paid' if default == model.TIMEOUT_PAID_STATUS else 'closed'} value: they are never scheduled, "
        "and look paid or closed before anyone paid or closed them.",
        hint="Give the field an unpaid default (TIMEOUT_UNPAID_STATUSES) or a status of its own before "
             "payment (a base class earlier in the MRO may have set this one).",
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


@checks.register(checks.Tags.caches, TAG)
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


@checks.register(TAG, deploy=True)
def check_not_testing_without_redis(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``manage.py check --deploy``: TESTING_WITHOUT_REDIS is for a test suite only. Not told by DEBUG:
    Django runs tests with DEBUG off."""
    if not settings.TESTING_WITHOUT_REDIS:
        return []
    return [checks.Error(
        "ORDER_TIMEOUT['TESTING_WITHOUT_REDIS'] is on: saves do not reach Redis and no consumer is told of "
        "a deadline; only order_timeout.testing's runner acts, in tests.",
        hint="Set it in your test settings only (docs/testing.md), never where orders are taken.",
        id="order_timeout.E020")]


@checks.register(checks.Tags.caches, TAG, deploy=True)
def check_redis_server(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``manage.py check --deploy``: the queue's Redis itself (version, eviction, persistence)."""
    from .exceptions import QueueUnavailable
    from .queue import TimeoutQueue, redis_errors

    try:
        with redis_errors("answer"):
            facts = _ServerFacts(TimeoutQueue.from_settings())
    except (QueueUnavailable, ImproperlyConfigured) as exc:
        return [checks.Warning(f"Could not check the queue's Redis: {masked(exc)}",
                               hint="Run the deploy checks where Redis answers.",
                               id="order_timeout.W008")]
    memory, persistence, saving = facts.memory, facts.persistence, facts.saving
    messages = [*facts.unchecked()]
    if facts.version:
        messages += version_messages(facts.version)
    policy = memory.get("maxmemory_policy", "noeviction")
    if policy != "noeviction":
        messages.append(checks.Warning(
            f"The queue's Redis evicts keys (maxmemory-policy {policy}): an evicted member is an "
            "order that closes late, by the compensation scan.",
            hint="Set maxmemory-policy noeviction, or give the queue a Redis of its own.",
            id="order_timeout.W006"))
    if persistence and not int(persistence.get("aof_enabled", 0)) and saving == "":
        messages.append(checks.Warning(
            "The queue's Redis persists nothing (no AOF, no RDB saves): a restart loses every "
            "pending deadline until the beat task and the scan put them back (minutes).",
            hint="Turn on AOF (appendonly yes), or accept the delay after a restart.",
            id="order_timeout.W007"))
    return messages


class _ServerFacts:
    """What ``check_redis_server`` reads from the queue's Redis, and what its user may not read.

    INFO and CONFIG are in ACL's ``@dangerous`` category, often refused to an
    application's user: the version then comes from a script, and what stays
    unknown is reported (``W008``) instead of failing the whole check.
    """

    def __init__(self, queue: Any) -> None:
        self.refused: list[str] = []
        client = queue.client
        server = self._read("INFO", lambda: _one_node(client.info("server")))
        self.memory: dict[str, Any] = self._read("INFO", lambda: _one_node(client.info("memory"))) or {}
        self.persistence: dict[str, Any] = self._read(
            "INFO", lambda: _one_node(client.info("persistence"))) or {}
        saving = self._read("CONFIG GET", lambda: _one_node(client.config_get("save")))
        # None: unknown (CONFIG refused); "" means no RDB snapshots.
        self.saving: str | None = None if saving is None else saving.get("save", "")
        self.version: str | None = (str(server["redis_version"]) if server
                                    else self._read("EVALSHA", lambda: self._scripts_version(queue)))

    def _read(self, command: str, read: Any) -> Any:
        from redis.exceptions import NoPermissionError

        try:
            return read()
        except NoPermissionError:
            if command not in self.refused:
                self.refused.append(command)
            return None

    def _scripts_version(self, queue: Any) -> str | None:
        """The version as a script sees it: exact on Redis 7 and later, unknown before."""
        from .queue.probes import version_num, version_text

        number = version_num(queue.client, queue.shards[0].keys.probe)
        return version_text(number) if number else None

    def unchecked(self) -> list[checks.CheckMessage]:
        subjects = [subject for subject, known in (
            ("its version", self.version is not None), ("whether it evicts keys", bool(self.memory)),
            ("whether it persists its data", bool(self.persistence) and (
                self.saving is not None or int(self.persistence.get("aof_enabled", 0))))) if not known]
        if not subjects:
            return []
        listed = " or ".join([", ".join(subjects[:-1]), subjects[-1]] if len(subjects) > 1 else subjects)
        return [checks.Warning(
            f"Could not check {listed}: the queue's Redis user may not run "
            f"{' or '.join(self.refused)}.",
            hint="Run check --deploy with a Redis user that may (INFO and CONFIG are @dangerous "
                 "commands, rightly refused to the app's own user), or check by hand: "
                 "maxmemory-policy noeviction, appendonly yes or RDB saves, Redis 6.2 or later.",
            id="order_timeout.W008")]


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


@checks.register(checks.Tags.database, TAG)
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


@checks.register(checks.Tags.database, TAG, deploy=True)
def check_database_features_on_deploy(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``check --deploy`` asks the database too, as it asks Redis (once: with ``--database``
    the check above has answered)."""
    return [] if kwargs.get("databases") else check_database_features(deploy=True)


@checks.register(checks.Tags.caches, TAG, deploy=True)
def check_redis_permissions(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``manage.py check --deploy``: every command the app sends, tried as the queue's Redis user."""
    from .exceptions import QueueUnavailable
    from .queue import TimeoutQueue, redis_errors
    from .queue.probes import refused_commands

    try:
        with redis_errors("answer"):
            refusals = refused_commands(TimeoutQueue.from_settings())
    except (QueueUnavailable, ImproperlyConfigured):
        return []  # check_redis_server says it could not reach Redis (W008)
    if not refusals:
        return []
    parts, grants = [], []
    # The queue's keys and channels: "{prefix" then anything (the prefix itself holds no brace, but
    # the pattern does, so nothing here goes through str.format).
    pattern = "{" + settings.KEY_PREFIX + "*"
    saying: dict[str, Callable[[str], str]] = {
        "command": lambda names: f"run {names}",
        "keys": lambda names: f"touch the queue's keys ({pattern}, with {names})",
        "channels": lambda names: f"use the queue's channels ({pattern}, with {names})",
    }
    for refused, says in saying.items():
        names = sorted({refusal.command for refusal in refusals if refusal.refused == refused},
                       key=lambda name: (name != "select", name))  # SELECT first: it hides the rest
        if names:
            parts.append(says(", ".join(name.upper() for name in names)))
            grants += ([f"+{name}" for name in names] if refused == "command"
                       else [("~" if refused == "keys" else "&") + pattern])
    return [checks.Warning(
        f"The queue's Redis user may not {'; nor '.join(parts)} (its ACL rules refuse them): the app "
        "sends them, and fails where they are refused (a save, a claim, the wake-ups).",
        hint=f"Grant them: ACL SETUSER <user> {' '.join(grants)} (docs/operations.md shows the least "
             "rule the app needs).",
        id="order_timeout.W009")]


@checks.register(checks.Tags.caches, TAG)
def check_cluster_location(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """A cluster's seeds must parse and agree, or every save would find out (and the consumer not start)."""
    from .redis_cluster import seed_nodes

    entry = django_settings.CACHES.get(settings.REDIS_ALIAS)
    if not isinstance(entry, dict) or not _uses_cluster_factory(entry.get("OPTIONS") or {}):
        return []
    try:
        seed_nodes(entry.get("LOCATION", ""))
    except ImproperlyConfigured as exc:
        return [checks.Error(
            masked(exc),
            hint="List every seed as redis://host:port (or rediss://), each with the same "
                 "credentials and options, or put the credentials in OPTIONS (USERNAME, PASSWORD).",
            id="order_timeout.E014")]
    return []


# django-redis passes OPTIONS["USERNAME"] to Redis from this version on.
DJANGO_REDIS_USERNAME = (7, 0)


@checks.register(checks.Tags.compatibility, TAG)
def check_client_libraries(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """The installed redis-py and django-redis must do what the queue's alias asks of them.

    The app itself needs an older redis-py than a cluster does (pyproject.toml
    says the first, ``redis_cluster.MIN_REDIS_PY`` the second).
    """
    import django_redis
    import redis

    entry = django_settings.CACHES.get(settings.REDIS_ALIAS)
    if not isinstance(entry, dict):
        return []  # check_redis_alias reports it (E001)
    options = entry.get("OPTIONS") or {}
    return [*cluster_library_messages(options, redis.__version__),
            *username_messages(options, tuple(django_redis.VERSION))]


def _version(text: str) -> tuple[int, ...]:
    """'8.1.0' -> (8, 1, 0); a pre-release's letters are dropped ('8.1.0b1' -> (8, 1, 0))."""
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def _uses_cluster_factory(options: dict[str, Any]) -> bool:
    from django.utils.module_loading import import_string

    from .redis_cluster import ClusterConnectionFactory

    try:
        factory = import_string(options.get("CONNECTION_FACTORY") or "django_redis.pool.ConnectionFactory")
    except ImportError:
        return False  # django-redis says so itself when it builds the cache
    return isinstance(factory, type) and issubclass(factory, ClusterConnectionFactory)


def cluster_library_messages(options: dict[str, Any], redis_py: str) -> list[checks.CheckMessage]:
    """An error when the queue's alias is a Redis Cluster and redis-py is older than cluster mode needs."""
    from .redis_cluster import MIN_REDIS_PY

    if not _uses_cluster_factory(options) or _version(redis_py) >= _version(MIN_REDIS_PY):
        return []
    return [checks.Error(
        f"The queue's cache alias is a Redis Cluster (ClusterConnectionFactory) and redis-py is "
        f"{redis_py}; cluster mode needs {MIN_REDIS_PY} or later: older versions drop every sharded "
        "pub/sub message on a cluster (the wake-ups never arrive).",
        hint=f"pip install 'redis[hiredis]>={MIN_REDIS_PY}' (a standalone Redis or Sentinel works "
             "with the older redis-py pyproject.toml allows).",
        id="order_timeout.E009")]


def username_messages(options: dict[str, Any], django_redis: tuple[int, ...]) -> list[checks.CheckMessage]:
    """An error when OPTIONS names an ACL user that the installed django-redis would not send."""
    if "USERNAME" not in options or django_redis[:2] >= DJANGO_REDIS_USERNAME or _uses_cluster_factory(options):
        return []  # (the cluster factory reads USERNAME itself)
    installed = ".".join(str(part) for part in django_redis)
    return [checks.Error(
        f"CACHES[{settings.REDIS_ALIAS!r}]['OPTIONS'] sets USERNAME, which django-redis {installed} "
        "ignores (7.0 is the first to send it): the queue would log in as the default user.",
        hint="Put the user in LOCATION instead (redis://user:password@host:6379/1), or upgrade "
             "django-redis to 7.0 or later.",
        id="order_timeout.E010")]


@checks.register(checks.Tags.compatibility, TAG)
def check_database_pooling(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Transaction pooling needs transaction-scoped limits (PostgreSQL's SET LOCAL), and Django
    told that a server-side cursor cannot outlive its transaction there."""
    from django.db import connections, router

    if settings.DATABASE_POOLING != "transaction":
        return []
    try:
        alias = router.db_for_write(get_order_model())
    except ImproperlyConfigured:
        return []
    connection = connections[alias]
    if connection.vendor == "mysql":
        return [checks.Error(
            f"ORDER_TIMEOUT['DATABASE_POOLING'] is 'transaction', but the order model's database "
            f"(alias {alias!r}) is MySQL or MariaDB, which cannot limit one transaction only (no "
            "SET LOCAL): the limits would leak to the pool's other clients, or be missing.",
            hint="Use 'session'. A pooler in front of MySQL or MariaDB must keep each client's "
                 "session variables (docs/operations.md, \"Connection poolers\").",
            id="order_timeout.E016")]
    if connection.vendor == "postgresql" and not connection.settings_dict.get("DISABLE_SERVER_SIDE_CURSORS"):
        return [checks.Warning(
            f"ORDER_TIMEOUT['DATABASE_POOLING'] is 'transaction', but DATABASES[{alias!r}] does not "
            "set DISABLE_SERVER_SIDE_CURSORS: through a transaction pooler a server-side cursor "
            "(QuerySet.iterator(), in a receiver say) is looked for on whichever server "
            "connection serves the next fetch, and is not there.",
            hint=f"Set DATABASES[{alias!r}]['DISABLE_SERVER_SIDE_CURSORS'] = True.",
            id="order_timeout.W010")]
    return []


@checks.register(checks.Tags.models, TAG)
def check_timers(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Each declared timer's conditions must compile against its model, its key fit the records,
    and its deadlines be walkable by an index (registration checked the rest, at start-up)."""
    from .timers.registry import registry

    messages: list[checks.CheckMessage] = []
    for timer in registry.declared():
        messages += timer_messages(timer)
    return messages


def timer_messages(timer: Any) -> list[checks.CheckMessage]:
    """What ``check_timers`` reports for one declared timer."""
    from .db.locks import compiles

    model, where = timer.model, f"timer {timer.name!r} ({type(timer).__qualname__})"
    messages: list[checks.CheckMessage] = []
    for attribute in ("pending", "hold", "settled"):
        condition = getattr(timer, attribute, None)
        problem = None if condition is None else compiles(model, condition)
        if problem:
            messages.append(checks.Error(
                f"{where}.{attribute} does not fit {model._meta.label}: {problem}",
                hint="A Q over the model's own fields and relations; consumers would fail every due row.",
                obj=model, id="order_timeout.E017"))
    for message in check_key_fits(model, whose=model._meta.label):
        messages.append(checks.Error(f"{where}: {message.msg}", hint=message.hint, obj=model,
                                     id="order_timeout.E017"))
    if timer.deadline is not None and not any(
            timer.deadline in list(index.fields)[:2] for index in model._meta.indexes) and \
            not model._meta.get_field(timer.deadline).db_index:
        messages.append(checks.Warning(
            f"{model._meta.label} has no index on {timer.deadline!r} (alone, or second after the field its "
            f"pending condition reads): the compensation scan and the status command of {where} would read "
            "the whole table.",
            hint=f"Add models.Index(fields=[<its status field>, {timer.deadline!r}]) to the model's Meta.indexes, "
                 f"or db_index=True on {timer.deadline!r}.",
            obj=model, id="order_timeout.W011"))
    return messages
