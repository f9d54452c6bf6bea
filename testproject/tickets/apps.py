from django.apps import AppConfig
from django.conf import settings


class TicketsConfig(AppConfig):
    name = "testproject.tickets"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from .closer import connect_own_closer

        # The shop's own closer, until the switch-over turns it off (docs/existing-model.md).
        if getattr(settings, "TICKETS_OWN_CLOSER", True):
            connect_own_closer()
