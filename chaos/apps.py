from django.apps import AppConfig


class ChaosConfig(AppConfig):
    """Installed only in the chaos harness's processes: records every committed close."""

    name = "chaos"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from order_timeout.signals import order_expired

        from . import pauses, receivers, tracing

        order_expired.connect(receivers.record_delivery, dispatch_uid="chaos.record_delivery")
        pauses.install_if_asked()
        tracing.install_if_asked()
