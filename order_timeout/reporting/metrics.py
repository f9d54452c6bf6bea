"""Prometheus metrics (the ``metrics`` extra: prometheus-client).

Two kinds, exported from two places:

- What a consumer does (closes by outcome, close lateness, claim and close
  durations, batch sizes, retries, dead letters, errors): counted in the
  consumer process and served by ``run_timeout_consumer --metrics-port``.
- The backlog (pending, due, leased, expired leases, busy, taken over, oldest
  due age per shard; open dead letters; drift as the last beat run found it):
  read from Redis and the database at scrape time by ``BacklogCollector``,
  served by the consumer too and by ``order_timeout.views.metrics`` for a
  shop's own scrape.

Without prometheus-client every recording call is a no-op.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import Any

from django.utils import timezone

logger = logging.getLogger("order_timeout")

try:
    from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
except ImportError:  # pragma: no cover - exercised without the extra
    CollectorRegistry = Counter = Histogram = GaugeMetricFamily = CounterMetricFamily = start_http_server = None  # type: ignore[assignment,misc]

AVAILABLE = Counter is not None

# Outcomes of ``order_timeout_closes_total``: what became of each claimed order.
OUTCOMES = ("closed", "settled", "rescheduled", "busy", "held", "failed", "dead_lettered", "dropped",
            "abandoned")
# Outcomes of ``order_timeout_reminders_total``.
REMINDER_OUTCOMES = ("sent", "done", "held", "rescheduled", "busy", "failed", "given_up", "dropped",
                     "abandoned")
# Close lateness: from a few milliseconds (the normal path) to the scan's bounds.
LATENESS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 150, 300,
                    600, 1800)
DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
SIZE_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)


def outcome_counts(report: Any) -> dict[str, int]:
    """A batch's report in the metrics' outcome names, before a kind's ``metric_labels`` rename them:
    the one place the lifecycle's words meet the metrics'."""
    return {"acted": report.acted, "settled": report.settled, "passed": report.passed,
            "not_due": report.rescheduled, "busy": report.busy, "held": report.held, "failed": report.failed,
            "given_up": report.given_up, "dropped": report.dropped, "abandoned": report.abandoned}


class ConsumerMetrics:
    """The consumer's own counters and histograms, in a registry of their own.

    ``enabled=False`` (a consumer that serves no metrics) records nothing: a
    histogram observation per close is a few microseconds a burst need not pay.
    """

    def __init__(self, registry: Any = None, *, enabled: bool = True) -> None:
        self.enabled = AVAILABLE and enabled
        if not self.enabled:
            return
        self.registry = registry or CollectorRegistry()
        self.closes = Counter("order_timeout_closes", "Claimed orders by what became of them.",
                              ["outcome"], registry=self.registry)
        self.lateness = Histogram(
            "order_timeout_close_lateness_seconds",
            "Seconds from an order's deadline to the commit of its close.",
            buckets=LATENESS_BUCKETS, registry=self.registry)
        self.claim_duration = Histogram("order_timeout_claim_duration_seconds",
                                        "Seconds one claim took (a Redis round trip).",
                                        buckets=DURATION_BUCKETS, registry=self.registry)
        self.close_duration = Histogram("order_timeout_close_duration_seconds",
                                        "Seconds one batch took to close, from claim to ack.",
                                        buckets=DURATION_BUCKETS, registry=self.registry)
        self.batch_size = Histogram("order_timeout_batch_size", "Members per claimed batch.",
                                    buckets=SIZE_BUCKETS, registry=self.registry)
        self.retries = Counter("order_timeout_retries", "Failed closes given another try later.",
                               registry=self.registry)
        self.dead_letters = Counter("order_timeout_dead_letters_written",
                                    "Orders written as dead letters.", registry=self.registry)
        self.errors = Counter("order_timeout_errors", "Batches that failed on Redis or the database.",
                              ["kind"], registry=self.registry)
        for outcome in OUTCOMES:
            self.closes.labels(outcome)
        for kind in ("redis", "database"):
            self.errors.labels(kind)
        self.reminders_total = Counter("order_timeout_reminders", "Claimed reminders by what became of them.",
                                       ["outcome"], registry=self.registry)
        self.reminder_lateness = Histogram(
            "order_timeout_reminder_lateness_seconds",
            "Seconds from a reminder's moment (deadline minus its lead) to the commit that sent it.",
            buckets=LATENESS_BUCKETS, registry=self.registry)
        for outcome in REMINDER_OUTCOMES:
            self.reminders_total.labels(outcome)
        # Every timer a shop declared, by its name.
        self.timer_outcomes = Counter("order_timeout_timer_outcomes", "Claimed members of a declared timer by "
                                      "what became of them.", ["timer", "outcome"], registry=self.registry)
        self.timer_lateness = Histogram(
            "order_timeout_timer_lateness_seconds",
            "Seconds from a declared timer's deadline to the commit of its act.", ["timer"],
            buckets=LATENESS_BUCKETS, registry=self.registry)

    def count_report(self, kind: Any, report: Any) -> None:
        """One settled batch of any kind (its ``timers.outcome.Report``), counted in its kind's family
        of metrics, by its kind's labels."""
        if not self.enabled or report.moments is None:
            return
        seconds, lateness = report.moments.seconds, report.moments.lateness()
        counts = outcome_counts(report)
        labels = kind.wording.metric_labels
        named = {labels[name]: count for name, count in counts.items() if name in labels} if labels else counts
        if kind.wording.metric_family == "closes":
            self.batch(named, seconds, lateness)
        elif kind.wording.metric_family == "reminders":
            self.reminders(named, lateness)
        else:
            for outcome, count in named.items():
                if count:
                    self.timer_outcomes.labels(kind.name, outcome).inc(count)
            for late in lateness:
                self.timer_lateness.labels(kind.name).observe(max(late, 0.0))

    def claimed(self, seconds: float, size: int) -> None:
        if self.enabled and size:
            self.claim_duration.observe(seconds)
            self.batch_size.observe(size)

    def batch(self, counts: dict[str, int], seconds: float, lateness: Iterable[float]) -> None:
        if not self.enabled:
            return
        for outcome, count in counts.items():
            if count:
                self.closes.labels(outcome).inc(count)
        self.close_duration.observe(seconds)
        for late in lateness:
            self.lateness.observe(max(late, 0.0))
        if counts.get("failed"):
            self.retries.inc(counts["failed"] - counts.get("dead_lettered", 0))
        if counts.get("dead_lettered"):
            self.dead_letters.inc(counts["dead_lettered"])

    def reminders(self, counts: dict[str, int], lateness: Iterable[float]) -> None:
        if not self.enabled:
            return
        for outcome, count in counts.items():
            if count:
                self.reminders_total.labels(outcome).inc(count)
        for late in lateness:
            self.reminder_lateness.observe(max(late, 0.0))

    def error(self, kind: str) -> None:
        if self.enabled:
            self.errors.labels(kind).inc()

    def serve(self, port: int, address: str = "0.0.0.0") -> None:
        """Serve this registry and the backlog on ``port`` (a thread of its own)."""
        if not AVAILABLE:
            raise RuntimeError("--metrics-port needs prometheus-client: pip install "
                               "'django-order-timeout[metrics]'")
        if not self.enabled:
            raise RuntimeError("these metrics were built disabled (ConsumerMetrics(enabled=False))")
        self.registry.register(BacklogCollector())
        start_http_server(port, addr=address, registry=self.registry)


class BacklogCollector:
    """The backlog gauges, read at scrape time (one pipelined round trip per shard, two small queries).

    ``own_connections``: the scrape runs in a thread of its own (a consumer's metrics port),
    whose database connections nobody else tidies; in a request (``views.metrics``) they are
    Django's, and may be inside the request's transaction (``ATOMIC_REQUESTS``).
    """

    def __init__(self, *, own_connections: bool = True) -> None:
        self.own_connections = own_connections

    def collect(self) -> Iterator[Any]:
        from django.db import close_old_connections

        from ..conf import settings
        from ..exceptions import OrderTimeoutError
        from ..models import DeadLetter
        from ..queue import TimeoutQueue
        from ..timers.members import now_score

        now = timezone.now()
        if self.own_connections:
            close_old_connections()
        try:
            # With no order close (ORDER_MODEL None) its queue is not read: the timers' gauges only.
            queue = TimeoutQueue.from_settings()
            per_shard = queue.shard_stats(now_score(now)) if settings.closes_orders() else {}
            drift = queue.last_drift() if settings.closes_orders() else None
        except OrderTimeoutError as exc:
            logger.warning("metrics: cannot read the queue (%s)", exc)
            per_shard, drift = {}, None
        gauges = {
            "order_timeout_pending": ("Members waiting for their deadline, per shard.", "pending"),
            "order_timeout_due": ("Members past their deadline not claimed yet.", "due"),
            "order_timeout_leased": ("Members claimed by a consumer now.", "leased"),
            "order_timeout_expired_leases": ("Leases that ran out (their consumer died).",
                                             "expired_leases"),
            "order_timeout_busy": ("Members whose row another transaction kept locked.", "busy"),
            "order_timeout_taken_over": ("Members taken over from a consumer that died with them.",
                                         "taken_over"),
            "order_timeout_held": ("Due members held by a payment in flight (HOLD_CONDITION).", "held"),
            "order_timeout_quarantined": ("Members moved out of the queue because they name no order.",
                                          "quarantined"),
        }
        for name, (text, field) in gauges.items():
            family = GaugeMetricFamily(name, text, labels=["shard"])
            for shard, stats in per_shard.items():
                family.add_metric([str(shard)], getattr(stats, field))
            yield family
        ages = {
            "order_timeout_oldest_due_age_seconds": (
                "How long the oldest due member (or expired lease) has waited to be claimed.",
                "oldest_due_ms"),
            "order_timeout_oldest_busy_age_seconds": (
                "How long the member found locked elsewhere longest ago has been kept out by that lock.",
                "oldest_busy_ms"),
            "order_timeout_oldest_held_age_seconds": (
                "How long the order held longest by a payment in flight has been held.",
                "oldest_held_ms"),
        }
        for name, (text, field) in ages.items():
            family = GaugeMetricFamily(name, text, labels=["shard"])
            for shard, stats in per_shard.items():
                since = getattr(stats, field)
                family.add_metric([str(shard)], 0.0 if since is None else max(now_score(now) - since, 0) / 1000)
            yield family
        yield from self._timers(now)
        yield GaugeMetricFamily("order_timeout_dead_letters", "Open dead letters waiting for staff.",
                                value=DeadLetter.objects.filter(resolved_at__isnull=True).count())
        yield self._refused_writes()
        if drift is not None:
            yield GaugeMetricFamily(
                "order_timeout_drift",
                "Unpaid orders with a deadline the last beat run found missing from Redis.",
                value=drift)
        yield from self._storage()
        yield from self._housekeeping()
        yield self._paused()
        if self.own_connections:
            close_old_connections()

    @staticmethod
    def _housekeeping() -> Iterator[Any]:
        """When each housekeeping job last started, and last started a run it completed (Unix time)."""
        from .housekeeping import last_runs_or_none

        runs = last_runs_or_none()
        if runs is None:
            return
        started = GaugeMetricFamily("order_timeout_housekeeping_last_run_timestamp_seconds",
                                    "When the job (scan, prune) last started, by any runner (Unix time).",
                                    labels=["job"])
        complete = GaugeMetricFamily("order_timeout_housekeeping_last_complete_run_timestamp_seconds",
                                     "When the job's last complete run started (Unix time): alert on its age.",
                                     labels=["job"])
        for job, run in runs.items():
            if run is not None:
                started.add_metric([job], run.started.timestamp())
                if run.complete_started is not None:
                    complete.add_metric([job], run.complete_started.timestamp())
        yield from (started, complete)

    @staticmethod
    def _paused() -> Any:
        """1 for each timer staff paused (a payment provider down), 0 for the others."""
        from ..timers.pausing import known_names, paused_names

        paused = paused_names()
        family = GaugeMetricFamily("order_timeout_paused", "1 while staff keep this timer paused.", labels=["timer"])
        for name in dict.fromkeys([*known_names(), *sorted(paused)]):
            family.add_metric([name], 1 if name in paused else 0)
        return family

    @staticmethod
    def _refused_writes() -> Any:
        """Writes the app refused over a deadline's act, not handled by staff yet, by refusal (each
        refusal there, at 0 when none waits): one grouped count along the ``handled_at`` index."""
        from django.db.models import Count

        from ..models import RefusedWrite

        waiting = dict(RefusedWrite.objects.open().order_by().values_list("refusal").annotate(n=Count("pk")))
        family = GaugeMetricFamily("order_timeout_refused_writes",
                                   "Writes the app refused (a payment after its order closed, a stale save over "
                                   "an acted-on row) waiting for staff, by refusal.", labels=["refusal"])
        for refusal in RefusedWrite.Refusal.values:
            family.add_metric([refusal], waiting.get(refusal, 0))
        return family

    @staticmethod
    def _storage() -> Iterator[Any]:
        """The app's tables (the database's estimates) and what the prune deleted from them."""
        from .storage import measure_storage

        storage = measure_storage()
        rows = GaugeMetricFamily("order_timeout_table_rows", "Rows in an app table (the database's estimate).",
                                 labels=["table"])
        size = GaugeMetricFamily("order_timeout_table_bytes", "Bytes of an app table, its data and indexes.",
                                 labels=["table"])
        pruned = CounterMetricFamily("order_timeout_pruned_rows", "Rows the prune deleted past their retention.",
                                     labels=["table"])
        for name, table in storage.tables.items():
            if table.rows is not None:
                rows.add_metric([name], table.rows)
            if table.bytes is not None:
                size.add_metric([name], table.bytes)
            if table.pruned:
                pruned.add_metric([name], table.deleted_total)
        yield from (rows, size, pruned)
        if storage.last_prune_at is not None:
            yield GaugeMetricFamily("order_timeout_last_prune_timestamp_seconds",
                                    "When the last prune ended (Unix time).",
                                    value=storage.last_prune_at.timestamp())


    @staticmethod
    def _timers(now: Any) -> Iterator[Any]:
        """Each declared timer's backlog, by timer and shard."""
        from ..exceptions import OrderTimeoutError
        from ..queue import TimeoutQueue
        from ..timers.members import now_score
        from ..timers.registry import registry

        timers = registry.reported()
        if not timers:
            return
        families = {field: GaugeMetricFamily(f"order_timeout_timer_{field}", text, labels=["timer", "shard"])
                    for field, text in (("pending", "A declared timer's members waiting for their deadline."),
                                        ("due", "A declared timer's members past their deadline not claimed yet."),
                                        ("leased", "A declared timer's members claimed by a consumer now."),
                                        ("held", "A declared timer's due members held by its hold condition."),
                                        ("quarantined", "A declared timer's members that name no row."))}
        oldest = GaugeMetricFamily("order_timeout_timer_oldest_due_age_seconds",
                                   "How long a declared timer's oldest due member has waited to be claimed.",
                                   labels=["timer", "shard"])
        try:
            queue = TimeoutQueue.from_settings()
            for timer in timers:
                for shard, stats in queue.of_kind(timer.key_space).shard_stats(now_score(now)).items():
                    for field, family in families.items():
                        family.add_metric([timer.name, str(shard)], getattr(stats, field))
                    since = stats.oldest_due_ms
                    oldest.add_metric([timer.name, str(shard)],
                                      0.0 if since is None else max(now_score(now) - since, 0) / 1000)
        except OrderTimeoutError as exc:
            logger.warning("metrics: cannot read the timers' queues (%s)", exc)
        yield from families.values()
        yield oldest


def backlog_registry() -> Any:
    """A registry with the backlog gauges only, for the Django view: the request's connections
    are left to Django."""
    registry = CollectorRegistry()
    registry.register(BacklogCollector(own_connections=False))
    return registry
