"""The webhook's far end in the soak: the fault runs' sink, counting what it would otherwise keep.

``chaos.sink.Sink`` keeps every request (its body, its sender) for the notices scenario to read
again; a soak of 30 minutes at 100 orders a second would keep 180,000 of them in the harness's
memory, which the soak also measures. This one keeps, per request, only what the soak's checks
need: the order each accepted key names, the keys that name none of the soak's orders, and the
counts (requests, repeats, refused, unsigned, cut short).
"""

from __future__ import annotations

import threading

from ..sink import Request, Sink

# Strays kept by name for the report (the count is kept whole).
KEPT_STRAYS = 5


class CountingSink(Sink):
    """Accepts every notice (it never refuses, never holds), and counts."""

    def __init__(self, *, secret: str, key_prefix: str) -> None:
        super().__init__(secret=secret)
        # A notice's key is ``{handler}:{order model label, lower}:{pk}`` (the shop's notify_expired).
        self.key_prefix = key_prefix
        self.accepted: set[int] = set()
        self.received = 0
        self.repeats = 0
        self.refused = 0
        self.unsigned = 0
        self.cut_short = 0
        self.strays = 0
        self.stray_keys: list[str] = []
        self._counting = threading.Lock()

    def record(self, request: Request) -> None:
        with self._counting:
            self.received += 1
            if not request.complete:
                self.cut_short += 1
                return
            if not request.signed:
                self.unsigned += 1
            if not request.accepted:
                self.refused += 1
                return
            pk = request.key.removeprefix(self.key_prefix)
            if not request.key.startswith(self.key_prefix) or not pk.isdigit():
                self.strays += 1
                if len(self.stray_keys) < KEPT_STRAYS:
                    self.stray_keys.append(request.key)
            elif int(pk) in self.accepted:
                self.repeats += 1
            else:
                self.accepted.add(int(pk))

    def accepted_orders(self) -> set[int]:
        with self._counting:
            return set(self.accepted)
