"""Every Redis key of one queue, built here and nowhere else.

All keys share the ``{KEY_PREFIX}`` hash tag, so every script touches one
Redis Cluster slot.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class QueueKeys:
    prefix: str

    def _key(self, name: str) -> str:
        return f"{{{self.prefix}}}:{name}"

    @property
    def pending(self) -> str:
        """Sorted set: member = order id, score = deadline (ms)."""
        return self._key("pending")

    @property
    def leased(self) -> str:
        """Sorted set: member = claimed order id, score = lease expiry (ms)."""
        return self._key("leased")

    @property
    def owners(self) -> str:
        """Hash: member = leased order id, value = token of the claim that holds the lease."""
        return self._key("owners")

    @property
    def attempts(self) -> str:
        """Hash: member = order id, value = failed close attempts so far."""
        return self._key("attempts")

    @property
    def first_failure(self) -> str:
        """Hash: member = order id, value = time of its first failed close (ms)."""
        return self._key("first-failure")

    @property
    def takeovers(self) -> str:
        """Hash: member = order id, value = times its lease ran out and another claim took it."""
        return self._key("takeovers")

    @property
    def busy(self) -> str:
        """Sorted set: member = order id whose row was locked elsewhere, score = first time (ms)."""
        return self._key("busy")

    @property
    def wake(self) -> str:
        """Pub/sub channel: a new earliest deadline (ms), for sleeping consumers."""
        return self._key("wake")

    @property
    def compensation_lock(self) -> str:
        """String: the token of the compensation scan running now, if any."""
        return self._key("compensation-lock")

    @property
    def scanning(self) -> str:
        """Hash: member = order id the scan started closing, value = scans that did not finish it."""
        return self._key("scanning")
