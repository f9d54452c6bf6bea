"""Views a shop can route: the backlog gauges for its existing Prometheus scrape.

    path("metrics/order-timeout", order_timeout.views.metrics)

Not public: a request needs a logged-in user with the permission
``order_timeout.view_timeoutoverview`` or, for a scraper, the bearer token of
``ORDER_TIMEOUT["METRICS_TOKEN"]`` (``Authorization: Bearer <token>``);
anything else is answered 403. Each request costs one pipelined Redis round
trip per shard, one GET (the drift) and one COUNT of the open dead letters:
scrape it every 15 s or slower.
"""

from __future__ import annotations

import hmac

from django.http import HttpRequest, HttpResponse, HttpResponseForbidden

from .conf import settings
from .reporting.metrics import AVAILABLE, backlog_registry

# The permission of the admin's "Order timeouts" page: who may see the figures there may read them here.
METRICS_PERMISSION = "order_timeout.view_timeoutoverview"


def metrics(request: HttpRequest) -> HttpResponse:
    if not may_read_metrics(request):
        return HttpResponseForbidden(
            "The order timeout metrics need a login with the permission view_timeoutoverview "
            "or the bearer token of ORDER_TIMEOUT['METRICS_TOKEN'].\n", content_type="text/plain")
    if not AVAILABLE:
        return HttpResponse("prometheus-client is not installed (the 'metrics' extra).\n",
                            status=501, content_type="text/plain")
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    return HttpResponse(generate_latest(backlog_registry()), content_type=CONTENT_TYPE_LATEST)


def may_read_metrics(request: HttpRequest) -> bool:
    """A bearer token equal to ``METRICS_TOKEN`` (when set), or a user with the overview's permission."""
    token = settings.METRICS_TOKEN
    if token is not None:
        scheme, _, offered = request.headers.get("Authorization", "").partition(" ")
        # compare_digest: the time taken does not tell how much of a guess was right.
        if scheme.lower() == "bearer" and hmac.compare_digest(offered.encode(), token.encode()):
            return True
    user = getattr(request, "user", None)
    return bool(user is not None and user.is_authenticated and user.has_perm(METRICS_PERMISSION))
