from django.apps import AppConfig
from django.conf import settings


class TicketsConfig(AppConfig):
    name = "testproject.tickets"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        import os

        from .closer import connect_own_closer

        # The shops' own test modules (testproject/*/tests) run as the shop's project would after
        # its switch-over: its timers declared at start-up, its own closer gone.
        if os.environ.get("SHOP_DECLARES_EVERY_TIMER") == "1":
            from order_timeout import timers

            from .expiry import SeatHoldLapses, TicketOrderExpires
            from .models import SeatHold, TicketOrder

            timers.register(TicketOrder)(TicketOrderExpires)
            timers.register(SeatHold)(SeatHoldLapses)
            return
        # The shop's own closer, until the switch-over turns it off (docs/existing-model.md).
        if getattr(settings, "TICKETS_OWN_CLOSER", True):
            connect_own_closer()
