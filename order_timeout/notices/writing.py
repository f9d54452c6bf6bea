"""``notify()`` and ``notify_many()``: a notice written in the caller's transaction.

The transactional outbox: the notice is a row of ``order_timeout.Notice``,
written by the same transaction as the change it tells of (a close, a
reminder, the shop's own), so it exists exactly when that committed and is
gone with a rollback. Its member reaches Redis before the commit, scored a
lease late, and again after the commit at its time, which wakes a consumer
to deliver it within milliseconds; if the process dies in between, a
consumer delivers it a lease later, and if Redis lost it, the compensation
scan finds the notice still pending. (A rolled-back notice's early member
names no row: the first look drops it.)

What cannot be stored is refused here, inside the caller's transaction,
before anything commits: an unknown handler, a payload that is not JSON, or
one over ``MAX_PAYLOAD_BYTES``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models, router
from django.utils import timezone

from ..exceptions import OrderTimeoutError
from .registry import handlers
from .rows import insert_notices

# The largest payload a notice stores, as JSON (UTF-8): a notice names what it is about and
# what the handler needs; a document belongs in the shop's own tables.
MAX_PAYLOAD_BYTES = 64 * 1024
MAX_KEY_LENGTH = 255

Key = str | Callable[[Any], str] | None


class NoticeRefused(OrderTimeoutError, ValueError):
    """``notify()`` cannot store this notice: the message says what (its handler, its payload)."""


def notify(handler: str, obj_or_payload: Any, *, key: str | None = None, at: datetime | None = None) -> Any:
    """Write one notice for ``handler`` in the current transaction; delivered after it commits.

    ``obj_or_payload``: a model instance (stored as a reference, loaded again at delivery) or a
    JSON value. ``key``: the notice's idempotency key, the same on every attempt, so the target
    recognises a repeat by it; by default a new one, or one that means something downstream
    (``f"order-expired:{order.pk}"``). ``at``: when it is due (an aware datetime), by default now.
    Returns the notice row.
    """
    return notify_many(handler, [obj_or_payload], key=None if key is None else (lambda _item: key), at=at)[0]


def notify_many(handler: str, objs_or_payloads: Iterable[Any], *, key: Key = None,
                at: datetime | None = None) -> Sequence[Any]:
    """``notify()`` for a batch: one INSERT for them all (from ``orders_expired``, a ``fire()``).

    ``key``: a callable giving each item's key (``lambda order: f"expired:{order.pk}"``), or None.
    Returns the notice rows, in the order of the items (each built when it is read).
    """
    from ..models import Notice

    declared = _declared(handler)
    due = _due(at)
    stored = [(_key(key, item), *_stored(item)) for item in objs_or_payloads]
    if not stored:
        return []
    using = router.db_for_write(Notice)
    written = insert_notices(using, declared, due, stored)
    _queued_by()(using, written.pks, due)
    return written


# How written notices reach the queue: the notices' kind (timers/notices.py, ``Notices.queue_written``)
# sets it when the timers load, at the app's start. The timers run the notices; this layer sits
# below them and never imports them.
QueueWritten = Callable[[str, Sequence[Any], datetime], None]
_queue_written: QueueWritten | None = None


def queue_written_notices_with(queue_written: QueueWritten) -> None:
    global _queue_written
    _queue_written = queue_written


def _queued_by() -> QueueWritten:
    if _queue_written is None:
        raise ImproperlyConfigured("notify() before the order_timeout app is ready: add 'order_timeout' to "
                                   "INSTALLED_APPS and call django.setup() first.")
    return _queue_written


def _declared(handler: str) -> str:
    try:
        return handlers.get(handler).name
    except LookupError as exc:
        raise NoticeRefused(f"notify({handler!r}): {exc}") from None


def _due(at: datetime | None) -> datetime:
    if at is None:
        return timezone.now()
    if not isinstance(at, datetime) or timezone.is_naive(at):
        raise NoticeRefused(f"notify(at=...) needs an aware datetime (or None: now), got {at!r}")
    return at


def _key(key: Key, item: Any) -> str:
    value = uuid.uuid4().hex if key is None else key(item) if callable(key) else key
    if not isinstance(value, str) or not value or len(value) > MAX_KEY_LENGTH:
        raise NoticeRefused(f"a notice's key must be a string of 1 to {MAX_KEY_LENGTH} characters, got {value!r}")
    return value


def _stored(item: Any) -> tuple[str | None, Any, str, str]:
    """The notice's payload (as JSON text, and as the value it reads as), object model and object
    id for ``item``: a reference to a model instance (no payload: ``Delivery.payload`` is made of
    the reference when it is delivered), or the JSON payload."""
    if isinstance(item, models.Model):
        if item.pk is None:
            raise NoticeRefused(f"notify() was given an unsaved {type(item).__name__}: save it first")
        return None, {}, item._meta.label, str(item.pk)
    try:
        text = json.dumps(item, cls=DjangoJSONEncoder)
    except (TypeError, ValueError) as exc:
        raise NoticeRefused(f"a notice's payload must be JSON (a dict, list, str, number, a datetime): {exc}") \
            from exc
    if len(text.encode()) > MAX_PAYLOAD_BYTES:
        raise NoticeRefused(f"a notice's payload is {len(text.encode()):,} bytes as JSON, over the "
                            f"{MAX_PAYLOAD_BYTES:,} a notice stores: store the document in your own table and "
                            "the notice's payload names it")
    return text, json.loads(text), "", ""


def check_handler(name: str) -> None:
    """ImproperlyConfigured naming ``name`` when no handler is declared for it (checks, commands)."""
    try:
        handlers.get(name)
    except LookupError as exc:
        raise ImproperlyConfigured(str(exc)) from None
