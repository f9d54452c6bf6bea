"""The shop's REST API (Django REST framework): its payment gateway's capture, paying the order.

Only routed where DRF is installed (``testproject/urls.py``).
"""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from order_timeout import get_order_model

from .models import PaymentState


class PayOrder(APIView):
    """POST: the capture recorded (a succeeded payment of the order), then ``mark_paid()``; an order
    its deadline closed first answers 409 (the app's handler), which under ``ATOMIC_REQUESTS`` also
    rolls the recorded payment back."""

    def post(self, request: Request, pk: str) -> Response:
        order = get_object_or_404(get_order_model(), pk=pk)
        order.payments.create(state=PaymentState.SUCCEEDED)
        return Response({"order": str(order.pk), "paid": order.mark_paid()})
