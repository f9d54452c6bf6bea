from django.apps import AppConfig


class ShopConfig(AppConfig):
    name = "testproject.shop"
    label = "shop"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        import os

        from order_timeout.signals import deadline_approaching, order_expired, order_keys_expired, orders_expired

        from .models import PlainOrderDeadline, ShopOrder
        from .receivers import (
            cancel_plain_order,
            notify_expired,
            notify_reminder,
            record_expiry,
            record_expiry_keys,
            record_reminder,
            release_stock,
            release_stock_of,
            write_status_change,
            write_status_changes,
        )

        # The benchmark turns this off: an INSERT per close would measure the shop, not us.
        if os.environ.get("SHOP_RECORD_EXPIRIES", "1") == "1":
            order_expired.connect(record_expiry, dispatch_uid="shop.record_expiry")
        # The same record from the batch's keys alone: the close builds no instance for it.
        if os.environ.get("SHOP_RECORD_EXPIRY_KEYS") == "1":
            order_keys_expired.connect(record_expiry_keys, dispatch_uid="shop.record_expiry_keys")
        if os.environ.get("SHOP_BATCH_RECEIVERS") == "1":
            # The same close, a batch at a time: one INSERT and one UPDATE per batch.
            orders_expired.connect(write_status_changes, sender=ShopOrder,
                                   dispatch_uid="shop.write_status_changes")
            if os.environ.get("SHOP_RELEASE_STOCK", "1") == "1":
                orders_expired.connect(release_stock_of, sender=ShopOrder, dispatch_uid="shop.release_stock_of")
        else:
            order_expired.connect(write_status_change, sender=ShopOrder,
                                  dispatch_uid="shop.write_status_change")
            # The benchmark's shop-style row measures the status-change row alone.
            if os.environ.get("SHOP_RELEASE_STOCK", "1") == "1":
                order_expired.connect(release_stock, sender=ShopOrder, dispatch_uid="shop.release_stock")
        order_expired.connect(cancel_plain_order, sender=PlainOrderDeadline,
                              dispatch_uid="shop.cancel_plain_order")
        # The benchmark turns this off too: the row per reminder would measure the shop, not us.
        if os.environ.get("SHOP_RECORD_REMINDERS", "1") == "1":
            deadline_approaching.connect(record_reminder, dispatch_uid="shop.record_reminder")
        # What the shop tells its customers goes through notices (testproject/shop/notices.py):
        # the benchmark's plain rows turn them off, its notices row measures them.
        if os.environ.get("SHOP_NOTICES", "1") == "1":
            orders_expired.connect(notify_expired, dispatch_uid="shop.notify_expired")
            deadline_approaching.connect(notify_reminder, dispatch_uid="shop.notify_reminder")
