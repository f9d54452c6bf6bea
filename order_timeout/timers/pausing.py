"""Staff pause a timer (a payment provider down) and resume it: kept in the database, told through Redis.

A pause is a ``models.Pause`` row, open while the timer is paused: where Redis cannot lose it, so
a consumer killed or restarted during a pause, or a Redis that came back empty, never resumes a
timer by itself. While it is open no consumer claims that kind's members and no scan acts on its
rows (their members wait in Redis; a payment is accepted as ever); every other kind goes on.

Once a pause commits, every shard of its kind gets a paused flag, which the claim script reads:
from the next claim on nothing of that kind is claimed (a batch in hand finishes). A resume
clears the flags once it commits. A consumer's rebuild of a queue Redis lost sets them again
from the database. And every pause and resume bumps a version in Redis (``{prefix}:pauses``):
each consumer reads it at a heartbeat once every ``HEARTBEAT_SECONDS`` and asks the database
again when it changed, when Redis has none (lost), and every ``RECHECK`` seconds whatever Redis
says, and stops asking for a paused kind's lanes at all (an idle consumer asks nothing of them).

A kind is named as logs name it: ``close``, ``reminders``, ``notices``, or a declared timer's name.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import DatabaseError, IntegrityError, close_old_connections, router, transaction

from ..conf import settings
from ..db.session import database_now
from ..exceptions import OrderTimeoutError, QueueUnavailable
from ..models import Pause
from ..queue import TimeoutQueue
from ..redaction import one_line
from .registry import registry

logger = logging.getLogger("order_timeout")

# Seconds between two looks at the database by a consumer whatever Redis's version says: the
# bound on a pause missed by a Redis restored from a copy that holds the version it last saw.
RECHECK = 30.0


class PauseRefused(OrderTimeoutError, ValueError):
    """A pause or a resume that cannot be done as asked: the message names the timer and why."""


@dataclass(frozen=True)
class Paused:
    """One open pause, as staff read it."""

    timer: str
    since: datetime
    by: str
    reason: str


def open_pauses() -> dict[str, Pause]:
    """The open pauses, by timer, read on the primary (a replica may not have the last one yet)."""
    rows = Pause.objects.db_manager(router.db_for_write(Pause)).filter(resumed_at__isnull=True)
    return {row.timer: row for row in rows.select_related("paused_by")}


def paused_names() -> set[str]:
    rows = Pause.objects.db_manager(router.db_for_write(Pause)).filter(resumed_at__isnull=True)
    return set(rows.values_list("timer", flat=True))


def describe(row: Pause) -> Paused:
    by = row.paused_by.get_username() if row.paused_by is not None else "a command"
    return Paused(row.timer, row.paused_at, by, row.reason)


def pause(names: Sequence[str], reason: str, *, known: Iterable[str], user: Any = None,
          now: datetime | None = None) -> list[Pause]:
    """Pause each timer of ``names`` (each one of ``known``) for ``reason``; the new pauses.

    ``PauseRefused`` naming the timer when one is unknown, or paused already (two staff pausing at
    once: one pause is open, the other is told so). Nothing is paused when one is refused.
    """
    reason = reason.strip()
    if not reason:
        raise PauseRefused("A pause needs a reason (the outage it is for): staff and the log read it.")
    _known(names, known)
    using = router.db_for_write(Pause)
    # The database's clock, as every deadline is judged: the length given back at the resume does not
    # depend on which hosts ran the pause and the resume.
    now = now or database_now(using)
    try:
        with transaction.atomic(using=using):
            created = [Pause.objects.using(using).create(timer=name, open_for=name, reason=reason, paused_at=now,
                                                         paused_by=user) for name in dict.fromkeys(names)]
    except IntegrityError:
        already = sorted(set(names) & paused_names())
        raise PauseRefused(f"{', '.join(already) or ', '.join(names)} is paused already: resume it first, "
                           "or leave it paused.") from None
    _tell(using, [row.timer for row in created], paused=True)
    who = user.get_username() if user is not None else "a command"
    for row in created:
        logger.warning("%s paused by %s: %s. Nothing of it is claimed or acted on until it is resumed.",
                       row.timer, who, reason)
    return created


def resume(names: Sequence[str], *, user: Any = None, now: datetime | None = None,
           before_resuming: Callable[[Pause], None] | None = None) -> list[Pause]:
    """Resume each paused timer of ``names``; the pauses ended. ``before_resuming(pause)`` runs
    first, while it is still paused (the give-back). ``PauseRefused`` naming a timer not paused."""
    current = open_pauses()
    missing = [name for name in names if name not in current]
    if missing:
        raise PauseRefused(f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not paused.")
    using = router.db_for_write(Pause)
    ended: list[Pause] = []
    for name in dict.fromkeys(names):
        row = current[name]
        if before_resuming is not None:
            before_resuming(row)
        at = now or database_now(using)
        # Conditional: two staff resuming at once end one pause, and the second is told so.
        if not Pause.objects.using(using).filter(pk=row.pk, resumed_at__isnull=True).update(
                resumed_at=at, resumed_by=user, open_for=None):
            raise PauseRefused(f"{name} is not paused (resumed meanwhile).")
        row.refresh_from_db()
        ended.append(row)
        # Told and logged as each one ends: a later timer's give-back failing leaves none resumed
        # but untold.
        _tell(using, [row.timer], paused=False)
        _log_resumed(row, user)
    return ended


def _log_resumed(row: Pause, user: Any) -> None:
    assert row.resumed_at is not None
    who = user.get_username() if user is not None else "a command"
    given = (f"; {row.given_back_seconds:g}s given back to {row.given_back_rows} row(s)"
             if row.given_back_seconds is not None else "")
    logger.warning("%s resumed by %s after %s%s.", row.timer, who,
                   _duration((row.resumed_at - row.paused_at).total_seconds()), given)


def known_names() -> list[str]:
    """Every kind a consumer of this project serves, by name: what may be paused."""
    return [kind.label for kind in registry.kinds()]


def kind_named(name: str) -> Any:
    """The kind of that name (``PauseRefused`` when there is none)."""
    for kind in registry.kinds():
        if kind.label == name:
            return kind
    raise PauseRefused(f"No timer named {name!r}: the timers are {', '.join(known_names())}.")


def _known(names: Sequence[str], known: Iterable[str]) -> None:
    known = set(known)
    if not names:
        raise PauseRefused("Name the timer(s) to pause or resume.")
    unknown = [name for name in names if name not in known]
    if unknown:
        raise PauseRefused(f"No timer named {', '.join(map(repr, unknown))}: the timers are "
                           f"{', '.join(sorted(known))}.")


def _tell(using: str, names: Sequence[str], *, paused: bool) -> None:
    """Once the change committed: set (or clear) the kinds' paused flags, which the claims read, and
    bump the version the consumers read at their heartbeats."""

    def tell() -> None:
        try:
            queue = TimeoutQueue.from_settings()
            set_flags(queue, names, paused=paused)
            queue.housekeeping.bump_pauses(uuid.uuid4().hex)
        except QueueUnavailable as error:
            # The database holds the pause: every consumer asks it again within RECHECK seconds.
            logger.warning("Could not tell the consumers through Redis (%s); they read the pause from the "
                           "database within %gs.", error, RECHECK)

    if not settings.TESTING_WITHOUT_REDIS:  # a test suite with no Redis: the runner reads the pauses
        transaction.on_commit(tell, using=using)


def set_flags(queue: TimeoutQueue, names: Iterable[str], *, paused: bool) -> None:
    """Each named kind's paused flags on every shard (a kind no longer configured has none)."""
    spaces = {kind.label: kind.key_space for kind in registry.kinds()}
    for name in names:
        if name in spaces:
            queue.of_kind(spaces[name]).set_paused(paused)


def synced_flags(queue: TimeoutQueue, kinds: Iterable[Any]) -> frozenset[str]:
    """The paused kinds by the database, with the claims' flags of ``kinds`` made to agree.

    The flags are read before the database, so a flag seen set was set by a pause that committed
    before the read: one the database no longer holds was resumed since, and is cleared (a pause's
    telling that ran after the resume's, or a resume Redis never heard of, would otherwise keep
    the claims paused for good). A pause that committed after the read has bumped the version and
    is read again at the next heartbeat. Redis unreachable: the database's answer, flags untouched.
    """
    queues = {kind.label: queue.of_kind(kind.key_space) for kind in kinds}
    try:
        flagged = {name: each.paused_flags() for name, each in queues.items()}
    except QueueUnavailable:
        return frozenset(paused_names())
    paused = frozenset(paused_names())
    try:
        for name, flags in flagged.items():
            if any(flag != (name in paused) for flag in flags):
                queues[name].set_paused(name in paused)
                logger.info("%s's claims %s, as the database says.", name,
                            "paused" if name in paused else "resumed")
    except QueueUnavailable:
        pass  # the next look tries again
    return paused


def _duration(seconds: float) -> str:
    minutes, second = divmod(round(seconds), 60)
    hours, minute = divmod(minutes, 60)
    return f"{hours}h {minute}m" if hours else f"{minute}m {second}s" if minute else f"{second}s"


class PauseWatch:
    """What one consumer knows of the pauses: which kinds it serves are paused now.

    ``check()`` at each heartbeat, which looks once every ``every`` seconds (``HEARTBEAT_SECONDS``):
    one Redis read, and a database read when the version moved, is gone, or ``RECHECK`` seconds
    passed. ``on_change(paused)`` is told the new set.
    """

    def __init__(self, housekeeping: Any, on_change: Callable[[frozenset[str]], None], *, every: float = 0.0,
                 clock: Callable[[], float] = time.monotonic,
                 read: Callable[[], frozenset[str]] | None = None) -> None:
        self.housekeeping = housekeeping
        self.on_change = on_change
        # How the database is asked (a consumer's synced_flags: the claims' flags made to agree).
        self.read = read or (lambda: frozenset(paused_names()))
        self.every = every
        self.clock = clock
        self.paused: frozenset[str] = frozenset()
        self._version: str | None = None
        self._read_at = -RECHECK
        self._looked_at = -every
        self._loaded = False
        self._lock = threading.Lock()

    def load(self) -> frozenset[str]:
        """Ask the database now (the consumer's start: a restarted consumer stays paused)."""
        with self._lock:
            try:
                self._version = self._current_version()
            except QueueUnavailable:
                self._version = None
            self._looked_at = self.clock()
            self._set(self.read())
            self._loaded = True
            return self.paused

    def _current_version(self) -> str:
        version = self.housekeeping.pauses_version()
        if version is None:
            # Lost with Redis (or never set): set one again, so every consumer reads the database once.
            version = self.housekeeping.bump_pauses(uuid.uuid4().hex, only_if_missing=True)
        return str(version)

    def check(self) -> None:
        """At a heartbeat: the database again if Redis says something changed, or it is time."""
        if not self._loaded or self.clock() - self._looked_at < self.every:
            return  # before the first claim's load, or looked at less than a heartbeat ago
        self._looked_at = self.clock()
        try:
            version = self._current_version()
        except QueueUnavailable:
            return  # the claims fail too; the next beat asks again
        with self._lock:
            if version == self._version and self.clock() - self._read_at < RECHECK:
                return
            try:
                paused = self.read()
            except DatabaseError as error:
                logger.warning("Could not read the timers' pauses (%s: %s); the next beat asks again.",
                               type(error).__name__, one_line(error))
                return
            finally:
                close_old_connections()
            self._version = version
            self._set(paused)

    def _set(self, paused: frozenset[str]) -> None:
        self._read_at = self.clock()
        if paused != self.paused:
            self.paused = paused
            self.on_change(paused)
