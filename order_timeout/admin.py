from __future__ import annotations

from django.contrib import admin

from . import get_order_model
from .models import Order


class TimeoutOrderAdmin(admin.ModelAdmin):
    """Admin for any AbstractTimeoutOrder; reuse it for your own order model."""

    list_display = ("__str__", "status", "expires_at", "closed_at", "close_reason", "created_at")
    list_filter = ("status", "close_reason", "expires_at", "closed_at")
    date_hierarchy = "expires_at"
    readonly_fields = ("closed_at", "close_reason", "created_at")
    search_fields = ("=id",)


# Shops with their own order model register it themselves (see docs/existing-model.md).
if get_order_model() is Order:
    admin.site.register(Order, TimeoutOrderAdmin)
