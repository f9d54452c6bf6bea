"""How an order becomes a Redis member and a deadline becomes a score, and back.

Members hold only the primary key, never order data (seed 000). Scores are
deadlines in whole milliseconds since the epoch, rounded *up*: a member is due
(score <= now) only if its row's ``expires_at`` <= now as well, so a member can
never be claimed while its row still says "not yet" and spin the consumer.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from django.core.exceptions import ValidationError
from django.db import models

from ..db.keys import INTEGER_FIELDS

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def deadline_score(deadline: datetime) -> int:
    """Milliseconds since the epoch, rounded up; ``deadline`` must be aware."""
    delta = deadline - _EPOCH
    micros = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    return -(-micros // 1000)


def datetime_of_score(ms: int) -> datetime:
    """The moment a score names (milliseconds since the epoch), aware, in UTC: exact, no float."""
    return _EPOCH + timedelta(milliseconds=ms)


def now_score(now: datetime) -> int:
    """Milliseconds since the epoch, rounded down, so ``score <= now_score`` implies due."""
    delta = now - _EPOCH
    micros = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    return micros // 1000


def order_member(model: type[models.Model], pk: Any) -> str:
    """The Redis member of ``model``'s order with this primary key.

    Encoded through the primary key field itself, so one order has one member
    whatever form its key was given in (a UUID as upper-case or hex text, an
    integer as a string): ``to_python`` makes the value canonical.
    """
    field = model._meta.pk
    assert field is not None
    return str(field.to_python(pk))


def parse_member(model: type[models.Model], member: str) -> Any:
    """The primary key a member names; ``ValueError`` when it names none."""
    field = model._meta.pk
    assert field is not None
    try:
        pk = field.to_python(member)
    except (ValidationError, TypeError, ValueError) as exc:
        raise ValueError(f"malformed member {member!r}") from exc
    if pk is None or pk == "" or str(pk) != member:
        raise ValueError(f"malformed member {member!r}")
    return pk


def integer_keys(model: type[models.Model], members: Sequence[str]) -> list[int] | None:
    """The integer primary keys a claim's members name, read for the whole claim at once; None
    unless the key is an integer field and every member is one's canonical digits (then each
    member goes through ``parse_member``, which tells the malformed ones)."""
    field = model._meta.pk
    assert field is not None
    if field.get_internal_type() not in INTEGER_FIELDS:
        return None
    try:
        keys = list(map(int, members))
    except ValueError:
        return None
    # int() takes " 7", "+7", "0_7" and "07" too: none is the member of an order.
    return keys if list(map(str, keys)) == list(members) else None


def reminder_member(model: type[models.Model], pk: Any, lead_ms: int) -> str:
    """The Redis member of one reminder of an order: its member, ``:``, the milliseconds before
    the deadline it is due (one member per reminder, so each has its own lease and retries)."""
    return f"{order_member(model, pk)}:{lead_ms}"


def parse_reminder(model: type[models.Model], member: str) -> tuple[Any, int]:
    """``(pk, lead_ms)`` of a reminder member; ``ValueError`` when it names none."""
    order, _, lead = member.rpartition(":")
    if not order or not lead.isdigit():
        raise ValueError(f"malformed reminder member {member!r}")
    return parse_member(model, order), int(lead)
