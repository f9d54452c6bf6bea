"""``manage.py order_timeout_status``: how the queue is doing, for people, cron and health checks."""

from __future__ import annotations

import json
from argparse import ArgumentTypeError
from dataclasses import dataclass
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from order_timeout.exceptions import OrderTimeoutError
from order_timeout.reporting.health import Health, measure
from order_timeout.reporting.housekeeping import LastRun, last_runs_or_none
from order_timeout.reporting.storage import Storage, TableStorage, measure_storage
from order_timeout.timers.pausing import Paused, describe, open_pauses

# Exit status when a threshold is crossed (1 is any other error).
THRESHOLD_CROSSED = 2
# Exit status when a timer has been paused longer than --max-paused (and no threshold is crossed).
PAUSED_TOO_LONG = 3


def non_negative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ArgumentTypeError(f"must be a number, got {text!r}") from None
    if value < 0:
        raise ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


@dataclass(frozen=True)
class Threshold:
    """One --max-... option: the figure it watches, and what it says."""

    figure: str
    help: str
    # How a crossing reads, with {value} and {limit}.
    crossed: str


THRESHOLDS = {
    "max_overdue": Threshold(
        "overdue_unpaid_in_database",
        "Fail when more unpaid orders than this are past their deadline in the database.",
        "{value} overdue unpaid orders > --max-overdue {limit:g}"),
    "max_age": Threshold(
        "oldest_due_age_seconds",
        "Fail when the oldest due member has waited longer than this many seconds to be claimed.",
        "oldest due member waited {value:g}s > --max-age {limit:g}"),
    "max_dead_letters": Threshold(
        "dead_letters",
        "Fail when more dead letters than this wait for staff.",
        "{value} open dead letters > --max-dead-letters {limit:g}"),
    "max_busy_age": Threshold(
        "oldest_busy_age_seconds",
        "Fail when an order's row has kept a consumer out (locked by another transaction) for "
        "longer than this many seconds.",
        "an order's row has been locked elsewhere for {value:g}s > --max-busy-age {limit:g}"),
    "max_taken_over": Threshold(
        "taken_over",
        "Fail when more orders than this were taken over from consumers that died, froze or "
        "overran their lease.",
        "{value} orders taken over from dead consumers > --max-taken-over {limit:g}"),
    "max_held_age": Threshold(
        "oldest_held_age_seconds",
        "Fail when an order has been held by a payment in flight (HOLD_CONDITION) for longer than "
        "this many seconds.",
        "an order has been held by a payment in flight for {value:g}s > --max-held-age {limit:g}"),
    "max_quarantined": Threshold(
        "quarantined",
        "Fail when more members than this were moved out of the queue because they name no order "
        "(not UTF-8, malformed, scored past any deadline).",
        "{value} members in the quarantine > --max-quarantined {limit:g}"),
    "max_drift": Threshold(
        "drift",
        "Fail when more unpaid orders with a deadline than this are missing from Redis.",
        "{value} unpaid orders with a deadline are missing from Redis > --max-drift {limit:g}"),
    "max_refused": Threshold(
        "refused_writes",
        "Fail when more writes the app refused than this (a payment after its order closed, a stale "
        "save over an acted-on row) wait for staff to handle them (the admin's refused writes).",
        "{value} refused writes wait for staff > --max-refused {limit:g}"),
}


def _for_rows(text: str, timer: bool) -> str:
    """A threshold's words for a declared timer, whose rows are not orders."""
    return text.replace("unpaid orders", "rows").replace("orders", "rows").replace("an order", "a row") if timer \
        else text


# A declared timer's name for the figure a threshold watches, where it differs.
TIMER_FIGURES = {"overdue_unpaid_in_database": "overdue_in_database"}


class Command(BaseCommand):
    help = ("Print the timeout queue's backlog; exit 2 when a --max-... threshold is crossed.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="One JSON object, for machines.")
        for option, threshold in THRESHOLDS.items():
            parser.add_argument("--" + option.replace("_", "-"), type=non_negative, default=None,
                                help=threshold.help)
        parser.add_argument("--max-paused", type=non_negative, default=None, metavar="SECONDS",
                            help=f"Exit {PAUSED_TOO_LONG} when a timer has been paused by staff for longer than "
                                 "this many seconds (a pause forgotten after the outage).")
        parser.add_argument("--max-scan-age", type=non_negative, default=None, metavar="SECONDS",
                            help="Fail when the last complete compensation scan started longer ago than this "
                                 "(or none is recorded): the housekeeping stopped (every consumer runs "
                                 "with --no-housekeeping, or Celery beat alone ran it and is down).")
        parser.add_argument("--no-drift", action="store_true",
                            help="Skip the drift count, which reads every unpaid row with a "
                                 "deadline.")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["no_drift"] and options["max_drift"] is not None:
            raise CommandError("--max-drift needs the drift count; drop --no-drift.")
        try:
            health = measure(drift=not options["no_drift"])
        except OrderTimeoutError as exc:
            raise CommandError(f"Cannot read the queue: {exc}") from exc
        pauses = [describe(row) for row in open_pauses().values()]
        runs = last_runs_or_none()
        self._print(health, measure_storage(), as_json=options["json"], pauses=pauses, runs=runs)
        # Every kind is held to the same thresholds: the order close, and each declared timer. The
        # first holds the app's own figures too (refused writes), so it is there with no order close,
        # whose figures are then 0 and cross nothing.
        kinds: list[tuple[str, Any]] = [("", health),
                                        *((f"timer {name}: ", figures) for name, figures in health.timers.items())]
        crossed = [
            prefix + _for_rows(threshold.crossed, bool(prefix)).format(value=getattr(figures, field),
                                                                       limit=options[option])
            for prefix, figures in kinds
            for option, threshold in THRESHOLDS.items()
            for field in [TIMER_FIGURES.get(threshold.figure, threshold.figure) if prefix else threshold.figure]
            if options[option] is not None and getattr(figures, field, None) is not None
            and getattr(figures, field) > options[option]
        ]
        now = timezone.now()
        paused_too_long = [f"{pause.timer} paused for {(now - pause.since).total_seconds():.0f}s > --max-paused "
                           f"{options['max_paused']:g} ({pause.reason})"
                           for pause in pauses if options["max_paused"] is not None
                           and (now - pause.since).total_seconds() > options["max_paused"]]
        crossed += _scan_too_old(runs, options["max_scan_age"])
        if crossed:
            raise CommandError("; ".join(crossed + paused_too_long), returncode=THRESHOLD_CROSSED)
        if paused_too_long:
            raise CommandError("; ".join(paused_too_long), returncode=PAUSED_TOO_LONG)

    def _print(self, health: Health, storage: Storage, *, as_json: bool, pauses: list[Paused],
               runs: dict[str, LastRun | None] | None) -> None:
        figures = health.as_dict()
        paused = [{"timer": pause.timer, "since": pause.since.isoformat(), "by": pause.by, "reason": pause.reason}
                  for pause in pauses]
        if as_json:
            housekeeping = None if runs is None else {job: None if run is None else run.as_dict()
                                                      for job, run in runs.items()}
            self.stdout.write(json.dumps({**figures, "paused": paused, "storage": storage.as_dict(),
                                          "housekeeping": housekeeping}))
            return
        for pause in pauses:
            self.stdout.write(f"PAUSED {pause.timer} since {pause.since:%Y-%m-%d %H:%M:%S %Z} by {pause.by}: "
                              f"{pause.reason}")
        timers = figures.pop("timers")
        if not figures.pop("closes_orders"):
            figures = {"refused_writes": figures["refused_writes"]}
            self.stdout.write("no order close (ORDER_MODEL is None)")
        width = max(map(len, [*figures, *(key for own in timers.values() for key in own)]), default=0)
        for key, value in figures.items():
            shown = "not counted (--no-drift)" if value is None else value
            self.stdout.write(f"{key.replace('_', ' '):<{width}}  {shown}")
        for name, own in timers.items():
            self.stdout.write(f"\ntimer {name}")
            for key, value in own.items():
                shown = "not counted (--no-drift)" if value is None else value
                self.stdout.write(f"  {key.replace('_', ' '):<{width}}  {shown}")
        self._print_storage(storage)
        self._print_housekeeping(runs)

    def _print_housekeeping(self, runs: dict[str, LastRun | None] | None) -> None:
        """When the scan and the prune last ran, where, how long and what they did."""
        self.stdout.write("\nhousekeeping (last runs, by the database's clock)")
        if runs is None:
            self.stdout.write("  not known: Redis cannot be reached")
            return
        for job, run in runs.items():
            self.stdout.write(f"  {job:<6} {describe_run(run)}")

    def _print_storage(self, storage: Storage) -> None:
        """The app's tables: estimated rows, size, how long their rows are kept, what the prune took."""
        self.stdout.write("\nstorage (the database's estimates)")
        for name, table in storage.tables.items():
            rows = "?" if table.rows is None else f"{table.rows:,}"
            self.stdout.write(f"  {name.replace('_', ' '):<14} {rows:>12} rows  {_size(table.bytes):>9}  "
                              f"{_kept(name, table)}")
        if storage.last_prune_at is None:
            self.stdout.write("  last prune      none recorded")
            return
        deleted = ", ".join(f"{table.deleted_last:,} {name.replace('_', ' ')}"
                            for name, table in storage.tables.items() if table.pruned)
        self.stdout.write(f"  last prune      {storage.last_prune_at:%Y-%m-%d %H:%M:%S} UTC: deleted {deleted}")


def _size(size: int | None) -> str:
    if size is None:
        return "?"
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:,.0f} {unit}" if unit == "B" else f"{size:,.1f} {unit}"
        size /= 1000  # type: ignore[assignment]
    return f"{size} TB"  # pragma: no cover


# Why a table the prune leaves alone stays bounded.
NOT_PRUNED = {"deadlines": "not pruned: a row goes when its timer is done with it",
              "queue_epochs": "not pruned: one row per queue"}


def _kept(name: str, table: TableStorage) -> str:
    if not table.pruned:
        return NOT_PRUNED.get(name, "not pruned")
    if table.retention_seconds is None:
        return "kept for ever (retention None)"
    return f"kept {table.retention_seconds / 86400:g} days once done, {table.deleted_total:,} pruned so far"


def describe_run(run: LastRun | None) -> str:
    """One line: when a job last ran, for how long, where, and what it did."""
    if run is None:
        return "never ran (or Redis lost its record)"
    if run.ended is None:
        state = "running (or its runner died: another takes it over once its lock lapses)"
    else:
        state = f"took {run.elapsed_ms:,} ms, {'complete' if run.complete else 'stopped early'}"
    figures = ", ".join(f"{name.replace('_', ' ')} {value:,}" if isinstance(value, int) else f"{name} {value}"
                        for name, value in run.figures.items())
    return (f"started {run.started:%Y-%m-%d %H:%M:%S} UTC ({run.age_seconds:,.0f}s ago) by {run.runner} "
            f"on {run.where}: {state}" + (f"; {figures}" if figures else ""))


def _scan_too_old(runs: dict[str, LastRun | None] | None, limit: float | None) -> list[str]:
    if limit is None:
        return []
    if runs is None:
        return [f"the last scan is not known (Redis cannot be reached) and --max-scan-age is {limit:g}"]
    scan = runs.get("scan")
    if scan is None or scan.complete_age_seconds is None:
        return [f"no complete compensation scan is recorded > --max-scan-age {limit:g}"]
    if scan.complete_age_seconds > limit:
        return [f"the last complete compensation scan started {scan.complete_age_seconds:,.0f}s ago "
                f"> --max-scan-age {limit:g}"]
    return []
