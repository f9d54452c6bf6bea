"""The exceptions this app raises; catch ``OrderTimeoutError`` to catch them all."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError


class OrderTimeoutError(Exception):
    """Base of every error raised by order_timeout."""


class QueueUnavailable(OrderTimeoutError):
    """Redis could not be reached or refused a command; the cause is chained."""


class Refused(OrderTimeoutError, ValidationError):
    """A move of a row the app refuses: also a ``ValidationError``, so a framework that turns
    validation errors into its own answers (a form's errors, a GraphQL mutation's error list, an
    API's 400) shows the refusal as an ordinary error, never a server error.

    Its ``code`` is Django's generic ``"invalid"``, the one code every framework's error codes
    know (Saleor's ``OrderErrorCode.INVALID``: a code outside its enum fails the whole mutation);
    ``reason`` names the case for the shop's own code. ``str()`` is the message, then what was and
    was not written: the refused write was not made, and what was committed before it stands
    unless its transaction is rolled back; and the ``RefusedWrite`` staff will see, when one was
    recorded.

    What a handler needs to answer it without parsing the message (an API's 409, a refund): the
    refused row's model label (``"shop.ShopOrder"``), primary key and public name (the order's
    code or number where the model or timer names its rows: ``TIMEOUT_PUBLIC_NAME``,
    ``Timer.public_name``; the primary key by default), the timer whose act the write would have
    undone (``"close"`` for the order close), and ``refused_write_id``. Set by the app where it
    refuses; None on a refusal raised without them (keyword-only, so older callers are unchanged)."""

    reason = "refused"

    def __init__(self, message: Any, code: str = "invalid", params: dict[str, Any] | None = None, *,
                 model_label: str | None = None, pk: Any = None, timer: str | None = None,
                 public_name: str | None = None) -> None:
        ValidationError.__init__(self, message, code, params)
        self.model_label = model_label
        self.pk = pk
        self.timer = timer
        self.public_name = public_name if public_name is not None or pk is None else str(pk)
        # The RefusedWrite staff see for it (its primary key), once recorded.
        self.refused_write_id: Any = None

    @property
    def message_alone(self) -> str:
        """The refusal's own message, without what was and was not written."""
        message = str(self.message)
        return message % self.params if self.params else message

    def __str__(self) -> str:
        recorded = (f" Refused write #{self.refused_write_id} records it for staff."
                    if self.refused_write_id is not None else "")
        return (f"{self.message_alone} This write was not made; what was committed before it stands unless "
                f"its transaction is rolled back.{recorded}")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message_alone!r})"

    def __reduce__(self) -> Any:
        # The row's names travel as state: a refusal pickled (a Celery result, a cache) keeps them.
        return type(self), (self.message, self.code, self.params), {
            "model_label": self.model_label, "pk": self.pk, "timer": self.timer, "public_name": self.public_name,
            "refused_write_id": self.refused_write_id}


class OrderClosed(Refused):
    """The order was already closed (its deadline passed), so it cannot be paid or extended."""

    reason = "order_closed"


class StaleOrderStatus(Refused):
    """A save would overwrite a paid or closed row with an older status (the object was stale),
    or, on a guarded model, a row the timer acted on since the object was loaded."""

    reason = "stale_order_status"


class ImmediateShutdown(SystemExit):
    """The consumer was told twice to stop: leave now, whatever is in hand.

    The one exception a receiver's close does not catch; whatever was claimed
    stays leased and another consumer takes it over.
    """


class RepeatedTakeover(OrderTimeoutError):
    """The order's consumer died, froze or overran its lease with it too often: a dead letter."""
