"""What a handler is given, and what it raises to give up at once.

A handler is called with a ``Delivery`` outside any database transaction, on
each attempt, until it returns (delivered) or the retries run out (a dead
letter). Anything it raises is retried after the next of
``NOTICE_RETRY_DELAYS``; ``Rejected`` is not retried: the target answered
that it will never take this notice (a webhook's 400), and the notice is a
dead letter at once, with the answer kept for staff.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..exceptions import OrderTimeoutError


@dataclass(frozen=True)
class Delivery:
    """One attempt at one notice."""

    # The notice row's primary key, and the handler it was written for.
    notice_id: int
    handler: str
    # Stable across every attempt of this notice: hand it to the target (``Idempotency-Key``,
    # an e-mail's Message-ID), so a repeated delivery is recognised downstream.
    key: str
    # What ``notify()`` stored: a JSON value (for an object, ``{"model": ..., "pk": ...}``).
    payload: Any
    # 1 for the first attempt, 2 for the first retry, ...
    attempt: int
    # The object ``notify()`` was given, loaded again now (None for a payload, or when it is gone).
    object: Any = None
    # Seconds the handler may take (its declaration's ``timeout``): pass it to the client.
    timeout: float = 10.0


class Rejected(OrderTimeoutError):
    """The target refused this notice for good (a 4xx other than 408 and 429): a dead letter now,
    not a retry. ``answer`` is what it said, kept on the notice for staff."""

    def __init__(self, message: str, answer: str = "") -> None:
        super().__init__(message)
        self.answer = answer
