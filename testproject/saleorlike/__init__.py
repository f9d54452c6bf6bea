"""A test app shaped like Saleor's order: not Saleor (CI cannot fetch it), what adopting it meets.

Its ``Order`` is a framework's model the shop does not edit: a UUID key, a status with no
paid value (``unconfirmed`` waits for payment or for staff; ``unfulfilled`` and on are
confirmed), a separate ``charge_status``, a channel that gives the payment window
(``expire_orders_after``, minutes from ``created_at``), stock allocations, order events, and a
default status (``unfulfilled``) that fixtures rewrite to ``unconfirmed`` after creating the row.
``expiry.py`` is the shop's own small app's timer, as docs/saleor.md declares it for Saleor.
"""
