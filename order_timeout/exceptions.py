"""The exceptions this app raises; catch ``OrderTimeoutError`` to catch them all."""


class OrderTimeoutError(Exception):
    """Base of every error raised by order_timeout."""


class QueueUnavailable(OrderTimeoutError):
    """Redis could not be reached or refused a command; the cause is chained."""


class OrderClosed(OrderTimeoutError):
    """The order was already closed (its deadline passed), so it cannot be paid or extended."""


class StaleOrderStatus(OrderTimeoutError):
    """A save would overwrite a paid or closed row with an older status (the object was stale)."""
