from importlib.util import find_spec

from django.contrib import admin
from django.urls import path

from order_timeout import views
from testproject.shop import views as shop_views

urlpatterns = [
    path("admin/", admin.site.urls),
    # Not public: a login with view_timeoutoverview, or ORDER_TIMEOUT["METRICS_TOKEN"] as a bearer token.
    path("metrics/order-timeout", views.metrics),
    path("shop/checkout", shop_views.checkout),
    # Async views: the payment provider's webhook, and a new deadline for an unpaid order.
    path("shop/orders/<str:pk>/pay", shop_views.pay),
    path("shop/orders/<str:pk>/extend", shop_views.extend),
]

if find_spec("rest_framework") is not None:  # the shops' REST APIs, where DRF is installed
    from testproject.shop.api import PayOrder
    from testproject.tickets.api import PaymentConfirm

    urlpatterns += [
        path("shop/api/orders/<str:pk>/pay", PayOrder.as_view()),
        path("tickets/api/payments/<int:pk>/confirm", PaymentConfirm.as_view()),
    ]
