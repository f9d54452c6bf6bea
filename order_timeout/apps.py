from __future__ import annotations

from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules
from django.utils.translation import gettext_lazy as _


class OrderTimeoutConfig(AppConfig):
    name = "order_timeout"
    verbose_name = _("Order timeout")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import (
            checks,  # noqa: F401  (registers the system checks)
            get_order_model,
        )
        from .conf import settings
        from .scheduling import connect_receivers

        # Fail at start-up, naming the key, rather than on the first order.
        settings.load()
        if settings.closes_orders():
            connect_receivers(get_order_model())
        # The timers shops declare in a timers.py of their apps, as admin.py is found.
        autodiscover_modules("timers")
        # And the notice handlers they declare in a notices.py (or in that timers.py).
        autodiscover_modules("notices")
