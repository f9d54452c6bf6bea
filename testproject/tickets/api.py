"""The ticket shop's REST API (Django REST framework): its app confirms a payment through it.

Only routed where DRF is installed (``testproject/urls.py``); the app's refusals answer 409
through ``order_timeout.contrib.rest_framework.exception_handler`` (``REST_FRAMEWORK`` in the
settings).
"""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from .models import Payment
from .payments import confirm


class PaymentConfirm(APIView):
    """POST: ``confirm()`` the payment, outside a transaction, as the shop's API does."""

    def post(self, request: Request, pk: int) -> Response:
        payment = get_object_or_404(Payment, pk=pk)
        return Response({"payment": payment.pk, "result": confirm(payment.pk)})
