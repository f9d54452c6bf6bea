"""The settings every chaos process runs with, and the sizes of a quick and a full run.

Small on purpose, so a whole run takes minutes: a lease of 2 s, retries after
1 s and 2 s, a scan every 5 s closing what is 5 s overdue, a held order looked
at every second. The same values reach every process (as ``ORDER_TIMEOUT_*``
variables read by ``chaos.settings``) and the bounds the harness holds them to
(``chaos.bounds``). A hold condition and reminders are turned on only by the
scenarios about them (``Lab.payment_settings``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from order_timeout.conf import DEFAULTS

# Shards of a --redis-cluster run's queue: as many as the private cluster has primaries.
CLUSTER_SHARDS = 3

# The app's own LEASE_SECONDS, for the scenarios that show a death costs a heartbeat, not a
# lease: their consumers run with it instead of the tuning's short one.
DEFAULT_LEASE_SECONDS = float(DEFAULTS["LEASE_SECONDS"])


@dataclass(frozen=True)
class Tuning:
    lease_seconds: float = 2.0
    # The default: a consumer found dead in HEARTBEAT_SECONDS, its queue lost in a third of it.
    heartbeat_seconds: float = 1.5
    retry_delays: tuple[float, ...] = (1.0, 2.0)
    max_takeovers: int = 3
    # At least LEASE_SECONDS + sum(RETRY_DELAYS) (check order_timeout.W004).
    compensation_grace: float = 5.0
    compensation_interval: float = 5.0
    compensation_lock_seconds: float = 10.0
    # A quarter of the default, as the lease is a fifteenth of it: a batch (two queries
    # per order in the receivers here) must end well inside LEASE_SECONDS even when the
    # 2-core machine is busy ("choose LEASE_SECONDS longer than your slowest batch").
    batch_size: int = 50
    max_wait: float = 1.0
    schedule_timeout: float = 0.1
    # A held order (a payment in flight) is looked at again this often: a thirtieth of the
    # default, so a failed payment's order closes within a second or so of the failure.
    hold_recheck: float = 1.0
    # HOLD_CONDITION of the held-payments scenario: the test shop's "a payment is pending".
    hold_condition: str = "testproject.shop.payments.in_flight"
    # REMINDERS of the reminders scenario, in seconds before the deadline. The first is
    # longer than the consumer-death bound (LEASE_SECONDS + slack), so it is owed even
    # when its consumer is killed holding it; the second is shorter than LEASE_SECONDS,
    # so a consumer killed holding it loses it: taken over after the deadline, it is
    # dropped (never sent after the deadline). docs/reliability.md says what is held then.
    reminders: tuple[float, ...] = (6.0, 1.0)
    # NOTICE_RETRY_DELAYS: a notice whose target refuses is tried again after each (63.5 s in
    # all, twice the longest refusal of the notices scenario), then a dead letter. Doubling,
    # as the default does, from half a second: a target back is found within a step of it.
    notice_retry_delays: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)
    key_prefix: str = "chaos"
    # SHARDS: one on a standalone Redis; on a cluster, one per primary (CLUSTER_SHARDS).
    shards: int = 1
    order_model: str = "order_timeout.Order"

    def environment(self) -> dict[str, str]:
        """The ``ORDER_TIMEOUT_*`` variables that give a process these settings."""
        values = {
            "LEASE_SECONDS": self.lease_seconds, "HEARTBEAT_SECONDS": self.heartbeat_seconds,
            "RETRY_DELAYS": list(self.retry_delays),
            "MAX_TAKEOVERS": self.max_takeovers, "COMPENSATION_GRACE": self.compensation_grace,
            "COMPENSATION_INTERVAL": self.compensation_interval,
            "COMPENSATION_LOCK_SECONDS": self.compensation_lock_seconds,
            "BATCH_SIZE": self.batch_size, "MAX_WAIT": self.max_wait,
            "SCHEDULE_TIMEOUT": self.schedule_timeout, "HOLD_RECHECK": self.hold_recheck,
        }
        env = {f"ORDER_TIMEOUT_{key}": json.dumps(value) for key, value in values.items()}
        # Read by the test project itself, as "0.5,1,2".
        env["ORDER_TIMEOUT_NOTICE_RETRY_DELAYS"] = ",".join(f"{delay:g}" for delay in self.notice_retry_delays)
        env["ORDER_TIMEOUT_KEY_PREFIX"] = self.key_prefix
        env["ORDER_TIMEOUT_SHARDS"] = str(self.shards)
        env["ORDER_TIMEOUT_ORDER_MODEL"] = self.order_model
        return env

    def payment_settings(self, *, holds: bool = False, reminders: bool = False) -> dict[str, Any]:
        """The ``ORDER_TIMEOUT`` keys of the payment scenarios: a hold condition, reminders."""
        keys: dict[str, Any] = {}
        if holds:
            keys["HOLD_CONDITION"] = self.hold_condition
        if reminders:
            keys["REMINDERS"] = list(self.reminders)
        return keys

    def payment_environment(self, *, holds: bool = False, reminders: bool = False) -> dict[str, str]:
        """The same keys as the test project reads them from the environment (a dotted path, "6,1")."""
        env: dict[str, str] = {}
        if holds:
            env["ORDER_TIMEOUT_HOLD_CONDITION"] = self.hold_condition
        if reminders:
            env["ORDER_TIMEOUT_REMINDERS"] = ",".join(f"{seconds:g}" for seconds in self.reminders)
        return env

    def as_dict(self) -> dict[str, object]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


@dataclass(frozen=True)
class Sizes:
    """How big one scenario is."""

    # Orders created per scenario (some scenarios add a few more, or pay or delete some).
    orders: int
    # Seconds over which their deadlines fall, starting ``lead`` seconds after creation.
    spread: float
    lead: float
    # Misbehaving orders per receiver behaviour in the receivers scenario ("exit": as
    # many exits and as many overruns, after one hang), and per pause point in the
    # sigstop scenario ("pause": after a claim, and as many in the close).
    misbehaving: dict[str, int] = field(default_factory=dict)
    # Seconds the webhook target refuses every notice (503) in the notices scenario.
    refusal: float = 30.0
    # Orders due in one millisecond in the slow-receivers scenario: a backlog that its two
    # consumers work through at their receivers' pace (20 ms an order: 6 s with --quick).
    burst: int = 600

    def count(self, share: float, at_least: int = 1) -> int:
        """A share of ``orders``, never fewer than ``at_least``."""
        return max(at_least, round(self.orders * share))


QUICK = Sizes(orders=300, spread=3.0, lead=1.0,
              misbehaving={"raise": 4, "flaky": 6, "exit": 1, "pause": 2}, refusal=5.0, burst=600)
# 400 deadlines a second: headroom on the 2-core machine, so that a bound measures how a
# fault heals rather than whether the machine keeps up (``--spread`` changes it).
FULL = Sizes(orders=10_000, spread=25.0, lead=3.0,
             misbehaving={"raise": 40, "flaky": 60, "exit": 3, "pause": 5}, burst=6_000)
