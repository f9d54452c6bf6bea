"""A checkout a shop would route: one unpaid order per request, scheduled on commit; and the
async endpoints a payment provider and a checkout page call later."""

from __future__ import annotations

from datetime import timedelta

from django.http import HttpRequest, JsonResponse
from django.shortcuts import aget_object_or_404
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from order_timeout import get_order_model
from order_timeout.exceptions import OrderClosed


@csrf_exempt  # an API endpoint of the test project; a shop's checkout has its own protection
@require_POST
def checkout(request: HttpRequest) -> JsonResponse:
    order = get_order_model().objects.create()
    return JsonResponse({"order": str(order.pk)}, status=201)


@csrf_exempt  # the provider's webhook; a real one checks the provider's signature instead
@require_POST
async def pay(request: HttpRequest, pk: str) -> JsonResponse:
    """The payment webhook: pay the order, or answer 409 so the provider refunds (the deadline won)."""
    order = await aget_object_or_404(get_order_model(), pk=pk)
    try:
        paid = await order.amark_paid()
    except OrderClosed:
        return JsonResponse({"order": str(order.pk), "error": "closed"}, status=409)
    # False: settled already (a retried webhook); still a 200, so the provider stops retrying.
    return JsonResponse({"order": str(order.pk), "paid": paid})


@csrf_exempt  # an API endpoint of the test project
@require_POST
async def extend(request: HttpRequest, pk: str) -> JsonResponse:
    """More (or less) time to pay: the deadline moves to ``seconds`` (POST) from now."""
    try:
        seconds = float(request.POST["seconds"])
    except (KeyError, ValueError):
        return JsonResponse({"error": "seconds: a number is required"}, status=400)
    order = await aget_object_or_404(get_order_model(), pk=pk)
    try:
        extended = await order.aextend_deadline(timezone.now() + timedelta(seconds=seconds))
    except OrderClosed:
        return JsonResponse({"order": str(order.pk), "error": "closed"}, status=409)
    return JsonResponse({"order": str(order.pk), "extended": extended,
                         "expires_at": order.expires_at.isoformat() if order.expires_at else None})
