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

    @property
    def attempts(self) -> str:
        """Hash: member = order id, value = failed close attempts so far."""
        return f"{{{self.prefix}}}:attempts"

    @property
    def first_failure(self) -> str:
        """Hash: member = order id, value = time of its first failed close (ms)."""
        return f"{{{self.prefix}}}:first-failure"

    @property
    def wake(self) -> str:
        """Pub/sub channel: a new earliest deadline (ms), for sleeping consumers."""
        return f"{{{self.prefix}}}:wake"

    @property
    def compensation_lock(self) -> str:
        """String: the token of the compensation scan running now, if any."""
        return f"{{{self.prefix}}}:compensation-lock"
