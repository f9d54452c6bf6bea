"""How late a close may be, by path: the bounds of docs/design.md ("How late can a close be").

Each bound is the sum of the settings that make it up, plus ``SLACK`` for
what no setting covers on a busy 2-core machine (scheduling, a process
starting, a batch ahead in the queue). Some run from the deadline (faults the
consumers heal by themselves: a death, a failing receiver); the others from
the later of the deadline and the moment the fault healed (an outage ended,
Redis came back; for an order held by a payment in flight, the moment its
payment failed).
"""

from __future__ import annotations

from dataclasses import dataclass

from order_timeout.consumer import ERROR_BACKOFF_FIRST, ERROR_BACKOFF_MAX

from .tuning import Tuning

# Seconds of scheduling and start-up noise on the harness's 2-core machine.
SLACK = 3.0
# The normal path: a consumer running, the member in Redis.
NORMAL = 2.0


@dataclass(frozen=True)
class Bound:
    path: str
    seconds: float
    # The sum, in the settings' names.
    formula: str
    # Measured from max(deadline, heal) rather than from the deadline (for an order held
    # by a payment in flight, the heal is its payment's failure: chaos.Settlement).
    from_heal: bool = False
    # Add the scenario's longest compensation scan (tick to end of the close scan).
    plus_scan: bool = False

    def total(self, scan_seconds: float) -> float:
        return self.seconds + (scan_seconds if self.plus_scan else 0.0)

    def describe(self, scan_seconds: float) -> str:
        scan = f" + scan {scan_seconds:.1f}" if self.plus_scan else ""
        return f"{self.formula}{scan} = {self.total(scan_seconds):.1f} s"


def normal(t: Tuning) -> Bound:
    return Bound("normal path", NORMAL, f"normal {NORMAL:g}")


def consumer_death(t: Tuning) -> Bound:
    """Its consumer died or froze mid-batch: the next claim after its heartbeat (or, at the most,
    its lease) ran out takes the batch over whole."""
    return Bound("consumer death", t.lease_seconds + SLACK,
                 f"LEASE {t.lease_seconds:g} + slack {SLACK:g}")


def death_found_by_heartbeat(t: Tuning) -> Bound:
    """Its consumer died or froze mid-batch, at the default LEASE_SECONDS (30 s): the lease is
    not waited out. Another consumer's beat finds the heartbeat gone (HEARTBEAT_SECONDS, then
    its next beat, a third of it later), ends the dead one's database session (a frozen
    consumer's row locks go with it) and the next claim takes the batch over whole. Issue 27's
    target (3 s at the benchmark's pace) is that, before the slack."""
    death = t.heartbeat_seconds * 4 / 3
    return Bound("consumer death, heartbeats only", death + SLACK,
                 f"HEARTBEAT + HEARTBEAT/3 {death:.1f} + slack {SLACK:g}")


def batch_of_a_killer(t: Tuning) -> Bound:
    """Its batch held a member whose receiver kills or hangs its consumers: the batch is taken
    over whole after the first death and dies again with that member, then each is taken alone."""
    return Bound("consumer death, its batch taken over again", 2 * t.lease_seconds + SLACK,
                 f"2 x LEASE {2 * t.lease_seconds:g} + slack {SLACK:g}")


def poisoned_batch(t: Tuning) -> Bound:
    """The other members of a batch whose member kills every consumer that takes it, at the
    default lease: two deaths (the batch taken over whole, dies again, then each member alone),
    each found by another consumer's beat once the dead one's heartbeat ran out. Issue 27's
    target (5 s) is that: 2 x (HEARTBEAT + HEARTBEAT/3) and a second for the closes."""
    death = t.heartbeat_seconds * 4 / 3
    seconds = 2 * death + 1.0
    return Bound("batch of a poison member, heartbeats only", seconds,
                 f"2 x (HEARTBEAT + HEARTBEAT/3) {2 * death:.1f} + 1")


def poison_buried(t: Tuning) -> Bound:
    """The member that kills every holder: a dead letter after MAX_TAKEOVERS + 1 deaths, each a
    heartbeat's run-out and a beat, plus its holder's restart when no other consumer is free.
    Issue 27's target: 20 s."""
    deaths = t.max_takeovers + 1
    death = t.heartbeat_seconds * 4 / 3
    seconds = deaths * (death + RESTART) + SLACK
    return Bound("poison member buried, heartbeats only", seconds,
                 f"(MAX_TAKEOVERS + 1) {deaths} x (HEARTBEAT + HEARTBEAT/3 {death:.1f} + restart "
                 f"{RESTART:g}) + slack {SLACK:g}")


# Seconds a consumer takes from its start to its first claim (Django set-up), on the CI machine.
RESTART = 2.0


def receiver_pace(orders: int, each: float, consumers: int) -> Bound:
    """A burst due at once whose receivers are slow but healthy: drained within twice the time its
    receivers take, shared by the consumers. The other half is for the claims, the row locks and
    the one batch each consumer gives up for time while it learns how many fit (timers/sizing.py).
    From the deadline, which every order of the burst shares: so, from the first deadline."""
    receivers = orders * each / consumers
    return Bound("a burst at its receivers' pace", 2 * receivers,
                 f"2 x {orders:,} orders x {1000 * each:g} ms / {consumers} consumers")


def hold_released(t: Tuning) -> Bound:
    """A held order whose payment failed: closed at the next look (every HOLD_RECHECK), whose
    consumer may die holding it (a lease). From the later of the deadline and the failure."""
    return Bound("hold released, consumer death", t.hold_recheck + t.lease_seconds + SLACK,
                 f"HOLD_RECHECK {t.hold_recheck:g} + LEASE {t.lease_seconds:g} + slack {SLACK:g}",
                 from_heal=True)


def outage(t: Tuning, seconds: float) -> Bound:
    """The consumers lost Redis or the database for ``seconds``: their backoff, then a lease.

    The backoff doubles from ERROR_BACKOFF_FIRST while the outage lasts, so the
    sleep in progress when it heals is at most the outage plus the first step
    (capped at ERROR_BACKOFF_MAX); a batch cut short waits for its lease.
    """
    backoff = min(seconds + ERROR_BACKOFF_FIRST, ERROR_BACKOFF_MAX)
    return Bound("consumer lost a server", backoff + t.lease_seconds + SLACK,
                 f"backoff {backoff:.1f} + LEASE {t.lease_seconds:g} + slack {SLACK:g}",
                 from_heal=True)


def redis_lost(t: Tuning) -> Bound:
    """The member never reached Redis, or Redis lost it: the scan (and --rebuild) heal it."""
    grace, interval = t.compensation_grace, t.compensation_interval
    return Bound("Redis lost the member", grace + interval + SLACK,
                 f"GRACE {grace:g} + INTERVAL {interval:g} + slack {SLACK:g}",
                 from_heal=True, plus_scan=True)


def lost_with_no_beat(t: Tuning) -> Bound:
    """The member never reached Redis, no beat running: the consumers' own scan heals it; its
    runner killed mid-scan costs the lock's lapse before another consumer runs it again."""
    grace, interval, lock = t.compensation_grace, t.compensation_interval, t.compensation_lock_seconds
    return Bound("Redis lost the member, the consumers scan, one killed mid-scan", grace + interval + lock + SLACK,
                 f"GRACE {grace:g} + INTERVAL {interval:g} + LOCK {lock:g} + slack {SLACK:g}", from_heal=True)


# Seconds a consumer's rebuild of the chaos run's queue takes from the rows (a few thousand).
REBUILD = 2.0


def redis_emptied(t: Tuning, outage_seconds: float) -> Bound:
    """Redis came back empty (or older: from a snapshot), no beat running: a consumer's heartbeat
    finds the queue's epoch marker gone (or stamped by another server) within a third of
    HEARTBEAT_SECONDS, and that consumer, once its backoff from
    the outage ends, rebuilds the queue from the rows (scans/recovery.py). From the heal."""
    backoff = min(outage_seconds + ERROR_BACKOFF_FIRST, ERROR_BACKOFF_MAX)
    beat = t.heartbeat_seconds / 3
    return Bound("Redis came back empty or older, rebuilt by a consumer", backoff + beat + REBUILD + SLACK,
                 f"backoff {backoff:.1f} + HEARTBEAT/3 {beat:.1f} + rebuild {REBUILD:g} + slack {SLACK:g}",
                 from_heal=True)


def receiver_fails(t: Tuning) -> Bound:
    """A receiver that raises: retried at each delay, then a dead letter."""
    delays = sum(t.retry_delays)
    return Bound("receiver raises", delays + SLACK,
                 f"sum(RETRY_DELAYS) {delays:g} + slack {SLACK:g}")


def receiver_fails_among_deaths(t: Tuning) -> Bound:
    """A receiver that raises, in a run where other receivers kill or hang consumers: its
    batch may be one of theirs, so one takeover can come before the retries."""
    delays = sum(t.retry_delays)
    return Bound("receiver raises, its batch taken over", t.lease_seconds + delays + SLACK,
                 f"LEASE {t.lease_seconds:g} + sum(RETRY_DELAYS) {delays:g} + slack {SLACK:g}")


def receiver_kills(t: Tuning) -> Bound:
    """A receiver that kills, hangs or outlives its consumer's lease: taken over, then a dead letter."""
    takeovers = (t.max_takeovers + 1) * t.lease_seconds
    return Bound("receiver kills or hangs", takeovers + SLACK,
                 f"(MAX_TAKEOVERS+1) x LEASE {takeovers:g} + slack {SLACK:g}")


def scan_stuck_others(t: Tuning) -> Bound:
    """Orders of a chunk whose scan a receiver held: the hung scan, one that closes them
    one at a time up to the culprit, one that closes the rest (the culprit last)."""
    grace, interval = t.compensation_grace, t.compensation_interval
    return Bound("scan held by a receiver", grace + 3 * interval + SLACK,
                 f"GRACE {grace:g} + 3 x INTERVAL {3 * interval:g} + slack {SLACK:g}",
                 plus_scan=True)


def scan_stuck_culprit(t: Tuning) -> Bound:
    """The order whose receiver holds every scan that closes it: buried by the scan after
    MAX_TAKEOVERS + 1 of them exited, one a beat."""
    grace, interval = t.compensation_grace, t.compensation_interval
    scans = (t.max_takeovers + 2) * interval
    return Bound("receiver holds the scan", grace + scans + SLACK,
                 f"GRACE {grace:g} + (MAX_TAKEOVERS+2) x INTERVAL {scans:g} + slack {SLACK:g}",
                 plus_scan=True)
