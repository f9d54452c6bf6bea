"""The shop's own admin, registered before the app's mixin is added (as a framework's would be)."""

from django.contrib import admin

from .models import ShopOrder


@admin.register(ShopOrder)
class ShopOrderAdmin(admin.ModelAdmin):
    list_display = ("number", "status", "total", "date_placed")
    list_filter = ("status",)
    search_fields = ("number",)

# What docs/existing-model.md tells a shop to do once the app is installed: put
# the deadline columns into the admin it already has.
from order_timeout.admin import extend_registered_admin  # noqa: E402

extend_registered_admin(ShopOrder)
