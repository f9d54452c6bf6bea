"""Running the shop's receivers inside an act: whatever they raise fails their key, or their batch.

A kind's act calls these around the receivers it sends (``order_expired`` per order, a timer's
``fire()`` per batch); the database side (``acting``) reads what they raise to tell a key that
failed from a batch that failed as a whole. Only the consumer's own immediate shutdown goes
through untouched.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.transaction import TransactionManagementError

from ..exceptions import ImmediateShutdown
from .outcome import Key


class ReceiverFailed(Exception):
    """A receiver of ``key``'s act raised ``error`` (anything, ``SystemExit`` included)."""

    def __init__(self, key: Key, error: BaseException) -> None:
        super().__init__(key, error)
        self.key, self.error = key, error


class BatchReceiverFailed(Exception):
    """A receiver of a whole batch (a timer's ``fire``, ``orders_expired``) raised ``error``: the
    batch fails as a whole, and is acted on again a key at a time."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(error)
        self.error = error


def run_receiver(key: Key, connection: BaseDatabaseWrapper, send: Callable[[], Any]) -> None:
    """Run one key's receivers; whatever they raise fails that key alone (as ``ReceiverFailed``).

    A receiver that marked the transaction (on ``connection``, the act's) for rollback fails its
    key too: the act would be undone silently, yet acked. The connection is the caller's, looked
    up once a batch: a lookup per key cost about 1 us.
    """
    try:
        send()
        if connection.get_rollback():
            raise TransactionManagementError("a receiver marked the transaction for rollback")
    except ImmediateShutdown:
        raise
    except BaseException as exc:
        raise ReceiverFailed(key, exc) from exc


def run_batch_receiver(send: Callable[[], Any]) -> None:
    """Run a batch's receivers; whatever they raise (``SystemExit`` too) fails the batch, not the
    consumer."""
    try:
        send()
    except ImmediateShutdown:
        raise
    except BaseException as exc:
        raise BatchReceiverFailed(exc) from exc


def cause(error: BaseException) -> BaseException:
    """The receiver's own error inside these wrappers."""
    return error.error if isinstance(error, (ReceiverFailed, BatchReceiverFailed)) else error
