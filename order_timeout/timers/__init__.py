"""Timers: the one lifecycle, and the kinds of timed transition that run on it.

For a shop, this is where a timer is declared (docs/timers.md)::

    from order_timeout import timers

    @timers.register(StockReservation)
    class ReservationLapses(timers.Timer):
        deadline = "expires_at"
        pending = Q(state="held")
        values = {"state": "released"}

``Timer`` says what differs; ``register`` declares it for a model; ``NOW`` in
``values`` is the database's time of the act; ``registry`` lists the kinds.
"""

from .declaration import NOW, Timer
from .registry import AlreadyRegistered, register, registry

__all__ = ["NOW", "AlreadyRegistered", "Timer", "register", "registry"]
