"""The exceptions this app raises; catch ``OrderTimeoutError`` to catch them all."""


class OrderTimeoutError(Exception):
    """Base of every error raised by order_timeout."""


class QueueUnavailable(OrderTimeoutError):
    """Redis could not be reached or refused a command; the cause is chained."""


class OrderClosed(OrderTimeoutError):
    """The order was already closed (its deadline passed), so it cannot be paid or extended."""


class StaleOrderStatus(OrderTimeoutError):
    """A save would overwrite a paid or closed row with an older status (the object was stale)."""


class ImmediateShutdown(SystemExit):
    """The consumer was told twice to stop: leave now, whatever is in hand.

    The one exception a receiver's close does not catch; whatever was claimed
    stays leased and another consumer takes it over.
    """


class RepeatedTakeover(OrderTimeoutError):
    """The order's consumer died, froze or overran its lease with it too often: a dead letter."""
