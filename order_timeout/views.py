"""Views a shop can route: the backlog gauges for its existing Prometheus scrape.

    path("metrics/order-timeout", order_timeout.views.metrics)

It reads Redis (one round trip per shard) and counts the open dead letters;
protect it like your other metrics endpoints.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse

from .metrics import AVAILABLE, backlog_registry


def metrics(request: HttpRequest) -> HttpResponse:
    if not AVAILABLE:
        return HttpResponse("prometheus-client is not installed (the 'metrics' extra).\n",
                            status=501, content_type="text/plain")
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    return HttpResponse(generate_latest(backlog_registry()), content_type=CONTENT_TYPE_LATEST)
