"""Django REST framework answers the app's refusals with a 409 that names the order.

DRF renders its own ``APIException``s, ``Http404`` and ``PermissionDenied``; anything else, the
app's refusals among them (they are Django ``ValidationError``s, which DRF does not handle), is
a 500. Add this handler to the ``REST_FRAMEWORK`` you have (never replace the dict: its
authentication and permissions would go with it)::

    REST_FRAMEWORK["EXCEPTION_HANDLER"] = "order_timeout.contrib.rest_framework.exception_handler"

or, where the project has a handler of its own, call ``refusal_response`` first in it (see
docs/existing-model.md). ``OrderClosed`` and ``StaleOrderStatus`` answer ``409 Conflict`` with a
body that says which order (by the name its clients know), what was and was not written, and what
to do; every other exception goes to DRF's own handler, as before.

DRF is imported when the handler runs, never by the app: a shop without DRF needs none, and the
package does not depend on it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.apps import apps
from django.db import DEFAULT_DB_ALIAS, connections, router
from django.utils.translation import gettext as _

from ..exceptions import OrderClosed, Refused, StaleOrderStatus

if TYPE_CHECKING:
    from rest_framework.response import Response

CONFLICT = 409


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF's ``EXCEPTION_HANDLER``: a refusal is a 409 (``refusal_response``); anything else is
    DRF's own handler's."""
    from rest_framework.views import exception_handler as drf_exception_handler

    response = refusal_response(exc, context)
    return response if response is not None else drf_exception_handler(exc, context)


def refusal_response(exc: Exception, context: dict[str, Any]) -> Response | None:
    """The 409 for a refusal, None for any other exception: for a project's own handler to call
    first. The request's transaction is marked for rollback (under ``ATOMIC_REQUESTS``), as DRF
    does for its own errors, and the body says whether it was."""
    from rest_framework.response import Response
    from rest_framework.views import set_rollback

    if not isinstance(exc, (OrderClosed, StaleOrderStatus)):
        return None
    set_rollback()
    return Response(refusal_body(exc, rolled_back=_request_rolled_back(exc)), status=CONFLICT)


def _request_rolled_back(refusal: Refused) -> bool:
    """Whether the request's transaction on the refused row's database will be rolled back: an
    ``ATOMIC_REQUESTS`` transaction marked so. Without one, what the request wrote before the
    refusal was committed as it went."""
    using = DEFAULT_DB_ALIAS
    if refusal.model_label:
        try:
            using = router.db_for_write(apps.get_model(refusal.model_label))
        except (LookupError, ValueError):
            pass
    connection = connections[using]
    return bool(connection.settings_dict.get("ATOMIC_REQUESTS") and connection.in_atomic_block
                and connection.needs_rollback)


def refusal_body(refusal: Refused, *, rolled_back: bool = False) -> dict[str, Any]:
    """What the 409 says: ``code`` (the refusal's ``reason``), ``detail`` (its message),
    ``order`` (``model`` label, ``pk`` and ``name``, the public name the shop's clients know; None
    for a refusal raised without them), ``timer``, ``written`` (``refused_write``: always False;
    ``request_rolled_back``: whether what the request wrote before the refusal was rolled back),
    ``refused_write`` (the id of the row staff see; None when none was recorded), and in words
    ``what_happened`` and ``what_to_do``."""
    order = None if refusal.model_label is None else {
        "model": refusal.model_label, "pk": refusal.pk, "name": refusal.public_name}
    if isinstance(refusal, OrderClosed):
        happened = _("The order was closed by its deadline before this write. The refused write was not made.")
        to_do = _("Refund what was paid for it: a closed order is not paid any more.")
    else:
        happened = _("The order was acted on by its timer %(timer)s after this copy of it was read. "
                     "The refused write was not made.") % {"timer": refusal.timer or "?"}
        to_do = _("Read the order again: what was taken for it meanwhile (a payment) is refunded, or "
                  "accepted on the shop's own path for an order in that state.")
    if rolled_back:
        happened += " " + _("Nothing else this request wrote was kept: its transaction was rolled back.")
    else:
        happened += " " + _("What this request committed before the refusal stands (a payment's "
                            "confirmation, a log entry): it was not rolled back.")
    if refusal.refused_write_id is not None:
        to_do += " " + _("Staff see this refusal as refused write #%(id)s.") % {"id": refusal.refused_write_id}
    return {"code": refusal.reason, "detail": str(refusal), "order": order, "timer": refusal.timer,
            "written": {"refused_write": False, "request_rolled_back": rolled_back},
            "refused_write": refusal.refused_write_id, "what_happened": happened, "what_to_do": to_do}
