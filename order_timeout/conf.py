"""The one place the ``ORDER_TIMEOUT`` setting is read.

Values are read lazily (never at import time) and validated as a whole, so a
typo or a bad value raises ``ImproperlyConfigured`` naming the key instead of
misbehaving at 3 a.m. ``override_settings(ORDER_TIMEOUT=...)`` is honoured:
the cache is dropped whenever Django reports the setting changed.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.db.models import Q
from django.utils.module_loading import import_string

SETTING_NAME = "ORDER_TIMEOUT"

DEFAULTS: dict[str, Any] = {
    # Alias in CACHES of the django-redis cache whose connection holds the queue.
    "REDIS_ALIAS": "default",
    # Prefix of every Redis key, and the start of each shard's {hash tag}.
    # Two shops sharing a Redis pick two.
    "KEY_PREFIX": "order_timeout",
    # Shards of the queue: each has its own hash tag, so a Redis Cluster spreads
    # them over its masters. Change it with order_timeout_reshard.
    "SHARDS": 1,
    # Seconds from creation to the payment deadline of a new order.
    "DEFAULT_TIMEOUT": 1800,
    # Most members one claim takes; bounds how long one script call holds Redis.
    "BATCH_SIZE": 200,
    # Seconds a claimed member stays leased, unrenewed, before another consumer may take it over
    # though its holder's heartbeat cannot be read (a consumer of 0.2, a heartbeat key lost): the
    # fallback liveness. A live consumer renews it every third of this while its batch runs.
    "LEASE_SECONDS": 30,
    # Seconds a batch may run from its claim: its transaction cannot hold row locks much longer
    # (the consumer's database session times out, and a batch still running then is given up,
    # its consumer exiting 75 if a receiver is stuck outside the database). The same bound for
    # the compensation scan's chunks and the admin's close-now. None: LEASE_SECONDS.
    "BATCH_TIME_LIMIT": None,
    # Seconds a running consumer is presumed alive after its last heartbeat (it beats every
    # third of this). Once they pass, its batches are handed to the next claims at once: a
    # SIGKILLed or frozen consumer costs about this much, not LEASE_SECONDS. Longer than any
    # pause a live process makes (a GC, a busy CPU): a live consumer taken for dead loses its
    # batch's work to the row re-check, never a close.
    "HEARTBEAT_SECONDS": 1.5,
    # A dead consumer's batch is taken over whole; a member taken over before is taken over
    # alone, so whatever kills its holders stalls only itself. Taken over more than this many
    # times, its last holder dead with it alone, it becomes a dead letter, untried.
    "MAX_TAKEOVERS": 3,
    # Longest idle sleep of the consumer, in seconds: bounds how late it notices
    # a deadline added by another process while it sleeps.
    "MAX_WAIT": 1.0,
    # Seconds a sleeping consumer waits past the deadline it wakes for, so the
    # deadlines right behind it close in the same batch: fewer database
    # statements per close under a steady stream, for at most this much lateness.
    "BATCH_WINDOW": 0.003,
    # "app_label.ModelName" of the order model, a subclass of TimeoutOrderMixin. None: the
    # project has no order close of the app's (a framework's order, declared as a timer from
    # outside): no order section in the reports, no query of the app's order table.
    "ORDER_MODEL": "order_timeout.Order",
    # Seconds one Redis round trip may take when a save schedules its order
    # (after commit, in the request): a hung Redis costs a request at most
    # about three of these, then the save goes on and the scan catches up.
    "SCHEDULE_TIMEOUT": 0.1,
    # Seconds to wait before each retry of an order whose close failed; after
    # the last one, the order becomes a dead letter (seed 002: 10 s, 30 s, 60 s).
    "RETRY_DELAYS": [10, 30, 60],
    # Seconds before each retry of a notice whose delivery failed (an SMTP server down, a
    # webhook answering 503); after the last one it becomes a dead letter. Longer than the
    # closes': the outside world takes minutes to come back, and a notice late is better than
    # one given up (about 2.5 hours in all).
    "NOTICE_RETRY_DELAYS": [10, 60, 300, 1800, 7200],
    # The compensation scan closes unpaid orders overdue by more than this many
    # seconds, and only those Redis shows no consumer handling for this long:
    # longer than LEASE_SECONDS plus the sum of RETRY_DELAYS (check W004).
    "COMPENSATION_GRACE": 150,
    # Seconds between two compensation scans for the whole fleet: the consumers take turns at it
    # (scans/turns.py), and the Celery beat entry, if run, takes the same turns.
    "COMPENSATION_INTERVAL": 300,
    # Orders the scan reads, locks and closes per transaction.
    "COMPENSATION_CHUNK": 500,
    # Seconds the scan's (and the prune's) Redis lock lives without being renewed (it is renewed
    # before every chunk), so a crashed or frozen runner never blocks the next for long.
    "COMPENSATION_LOCK_SECONDS": 60,
    # Seconds between two scans that read every overdue row from the oldest. The scans between
    # start where the last one left nothing but open dead letters behind, so the rows staff have
    # not decided on yet are not read again every COMPENSATION_INTERVAL.
    "COMPENSATION_FULL_INTERVAL": 86400,
    # Retention: what the app wrote and no longer needs is deleted this many seconds after it was
    # done with (the prune, order_timeout_prune). None: kept for ever.
    # A delivered notice, from its delivery; a dropped one, from when it was due.
    "NOTICE_RETENTION": 7 * 86400,
    # A reminder's record, from the deadline it was for (past it, no reminder is ever sent).
    "REMINDER_RETENTION": 7 * 86400,
    # A dead letter staff resolved (requeued, closed, dropped), from its resolution. Open ones stay.
    "DEAD_LETTER_RETENTION": 30 * 86400,
    # Seconds between two prunes run by the fleet's housekeeping (the consumers', the beat task's).
    # None: neither prunes (run order_timeout_prune yourself, from cron).
    "PRUNE_INTERVAL": 3600,
    # Rows one DELETE of the prune removes (a short transaction of its own each).
    "PRUNE_CHUNK": 1000,
    # Seconds after a resume within which a deadline still gets the pause's length back with
    # ``order_timeout_resume --give-back`` (beside those that fell inside the pause): a customer due
    # just after the outage had no more time to pay than one due during it.
    "GIVE_BACK_GRACE": 600,
    # A bearer token that lets a scraper read views.metrics without a login
    # ("Authorization: Bearer <token>"). None: only logged-in users with the
    # view_timeoutoverview permission may read it.
    "METRICS_TOKEN": None,
    # Whether a dead letter stores the whole traceback of its order's last
    # error, for anyone who may view dead letters to read. False: only the
    # "Type: message" line (the consumer's log keeps the traceback).
    "DEAD_LETTER_TRACEBACKS": False,
    # For a test suite run where no Redis is: saves do not try to reach Redis, and
    # order_timeout.testing's runner finds what is due from the rows (docs/testing.md). Never in
    # production, where nothing would close an order: ``check --deploy`` fails while it is on.
    "TESTING_WITHOUT_REDIS": False,
    # A payment in flight holds its order past the deadline: a Q over the order
    # model (Q(payments__state="pending")), or the dotted path of a callable
    # returning one. Evaluated in the closing transaction's locking SELECT; an
    # order that matches it at its deadline is held, not closed. None: no holds.
    "HOLD_CONDITION": None,
    # Paid by another column: a Q over the order model (Q(charge_status="full")), or the dotted
    # path of a callable returning one. An unpaid order that matches it is settled for every
    # promise, whatever its status says: never closed, never held toward MAX_HOLD, no reminder.
    # Evaluated in the same locking SELECT as HOLD_CONDITION. None: the status alone decides.
    "SETTLED_CONDITION": None,
    # Fields of the order model the close writes besides the status, closed_at and close_reason,
    # each "time" (the database's time of the close) or "reason" (timeout, hold_expired): a
    # framework's own expiry columns (Saleor's expired_at: {"expired_at": "time"}).
    "CLOSE_FIELDS": {},
    # Seconds between two looks at a held order (closed at the first look after
    # its hold ended while it is still unpaid).
    "HOLD_RECHECK": 30,
    # Seconds past its deadline an order may be held; past them it is closed
    # anyway, with close_reason "hold_expired". None: no limit.
    "MAX_HOLD": 86400,
    # The dotted path of a callable (order) -> datetime | None giving an unpaid
    # order saved without a deadline its deadline (by payment method, by
    # channel); None from it: this order never expires. None here: now +
    # DEFAULT_TIMEOUT for every order.
    "DEADLINE_POLICY": None,
    # Seconds before the deadline at which deadline_approaching is sent, once
    # per reminder of each unpaid order, e.g. [900, 60]. Empty: no reminders.
    "REMINDERS": [],
    # How a connection pooler in front of PostgreSQL shares the server connections.
    # "session": none, or one per client for its whole life (PgBouncer pool_mode =
    # session): the consumer limits its own session, and the lease guard ends the
    # session of a batch it gives up. "transaction" (PgBouncer pool_mode = transaction):
    # a session is ours for one transaction only, so each transaction that locks orders
    # sets the limits with SET LOCAL, and no session is ended by its id (the server's
    # limits end a stuck transaction). PostgreSQL only (check E016).
    "DATABASE_POOLING": "session",
    # The dotted path of a callable returning a context manager that the app's Celery tasks run
    # in: a shop's writer rules (Saleor's "saleor.core.db.connection.allow_writer", which its task
    # class requires around any query on the primary). None: none.
    "TASK_CONTEXT": None,
}

MAX_BATCH_SIZE = 10_000
# What a field of CLOSE_FIELDS gets: the database's time of the close, or its reason.
CLOSE_FIELD_VALUES = ("time", "reason")
# The longest any setting of seconds may be: a century. Past it a deadline (now + it) soon
# leaves what a datetime, a Redis score and a thread's wait can hold; no shop needs more.
MAX_SECONDS = 100 * 365 * 86_400
# A window is a few milliseconds; one of a second would be lateness, not batching.
MAX_BATCH_WINDOW = 0.1
# More shards than a cluster has slots' worth of masters buys nothing.
MAX_SHARDS = 1024
_KEY_PREFIX_RE = re.compile(r"^[A-Za-z0-9_.:-]+$")
_MODEL_LABEL_RE = re.compile(r"^\w+\.\w+$")
# A token travels in an HTTP header: visible ASCII, no spaces, long enough to be a secret.
MIN_TOKEN_LENGTH = 16
_TOKEN_RE = re.compile(r"[\x21-\x7e]+")


def _setting_error(key: str, problem: str) -> ImproperlyConfigured:
    return ImproperlyConfigured(f"{SETTING_NAME}[{key!r}] {problem}")


def _is_number(value: Any) -> bool:
    """A real, finite number (not a bool): inf and NaN pass every comparison with a bound."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _seconds(value: Any, *, zero: bool = False) -> bool:
    return _is_number(value) and (value >= 0 if zero else value > 0) and value <= MAX_SECONDS


def _positive_number(key: str, value: Any) -> None:
    if not _seconds(value):
        raise _setting_error(key, f"must be a positive number of seconds, at most {MAX_SECONDS:,} "
                                  f"(a century), got {value!r}.")


def _batch_size(key: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_BATCH_SIZE:
        raise _setting_error(key, f"must be an integer from 1 to {MAX_BATCH_SIZE}, got {value!r}.")


def _non_negative_number(key: str, value: Any) -> None:
    if not _seconds(value, zero=True):
        raise _setting_error(key, f"must be a number of seconds >= 0, at most {MAX_SECONDS:,} "
                                  f"(a century), got {value!r}.")


def _batch_window(key: str, value: Any) -> None:
    if not _is_number(value) or not 0 <= value <= MAX_BATCH_WINDOW:
        raise _setting_error(key, f"must be a number of seconds from 0 to {MAX_BATCH_WINDOW:g}, "
                                  f"got {value!r}.")


def _positive_int(key: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise _setting_error(key, f"must be a positive integer, got {value!r}.")


def _shards(key: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_SHARDS:
        raise _setting_error(key, f"must be an integer from 1 to {MAX_SHARDS}, got {value!r}.")


def _delays(key: str, value: Any) -> None:
    if not isinstance(value, (list, tuple)) or not all(_seconds(delay) for delay in value):
        raise _setting_error(key, f"must be a list of positive numbers of seconds, each at most "
                                  f"{MAX_SECONDS:,} (a century), got {value!r}.")


def _non_empty_str(key: str, value: Any) -> None:
    if not isinstance(value, str) or not value:
        raise _setting_error(key, f"must be a non-empty string, got {value!r}.")


def _key_prefix(key: str, value: Any) -> None:
    if not isinstance(value, str) or not _KEY_PREFIX_RE.match(value):
        raise _setting_error(
            key, f"must be letters, digits and _ . : - (it becomes a {{hash tag}}), got {value!r}."
        )


def _model_label(key: str, value: Any) -> None:
    if value is not None and (not isinstance(value, str) or not _MODEL_LABEL_RE.match(value)):
        raise _setting_error(key, f"must be of the form 'app_label.ModelName' (or None: no order close), "
                                  f"got {value!r}.")


# The keys that configure the order close only: set with no ORDER_MODEL, they would do nothing.
ORDER_CLOSE_KEYS = ("REMINDERS", "HOLD_CONDITION", "SETTLED_CONDITION", "CLOSE_FIELDS")


def _order_close_keys(values: dict[str, Any]) -> None:
    if values["ORDER_MODEL"] is not None:
        return
    for key in ORDER_CLOSE_KEYS:
        if values[key] != DEFAULTS[key]:
            raise _setting_error(key, "configures the order close, but ORDER_MODEL is None (no order close): "
                                      "set ORDER_MODEL, or declare what you need on your timer "
                                      "(hold, settled, values: docs/timers.md).")


def _token(key: str, value: Any) -> None:
    if value is None or (isinstance(value, str) and len(value) >= MIN_TOKEN_LENGTH
                         and _TOKEN_RE.fullmatch(value)):
        return
    # A secret: the message describes it and never repeats it.
    got = (f"a string of {len(value)} characters" if isinstance(value, str)
           else f"a {type(value).__name__}")
    raise _setting_error(
        key, f"must be None or a string of at least {MIN_TOKEN_LENGTH} visible ASCII characters "
             f"without spaces (secrets.token_urlsafe(32) makes one), got {got}.")


def _bool(key: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise _setting_error(key, f"must be True or False, got {value!r}.")


def _optional_positive_number(key: str, value: Any) -> None:
    if value is not None:
        _positive_number(key, value)


def _optional_non_negative_number(key: str, value: Any) -> None:
    if value is not None:
        _non_negative_number(key, value)


def _import(key: str, value: Any) -> Callable[..., Any]:
    """The callable a dotted path names, imported now so a typo fails at start-up."""
    try:
        imported = import_string(value)
    except ImportError as exc:
        raise _setting_error(key, f"names {value!r}, which cannot be imported: {exc}") from exc
    if not callable(imported):
        raise _setting_error(key, f"names {value!r}, which is not callable.")
    return imported


def _callable_path(key: str, value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, str) or "." not in value:
        raise _setting_error(key, f"must be None or the dotted path of a callable, got {value!r}.")
    _import(key, value)


def _hold_condition(key: str, value: Any) -> None:
    if value is None or isinstance(value, Q):
        return
    if not isinstance(value, str) or "." not in value:
        raise _setting_error(key, f"must be None, a Q object over the order model or the dotted "
                                  f"path of a callable returning one, got {value!r}.")
    _import(key, value)


def _close_fields(key: str, value: Any) -> None:
    if not isinstance(value, dict) or not all(
            isinstance(name, str) and name and what in CLOSE_FIELD_VALUES for name, what in value.items()):
        raise _setting_error(key, f"must be a dict of the order model's field names to one of "
                                  f"{', '.join(map(repr, CLOSE_FIELD_VALUES))}, e.g. {{'expired_at': 'time'}}, "
                                  f"got {value!r}.")


def _reminders(key: str, value: Any) -> None:
    if not isinstance(value, (list, tuple)) or not all(_seconds(seconds) for seconds in value) \
            or len(set(value)) != len(value):
        raise _setting_error(key, "must be a list of distinct positive numbers of seconds before "
                                  f"the deadline (each at most {MAX_SECONDS:,}), e.g. [900, 60], "
                                  f"got {value!r}.")


POOLING_MODES = ("session", "transaction")


def _pooling(key: str, value: Any) -> None:
    if not isinstance(value, str) or value not in POOLING_MODES:
        raise _setting_error(key, f"must be 'session' or 'transaction', got {value!r}.")


VALIDATORS: dict[str, Callable[[str, Any], None]] = {
    "REDIS_ALIAS": _non_empty_str,
    "KEY_PREFIX": _key_prefix,
    "SHARDS": _shards,
    "DEFAULT_TIMEOUT": _positive_number,
    "BATCH_SIZE": _batch_size,
    "LEASE_SECONDS": _positive_number,
    "BATCH_TIME_LIMIT": _optional_positive_number,
    "HEARTBEAT_SECONDS": _positive_number,
    "MAX_TAKEOVERS": _positive_int,
    "SCHEDULE_TIMEOUT": _positive_number,
    "MAX_WAIT": _positive_number,
    "BATCH_WINDOW": _batch_window,
    "ORDER_MODEL": _model_label,
    "RETRY_DELAYS": _delays,
    "NOTICE_RETRY_DELAYS": _delays,
    "COMPENSATION_GRACE": _non_negative_number,
    "COMPENSATION_INTERVAL": _positive_number,
    "COMPENSATION_CHUNK": _positive_int,
    "COMPENSATION_LOCK_SECONDS": _positive_number,
    "COMPENSATION_FULL_INTERVAL": _positive_number,
    "NOTICE_RETENTION": _optional_non_negative_number,
    "REMINDER_RETENTION": _optional_non_negative_number,
    "DEAD_LETTER_RETENTION": _optional_non_negative_number,
    "PRUNE_INTERVAL": _optional_positive_number,
    "PRUNE_CHUNK": _batch_size,
    "GIVE_BACK_GRACE": _non_negative_number,
    "METRICS_TOKEN": _token,
    "DEAD_LETTER_TRACEBACKS": _bool,
    "TESTING_WITHOUT_REDIS": _bool,
    "HOLD_CONDITION": _hold_condition,
    "SETTLED_CONDITION": _hold_condition,
    "CLOSE_FIELDS": _close_fields,
    "HOLD_RECHECK": _positive_number,
    "MAX_HOLD": _optional_non_negative_number,
    "DEADLINE_POLICY": _callable_path,
    "REMINDERS": _reminders,
    "DATABASE_POOLING": _pooling,
    "TASK_CONTEXT": _callable_path,
}


_ABSENT = object()


class OrderTimeoutSettings:
    """Attribute access to ``ORDER_TIMEOUT`` over ``DEFAULTS``, validated once per change."""

    def __init__(self) -> None:
        # (the ORDER_TIMEOUT object read, the reload count then, the values): served only while
        # both still hold. The object's identity catches a change that sends no setting_changed
        # (pytest-django's ``del settings.X`` and its undoing); the count catches a read that
        # began before a reload (a thread that read the old setting while another changed it).
        self._cached: tuple[object, int, dict[str, Any]] | None = None
        self._generation = 0

    def load(self) -> dict[str, Any]:
        """Read, merge and validate the setting; raises ImproperlyConfigured."""
        source = getattr(django_settings, SETTING_NAME, _ABSENT)
        cached = self._cached
        if cached is not None and cached[0] is source and cached[1] == self._generation:
            return cached[2]
        generation = self._generation
        values = self._read(source)
        self._cached = (source, generation, values)
        return values

    def reload(self) -> None:
        """Drop the values: the next read reads the setting again (after an in-place edit, say)."""
        self._generation += 1
        self._cached = None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name not in DEFAULTS:
            raise AttributeError(name)
        return self.load()[name]

    @staticmethod
    def _read(source: object) -> dict[str, Any]:
        user = {} if source is _ABSENT else source
        if not isinstance(user, dict):
            raise ImproperlyConfigured(f"{SETTING_NAME} must be a dict, got {type(user).__name__}.")
        unknown = sorted(set(user) - set(DEFAULTS))
        if unknown:
            raise ImproperlyConfigured(
                f"{SETTING_NAME} has unknown key(s) {', '.join(map(repr, unknown))}; "
                f"known keys are {', '.join(DEFAULTS)}."
            )
        values = {**DEFAULTS, **user}
        for key, validate in VALIDATORS.items():
            validate(key, values[key])
        _order_close_keys(values)
        return values

    def closes_orders(self) -> bool:
        """Whether the app's own order close runs (``ORDER_MODEL`` is not None)."""
        return self.load()["ORDER_MODEL"] is not None


    def batch_time_limit(self) -> float:
        """Seconds a batch may run from its claim: ``BATCH_TIME_LIMIT``, or ``LEASE_SECONDS``."""
        values = self.load()
        limit = values["BATCH_TIME_LIMIT"]
        return float(values["LEASE_SECONDS"] if limit is None else limit)

    def longest_in_hand(self) -> float:
        """Seconds a claimed member may stay with one holder: a live one's time limit, a dead one's lease."""
        return max(self.batch_time_limit(), float(self.LEASE_SECONDS))

    def hold_condition(self) -> Q | None:
        """The hold condition as a Q (a dotted path's callable is called now), or None.

        ``ImproperlyConfigured`` naming the key when the callable raises or returns no Q.
        """
        return self._condition("HOLD_CONDITION")

    def settled_condition(self) -> Q | None:
        """The settled condition as a Q (a dotted path's callable is called now), or None."""
        return self._condition("SETTLED_CONDITION")

    def _condition(self, key: str) -> Q | None:
        value = self.load()[key]
        if value is None or isinstance(value, Q):
            return value
        try:
            condition = _import(key, value)()
        except ImproperlyConfigured:
            raise
        except Exception as exc:
            raise _setting_error(key, f"names {value!r}, which raised {type(exc).__name__}: {exc}") from exc
        if not isinstance(condition, Q):
            raise _setting_error(key, f"names {value!r}, which returned {type(condition).__name__}, not a Q object.")
        return condition

    def deadline_policy(self) -> Callable[[Any], Any] | None:
        """The deadline policy's callable, or None."""
        value = self.DEADLINE_POLICY
        return None if value is None else _import("DEADLINE_POLICY", value)

    def task_context(self) -> Any:
        """A fresh context manager for one run of a Celery task (``TASK_CONTEXT``, or none)."""
        value = self.TASK_CONTEXT
        return nullcontext() if value is None else _import("TASK_CONTEXT", value)()

    def reminders(self) -> list[int]:
        """The reminders, in whole milliseconds before the deadline, earliest moment first."""
        return sorted((round(1000 * seconds) for seconds in self.REMINDERS), reverse=True)


settings = OrderTimeoutSettings()


def _drop_cache(*, setting: str, **kwargs: Any) -> None:
    if setting == SETTING_NAME:
        settings.reload()


setting_changed.connect(_drop_cache, dispatch_uid="order_timeout.conf.drop_cache")
