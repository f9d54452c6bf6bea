"""The bench a scenario runs on: private servers, fresh tables, consumers, the beat, the clock.

One ``Lab`` per scenario. It empties the tables and starts a fresh Redis,
starts the processes a scenario asks for (and stops them, whatever
happens), creates orders, waits, and finally waits until every cohort has
settled (or its bound has long passed) before the invariants are counted.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings as django_settings
from django.db import OperationalError, connection, connections
from django.db.models import Model
from django.test import override_settings
from django.utils import timezone

from order_timeout import get_order_model
from order_timeout.exceptions import QueueUnavailable
from order_timeout.models import DeadLetter, Deadline, Notice, QueueEpoch, Reminder
from order_timeout.timers.watchdog import EXIT_STUCK
from testproject.shop.models import (
    Checkout,
    Expiry,
    PlainOrder,
    ReminderEmail,
    ShopOrder,
    StockRecord,
    StockReservation,
)

from . import invariants, orders, queueview
from .beat import Beat
from .consumers import EXITED_IN_RECEIVER, EXITED_STUCK, ConsumerPool
from .models import Act, Delivery, Payment, Role, Settlement, ShopMove, Stranded, TimerRole
from .servers import Servers
from .story import Check, Story
from .tuning import Sizes, Tuning

logger = logging.getLogger("chaos")

# Extra seconds the harness waits past the largest bound before it counts anyway.
PATIENCE = 5.0


@dataclass
class Lab:
    name: str
    servers: Servers
    tuning: Tuning
    sizes: Sizes
    logs: Path
    env: dict[str, str]
    pools: list[ConsumerPool] = field(default_factory=list)
    beats: list[Beat] = field(default_factory=list)
    queue_drained: bool | None = None
    # What stayed in Redis when it did not drain (queueview.left_behind), for the report.
    left_in_redis: list[str] = field(default_factory=list)

    # -- setting up --------------------------------------------------------------

    def reset(self, *, aof: bool = False) -> None:
        """Empty tables, and a fresh Redis (with an append-only file if ``aof``)."""
        # A shop's order model may have rows pointing at it (status changes, lines, returns), and
        # so do the models of the shop's declared timers.
        models: list[type[Model]] = [get_order_model(), ShopOrder, StockReservation, StockRecord, Checkout,
                                     PlainOrder]
        tables = list(dict.fromkeys([
            *(table for model in models for table in (
                model._meta.db_table, *(rel.related_model._meta.db_table for rel in model._meta.related_objects))),
            Delivery._meta.db_table, Role._meta.db_table, Payment._meta.db_table,
            Settlement._meta.db_table, Stranded._meta.db_table, DeadLetter._meta.db_table,
            Reminder._meta.db_table, ReminderEmail._meta.db_table, Deadline._meta.db_table,
            TimerRole._meta.db_table, ShopMove._meta.db_table, Act._meta.db_table,
            # What the shop's close tells the outside world (notices), and its own record of closes.
            Notice._meta.db_table, Expiry._meta.db_table,
            # Each scenario's queue is new: a marker row left by the last would have its first
            # consumer "rebuild" a queue Redis never lost.
            QueueEpoch._meta.db_table]))
        connections.close_all()  # a fresh connection: the last scenario may have killed the server
        with connection.cursor() as cursor:
            cursor.execute("SET FOREIGN_KEY_CHECKS = 0")
            for table in tables:
                cursor.execute(f"TRUNCATE TABLE {table}")
            cursor.execute("SET FOREIGN_KEY_CHECKS = 1")
        self.servers.redis.kill()
        self.servers.redis.start(aof=aof, fresh=True)
        self.logs.mkdir(parents=True, exist_ok=True)

    @contextmanager
    def consumers(self, count: int, *, expected_status: int | None = None,
                  freeze_hold: float | None = None, name: str = "consumer", **env: Any) -> Iterator[ConsumerPool]:
        """``count`` consumers under a supervisor, each started (past Django's set-up) when this yields.

        ``name``: their logs' (``{name}-{slot}.log``), for a second pool with settings of its own.
        """
        pool = ConsumerPool(count, {**self.env, **{k: str(v) for k, v in env.items()}}, self.logs,
                            expected_status=expected_status,
                            freeze_hold=freeze_hold or self.tuning.lease_seconds + 1.5, name=name)
        self.pools.append(pool)
        pool.start()
        try:
            self._wait_until_started(pool)
            yield pool
        finally:
            pool.stop()

    def _wait_until_started(self, pool: ConsumerPool, timeout: float = 30) -> None:
        """Until each consumer printed its first line (it then claims within milliseconds)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            started = sum(1 for log in self.logs.glob(f"{pool.name}-*.log")
                          if "Timeout consumer running" in log.read_text(errors="replace"))
            if started >= pool.size:
                time.sleep(0.3)
                return
            time.sleep(0.1)
        logger.warning("%s: not every consumer started within %gs", self.name, timeout)

    @contextmanager
    def payment_settings(self, *, holds: bool = False, reminders: bool = False) -> Iterator[dict[str, str]]:
        """The tuning's HOLD_CONDITION and/or REMINDERS, in this process while inside; yields the
        environment that gives the consumers and the scans the same (pass it to both).

        The harness needs them too: ``order_timeout.schedule()`` schedules the
        reminders it is configured with, and ``mark_paid()`` takes them off.
        """
        keys = self.tuning.payment_settings(holds=holds, reminders=reminders)
        with override_settings(ORDER_TIMEOUT={**django_settings.ORDER_TIMEOUT, **keys}):
            yield self.tuning.payment_environment(holds=holds, reminders=reminders)

    @contextmanager
    def beat(self, *, rebuild: bool = False, **env: Any) -> Iterator[Beat]:
        """The compensation scan every COMPENSATION_INTERVAL (with ``--rebuild`` before it).

        ``env`` as for the consumers: the scan runs the same receivers.
        """
        beat = Beat(self.tuning.compensation_interval,
                    {**self.env, **{k: str(v) for k, v in env.items()}}, self.logs, rebuild=rebuild)
        self.beats.append(beat)
        beat.start()
        try:
            yield beat
        finally:
            beat.stop()

    # -- orders ----------------------------------------------------------------

    def create_orders(self, count: int | None = None, *, spread: float | None = None,
                      lead: float | None = None, cohort: str = "orders",
                      misbehaving: Mapping[str, int] | None = None,
                      spaced: tuple[Sequence[str], float] | None = None,
                      in_flight: Mapping[str, int] | None = None) -> orders.Created:
        """Orders due over ``spread`` seconds from ``lead`` seconds on (the run's sizes by default).

        ``misbehaving``: that many orders of each behaviour, at random;
        ``spaced``: (behaviours, seconds) one order of each in turn, that far apart;
        ``in_flight``: that many orders of each cohort named, at random, created
        with a pending payment (no misbehaving order among them).
        """
        due = orders.deadlines(count or self.sizes.orders, self.sizes.lead if lead is None else lead,
                               spread or self.sizes.spread)
        behaviours = orders.at_random(len(due), misbehaving or {})
        if spaced:
            behaviours |= orders.spaced(due, *spaced)
        paying = orders.at_random(len(due), in_flight or {})
        assert not set(paying) & set(behaviours), "a payment in flight with a misbehaving receiver"
        return orders.create_orders(due, cohort, behaviours, paying)

    # -- time ------------------------------------------------------------------

    @staticmethod
    def now() -> datetime:
        return timezone.now()

    @staticmethod
    def wait_until(moment: datetime) -> None:
        wait = (moment - timezone.now()).total_seconds()
        if wait > 0:
            time.sleep(wait)

    @staticmethod
    def after(moment: datetime, seconds: float) -> datetime:
        return moment + timedelta(seconds=seconds)

    # -- the end -------------------------------------------------------------------

    @property
    def scan_seconds(self) -> float:
        """The longest beat tick so far (start to the end of its close scan): "scan time"."""
        return max((beat.longest_tick for beat in self.beats), default=0.0)

    def settle(self, story: Story) -> Story:
        """Wait until every cohort came to what it expects and Redis holds nothing more.

        Gives up PATIENCE seconds after the largest bound has passed: the
        invariants then say what did not happen in time.
        """
        last_deadline = self._last_deadline()
        start = max(filter(None, [last_deadline, story.heal_at]), default=timezone.now())
        bounds = [bound.total(self.tuning.compensation_interval + 5)
                  for bound in [*(cohort.bound for cohort in story.cohorts), *(cohort.bound for cohort in story.kinds)]
                  if bound]
        give_up = start + timedelta(seconds=max(bounds, default=10.0) + PATIENCE)
        while timezone.now() < give_up:
            if self._settled(story):
                break
            time.sleep(0.5)
        # A notice whose closer died between its COMMIT and the sync after it is in Redis a lease
        # late (docs/notices.md): the lease the scenario's consumers run with, not the tuning's.
        self.queue_drained = self._drained(until=timezone.now() + timedelta(
            seconds=self._longest_lease() + PATIENCE), besides=story.held)
        if not self.queue_drained:
            try:
                self.left_in_redis = queueview.left_behind()
            except QueueUnavailable:
                self.left_in_redis = ["(Redis did not answer)"]
        return story

    def _longest_lease(self) -> float:
        return max((float(pool.env.get("ORDER_TIMEOUT_LEASE_SECONDS", self.tuning.lease_seconds))
                    for pool in self.pools), default=self.tuning.lease_seconds)

    def _last_deadline(self) -> datetime | None:
        """The latest deadline of any kind: an order's, or a row's of one of the shop's timers."""
        model = get_order_model()
        order = self._retrying(lambda: model._base_manager.order_by("-expires_at")
                               .values_list("expires_at", flat=True).first())
        other = self._retrying(lambda: TimerRole.objects.order_by("-deadline")
                               .values_list("deadline", flat=True).first())
        return max(filter(None, [order, other]), default=None)

    def _settled(self, story: Story) -> bool:
        return bool(self._retrying(lambda: invariants.all_settled(story)))

    def _drained(self, until: datetime, besides: list[int]) -> bool:
        """Whether Redis empties (but for the members of ``besides``, held orders) by ``until``."""
        members = [queueview.member_of(pk) for pk in besides]
        while True:
            try:
                if queueview.queued(members) == 0:
                    return True
            except QueueUnavailable:
                pass
            if timezone.now() >= until:
                return False
            time.sleep(0.25)

    @staticmethod
    def _retrying(read: Any, attempts: int = 40) -> Any:
        """Run a read, reconnecting while the database restarts (the harness's own connection)."""
        for attempt in range(attempts):
            try:
                return read()
            except OperationalError:
                connections.close_all()
                if attempt == attempts - 1:
                    raise
                time.sleep(0.5)
        return None

    def checks(self) -> list[Check]:
        """What the harness saw outside the database: crashes, and what stayed in Redis."""
        if not self.pools:
            return []  # no consumer ran: nobody was to crash, or to drain Redis
        crashes = [exit_ for pool in self.pools for exit_ in pool.unexpected_exits]
        cluster = []
        if self.servers.cluster:
            # The run is about the cluster's paths only if the shards are spread over its nodes.
            nodes = queueview.nodes_holding_the_queue()
            cluster = [Check("the queue's shards were spread over the cluster's primaries", nodes > 1,
                             f"the shards fell on {nodes} node(s)")]
        return [
            *cluster,
            Check("no consumer crashed", not crashes,
                  "; ".join(f"consumer {e.slot} (pid {e.pid}) exited {e.status}" for e in crashes[:5])),
            Check("Redis drained: nothing pending or leased at the end, of any kind", bool(self.queue_drained),
                  "members left in Redis after every row settled"
                  + (": " + "; ".join(self.left_in_redis) if self.left_in_redis else "")),
        ]

    def consumer_facts(self) -> dict[str, Any]:
        facts: dict[str, Any] = {}
        kills = sum(pool.kills for pool in self.pools)
        freezes = sum(pool.freezes for pool in self.pools)
        receiver_exits = sum(1 for pool in self.pools for e in pool.exits
                             if e.cause == EXITED_IN_RECEIVER)
        stuck_exits = sum(1 for pool in self.pools for e in pool.exits if e.cause == EXITED_STUCK)
        scans = [scan for beat in self.beats for scan in beat.scans]
        by_scan = self._retrying(lambda: Delivery.objects.filter(
            pid__in=[scan.pid for scan in scans]).count()) if scans else 0
        if kills:
            facts["consumers killed"] = kills
        if freezes:
            facts["consumers frozen"] = freezes
        if receiver_exits:
            facts["consumers taken down by a receiver"] = receiver_exits
        if stuck_exits:
            facts["consumers that exited stuck in a receiver (75)"] = stuck_exits
        facts["closed by the scan"] = by_scan
        facts["scans run"] = len(scans)
        facts["scans failed"] = sum(1 for scan in scans if scan.status not in (0, EXIT_STUCK))
        if any(scan.status == EXIT_STUCK for scan in scans):
            facts["scans that exited stuck in a receiver (75)"] = sum(
                1 for scan in scans if scan.status == EXIT_STUCK)
        facts["longest scan tick (s)"] = round(self.scan_seconds, 2)
        return facts
