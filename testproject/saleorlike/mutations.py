"""Saleor's ``orderConfirm`` and the way its mutations answer errors, the parts the expiry meets.

Read from Saleor at 723cd4eba87d: ``BaseMutation.mutate`` catches ``ValidationError`` only and
turns each into an error of the mutation's type (``field``, ``message``, ``code``), the code
mapped by ``get_error_code_from_error`` (None and Django's generic codes to ``"invalid"``) and then
serialised as a member of ``OrderErrorCode``, non-null: a code outside the enum fails the whole
mutation (``Expected a value of type "OrderErrorCode"``), and any other exception reaches the
client as "Internal Server Error" with the exception's class name as its code.
``OrderConfirm.perform_mutation`` calls ``update_order_status``, which locks the order, recomputes
its status from its fulfilments (an expired order becomes ``unfulfilled``) and saves it.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction

from .models import Order, OrderStatus

# OrderErrorCode's values (saleor/order/error_codes.py), the ones this test app needs.
ORDER_ERROR_CODES = {"invalid": "INVALID", "not_found": "NOT_FOUND", "required": "REQUIRED"}


class InternalServerError(Exception):
    """What Saleor's client sees for an exception no mutation handles (or a code no enum has)."""


def error_code(error: ValidationError) -> str:
    """``get_error_code_from_error``, then the enum's serialisation."""
    code = error.code or "invalid"
    if code not in ORDER_ERROR_CODES:
        raise InternalServerError(f'Expected a value of type "OrderErrorCode" but received: {code}')
    return ORDER_ERROR_CODES[code]


def update_order_status(order: Order) -> None:
    """Saleor's ``update_order_status``: the status as the fulfilments say, under the row lock."""
    with transaction.atomic():
        locked = Order.objects.select_for_update().get(pk=order.pk)
        order.status = OrderStatus.UNFULFILLED  # no fulfilment yet: what determine_order_status says
        if locked.status != order.status:
            order.save(update_fields=["status", "updated_at"])


def order_confirm(order: Order) -> dict[str, Any]:
    """``orderConfirm``: confirm an unconfirmed order (``get_instance`` checked it unlocked, before)."""
    try:
        if order.status != OrderStatus.UNCONFIRMED:
            raise ValidationError("Provided order id belongs to an order with status different than unconfirmed.",
                                  code="invalid")
        update_order_status(order)
    except ValidationError as error:
        return {"order": None, "errors": [{"field": None, "message": error.messages[0],
                                           "code": error_code(error)}]}
    except Exception as exc:  # noqa: BLE001 - Saleor's format_error
        raise InternalServerError(type(exc).__name__) from exc
    return {"order": order, "errors": []}
