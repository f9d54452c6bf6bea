"""The shop's REST API (Django REST framework): its payment provider's capture, paying the order.

Only routed where DRF is installed (``testproject/urls.py``).
"""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from order_timeout import get_order_model


class PayOrder(APIView):
    """POST: ``mark_paid()``; an order its deadline closed first answers 409 (the app's handler)."""

    def post(self, request: Request, pk: str) -> Response:
        order = get_object_or_404(get_order_model(), pk=pk)
        return Response({"order": str(order.pk), "paid": order.mark_paid()})
