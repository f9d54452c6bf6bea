"""The app's signals: declarations only (the receivers live where their work is).

``order_expired(sender=OrderModel, order=order, previous_status=...)`` is sent
once per order closed for its deadline, inside the transaction that closes
it, after the row was updated: release stock and coupons, or run your own
state machine (a status-change row, your ``set_status``), in your receiver
and they commit (or roll back) with the close. ``previous_status`` is the
unpaid value the order left. A receiver that raises leaves that order open for
another try.

``orders_expired(sender=OrderModel, orders=[...], previous_statuses={pk: status})``
is sent once per closed batch, after the per-order signals and in the same
transaction, for shops that write their close with one statement per batch
rather than one per order (a ``bulk_create`` of status-change rows, one
``UPDATE`` of stock): the recommended way, see docs/existing-model.md. (When a
receiver raised and the batch is closed again one order at a time, it is sent
once per order instead.)

``order_keys_expired(sender=OrderModel, keys=[pk, ...], reasons={pk: reason})`` is sent
once per closed batch, in the same transaction, with the closed orders' primary keys and
each one's ``close_reason`` only: for a receiver that needs no instance (an audit, a cache to
clear, a counter). A batch that nothing asks instances for (no ``order_expired`` or
``orders_expired`` receiver for the model) is locked and closed without building any: its
rows are read as their keys and the two columns the re-check needs.

``deadline_approaching(sender=OrderModel, order=order, seconds_left=N)`` is
sent once for each of ``ORDER_TIMEOUT["REMINDERS"]`` (N seconds before the
deadline) of each unpaid order, inside a transaction that locks the row and
records the reminder (``order_timeout.models.Reminder``): send the e-mail from
``transaction.on_commit()``. Never for an order that is paid, closed, held (a
payment in flight) or without a deadline at that moment, never after the
deadline. A receiver that raises fails that reminder alone (retried like a
close); the close of its order does not wait for it.

``timeout_state_changed(sender=OrderModel, orders=[...])`` is sent by
``mark_paid()`` and ``extend_deadline()``, which change rows with a
conditional UPDATE (no ``post_save``); the app's own receiver mirrors the
rows into Redis after commit.
"""

from __future__ import annotations

from django.dispatch import Signal

# Sent by the model class, as Django's model signals are, and like them they keep each model's
# receivers between sends (use_caching; connect() and disconnect() start afresh): the close asks
# once per order, and looking the receivers up each time cost about 1.5 us of it.
order_expired = Signal(use_caching=True)
orders_expired = Signal(use_caching=True)
order_keys_expired = Signal(use_caching=True)
deadline_approaching = Signal(use_caching=True)
timeout_state_changed = Signal()
