"""A checkout a shop would route: one unpaid order per request, scheduled on commit."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from order_timeout import get_order_model


@csrf_exempt  # an API endpoint of the test project; a shop's checkout has its own protection
@require_POST
def checkout(request: HttpRequest) -> JsonResponse:
    order = get_order_model().objects.create()
    return JsonResponse({"order": str(order.pk)}, status=201)
