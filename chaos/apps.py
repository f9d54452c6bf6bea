from django.apps import AppConfig


class ChaosConfig(AppConfig):
    """Installed only in the chaos harness's processes: records every committed close (and slows
    reminders as much as closes, where a scenario slows deliveries)."""

    name = "chaos"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from order_timeout.signals import deadline_approaching, order_expired

        from . import pauses, receivers, tracing

        order_expired.connect(receivers.record_delivery, dispatch_uid="chaos.record_delivery")
        deadline_approaching.connect(receivers.slow_reminder, dispatch_uid="chaos.slow_reminder")
        pauses.install_if_asked()
        tracing.install_if_asked()
