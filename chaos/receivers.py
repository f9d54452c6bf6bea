"""The ``order_expired`` receiver of every chaos process: record the delivery, misbehave on demand.

(Reminders are recorded by the test shop's own ``deadline_approaching``
receiver, ``ReminderEmail``; ``slow_reminder`` only gives them the same
CHAOS_DELIVERY_DELAY as a close.)

It runs inside the closing transaction, as a shop's receiver does. The
delivery row commits with the close or not at all. Which orders misbehave,
and how, is read from ``Role`` (only when CHAOS_BEHAVIOURS=1, so the other
scenarios pay no extra query); how long a hang or an overrun lasts and how
often a flaky receiver raises come from the environment the harness sets.
"""

from __future__ import annotations

import os
import random
import time
from typing import Any

from . import pauses
from .models import DatabaseUtcNow, Delivery, Role

# The exit status of a consumer whose receiver took it down: the harness expects it.
EXIT_STATUS = 77


class ReceiverFailed(Exception):
    """What a raising receiver raises: the shop's release of stock failed."""


def _number(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


def behaviour_of(order_id: Any) -> str:
    if os.environ.get("CHAOS_BEHAVIOURS") != "1":
        return Role.Behaviour.NONE
    return Role.objects.filter(order_id=order_id).values_list("behaviour", flat=True).first() or ""


def misbehave(behaviour: str, order_id: Any) -> None:
    """Do to this delivery what the order's role asks."""
    B = Role.Behaviour
    if behaviour == B.RAISE:
        raise ReceiverFailed(f"order {order_id}: the stock service refused (always)")
    if behaviour == B.FLAKY and random.random() < _number("CHAOS_FLAKY_RATE", 0.5):
        raise ReceiverFailed(f"order {order_id}: the stock service refused (this time)")
    if behaviour == B.HANG:
        time.sleep(_number("CHAOS_HANG_SECONDS", 60))
    elif behaviour == B.OVERRUN:
        time.sleep(_number("CHAOS_OVERRUN_SECONDS", 3))
    elif behaviour == B.EXIT:
        os._exit(EXIT_STATUS)
    elif behaviour == B.PAUSE_IN_CLOSE:
        pauses.pause_once(order_id, "close")


def record_delivery(sender: Any, order: Any, **kwargs: Any) -> None:
    """Misbehave first, then write the delivery, so its time is as near the commit as it can be."""
    misbehave(behaviour_of(order.pk), order.pk)
    delay = _number("CHAOS_DELIVERY_DELAY", 0)
    if delay:
        time.sleep(delay)
    Delivery.objects.create(order_id=order.pk, delivered_at=DatabaseUtcNow(), pid=os.getpid())


def slow_reminder(sender: Any, order: Any, seconds_left: float, **kwargs: Any) -> None:
    """``deadline_approaching``: take as long as a close's delivery (CHAOS_DELIVERY_DELAY), so that
    kills land in batches of reminders too. The shop's receiver has written its ReminderEmail."""
    delay = _number("CHAOS_DELIVERY_DELAY", 0)
    if delay:
        time.sleep(delay)
