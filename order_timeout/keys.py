"""Every Redis key of one queue, built here and nowhere else.

All keys share the ``{KEY_PREFIX}`` hash tag, so every script touches one
Redis Cluster slot.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class QueueKeys:
    prefix: str

    @property
    def pending(self) -> str:
        """Sorted set: member = order id, score = deadline (ms)."""
        return f"{{{self.prefix}}}:pending"

    @property
    def leased(self) -> str:
        """Sorted set: member = claimed order id, score = lease expiry (ms)."""
        return f"{{{self.prefix}}}:leased"
