from django.contrib import admin
from django.urls import path

from order_timeout import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("metrics/order-timeout", views.metrics),
]
