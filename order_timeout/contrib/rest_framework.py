"""Django REST framework answers the app's refusals with a 409 that names the order.

DRF renders its own ``APIException``s, ``Http404`` and ``PermissionDenied``; anything else, the
app's refusals among them (they are Django ``ValidationError``s, which DRF does not handle), is
a 500. With this handler in the settings::

    REST_FRAMEWORK = {"EXCEPTION_HANDLER": "order_timeout.contrib.rest_framework.exception_handler"}

``OrderClosed`` and ``StaleOrderStatus`` answer ``409 Conflict`` with a body that says which order,
what happened and what to do; every other exception goes to DRF's own handler, as before.

DRF is imported when the handler runs, never by the app: a shop without DRF needs none, and the
package does not depend on it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.utils.translation import gettext as _

from ..exceptions import OrderClosed, Refused, StaleOrderStatus

if TYPE_CHECKING:
    from rest_framework.response import Response

CONFLICT = 409


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF's ``EXCEPTION_HANDLER``: a refusal is a 409 (the request's transaction marked for
    rollback, as DRF does for its own errors); anything else is DRF's own handler's."""
    from rest_framework.response import Response
    from rest_framework.views import exception_handler as drf_exception_handler, set_rollback

    if not isinstance(exc, (OrderClosed, StaleOrderStatus)):
        return drf_exception_handler(exc, context)
    set_rollback()
    return Response(refusal_body(exc), status=CONFLICT)


def refusal_body(refusal: Refused) -> dict[str, Any]:
    """What the 409 says: ``code`` (the refusal's ``reason``), ``detail`` (its message), ``order``
    (``model`` label and ``pk``; None for a refusal raised without them), ``timer``, and in words
    ``what_happened`` and ``what_to_do``."""
    order = None if refusal.model_label is None else {"model": refusal.model_label, "pk": refusal.pk}
    if isinstance(refusal, OrderClosed):
        happened = _("The order was closed by its deadline before this write; nothing was written.")
        to_do = _("Refund what was paid for it: a closed order is not paid any more.")
    else:
        happened = _("The order was acted on by its timer %(timer)s after this copy of it was read; "
                     "nothing was written.") % {"timer": refusal.timer or "?"}
        to_do = _("Read the order again: what was taken for it meanwhile (a payment) is refunded, or "
                  "accepted on the shop's own path for an order in that state.")
    return {"code": refusal.reason, "detail": str(refusal), "order": order, "timer": refusal.timer,
            "what_happened": happened, "what_to_do": to_do}
