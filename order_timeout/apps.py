from __future__ import annotations

from django.apps import AppConfig
from django.db.models.signals import post_delete, post_save
from django.utils.translation import gettext_lazy as _


class OrderTimeoutConfig(AppConfig):
    name = "order_timeout"
    verbose_name = _("Order timeout")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401  (registers the system checks)
        from . import get_order_model
        from .conf import settings
        from .signals import order_deleted, order_saved

        # Fail at start-up, naming the key, rather than on the first order.
        settings.load()
        model = get_order_model()
        post_save.connect(order_saved, sender=model, dispatch_uid="order_timeout.order_saved")
        post_delete.connect(order_deleted, sender=model, dispatch_uid="order_timeout.order_deleted")
