"""Refused writes that settled by themselves: the row reached what the write tried to write.

A payment refused because the deadline closed its order first is often retried by the shop's own
late-payment path, and the order ends paid: nothing is left to refund, and staff need not look.
A refused write is settled by itself when its row now holds, in every field its timer's act sets to
a constant (the order model's status field for the close; a declared timer's ``values`` but
``timers.NOW``) that the write tried to write, the value the write tried to write there.

``reached`` tells which (read-only: the status command counts only the others); ``settle`` marks
them handled, with no one in ``handled_by`` and ``settled_how`` saying what was found: the
housekeeping does it after each scan, ``order_timeout_refused`` before it lists.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from django.apps import apps
from django.db import router
from django.utils import timezone

from ..models import RefusedWrite, TimeoutOrderMixin, json_safe
from ..timers.declaration import NOW
from ..timers.registry import registry

logger = logging.getLogger("order_timeout")

CLOSE_TIMER = "close"
# Open refused writes looked at in one go: they are alerts, a handful; a flood waits for the next.
LOOK_AT_MOST = 1000


def _compared_fields(model: Any, timer: str) -> list[str]:
    """The fields whose values say whether a row reached what a refused write of ``timer`` tried."""
    if timer == CLOSE_TIMER and issubclass(model, TimeoutOrderMixin):
        return [_attname(model, model.TIMEOUT_STATUS_FIELD)]
    try:
        kind = registry.get(timer)
    except LookupError:
        return []
    if kind.model is not model:
        return []
    return [_attname(model, name) for name, value in kind.values.items() if value is not NOW]


def _attname(model: Any, name: str) -> str:
    """The column's attribute (``customer_id`` for ``customer``), as a refused write's values name it."""
    return str(getattr(model._meta.get_field(name), "attname", name))


def reached(refused: Iterable[RefusedWrite]) -> dict[int, str]:
    """Of these refused writes, those whose row reached what the write tried: id -> how, in words.
    One query per model."""
    by_model: dict[str, list[RefusedWrite]] = defaultdict(list)
    for row in refused:
        by_model[row.model].append(row)
    found: dict[int, str] = {}
    for label, rows in by_model.items():
        try:
            model = apps.get_model(label)
        except (LookupError, ValueError):
            continue
        fields = {row.timer: _compared_fields(model, row.timer) for row in rows}
        wanted = sorted({name for names in fields.values() for name in names})
        if not wanted:
            continue
        keys = {}
        for row in rows:
            try:
                keys[row.pk] = model._meta.pk.to_python(row.object_id)
            except Exception:  # noqa: BLE001 - an id that no longer parses names no row
                continue
        current = {str(values.pop("pk")): values for values in model._base_manager.using(router.db_for_write(model))
                   .filter(pk__in=set(keys.values())).values("pk", *wanted)}
        for row in rows:
            now = current.get(str(keys.get(row.pk)))
            compared = [name for name in fields[row.timer] if name in row.values]
            if now is None or not compared:
                continue
            if all(json_safe({name: now[name]})[name] == row.values[name] for name in compared):
                found[row.pk] = ", ".join(f"{name} is now {row.values[name]!r}" for name in compared) + \
                    ", what the refused write tried to write"
    return found


def settle() -> int:
    """Mark the open refused writes whose rows reached what they tried handled by themselves; how
    many. Conditional on still open, so staff marking one at the same time wins or loses whole."""
    refused = RefusedWrite.objects.db_manager(router.db_for_write(RefusedWrite))  # the primary: it writes
    waiting = list(refused.open().order_by("at")[:LOOK_AT_MOST])
    settled = 0
    now = timezone.now()
    for pk, how in reached(waiting).items():
        settled += refused.filter(pk=pk).open().update(handled_at=now, settled_how=how[:255])
    if settled:
        logger.info("refused writes settled by themselves: %d (their rows reached what was refused)", settled)
    return settled


def still_waiting() -> int:
    """Refused writes waiting for staff: open, less those whose rows reached what they tried since
    (read-only; the next ``settle`` marks them)."""
    waiting = RefusedWrite.objects.open()
    count = waiting.count()
    if not count:
        return 0
    return count - len(reached(waiting.order_by("at")[:LOOK_AT_MOST]))
