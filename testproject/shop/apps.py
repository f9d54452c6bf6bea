from django.apps import AppConfig


class ShopConfig(AppConfig):
    name = "testproject.shop"
    label = "shop"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from order_timeout.signals import order_expired

        from .receivers import record_expiry

        order_expired.connect(record_expiry, dispatch_uid="shop.record_expiry")
