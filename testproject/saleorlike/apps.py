from django.apps import AppConfig


class SaleorlikeConfig(AppConfig):
    name = "testproject.saleorlike"
    default_auto_field = "django.db.models.AutoField"

    def ready(self) -> None:
        import os

        # The shops' own test modules (testproject/*/tests) run as the shop's project would, its
        # timers declared at start-up (the app's own suite registers them per test instead).
        if os.environ.get("SHOP_DECLARES_EVERY_TIMER") == "1":
            from order_timeout import timers

            from .expiry import UnconfirmedOrderExpires
            from .models import Order

            timers.register(Order)(UnconfirmedOrderExpires)
