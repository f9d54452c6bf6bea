"""A test app shaped like a ticket shop: a Django shop of its own that adopts the app from outside.

What adopting it meets: its ``TicketOrder`` has its own deadline column (``pay_by``, indexed)
and an ``auto_now`` column its API syncs on (``last_modified``); its payment confirmation reads
the order and writes "paid" later from what it read, without a row lock (``payments.py``); its
own closer is a receiver of the shop's periodic ``tick`` signal, not a beat entry
(``closer.py``), and is switched off with ``TICKETS_OWN_CLOSER = False``; and a seat hold whose
deadline column has no index, which the shop cannot index (a framework's), is mirrored into the
app's own table. ``expiry.py`` is the shop's own declaration of the app's timers.
"""
