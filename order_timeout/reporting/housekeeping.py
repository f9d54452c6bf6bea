"""When the fleet's housekeeping jobs (the compensation scan, the prune) last ran, where, how long
they took and what they did: for the status command, the metrics and the admin."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from ..exceptions import QueueUnavailable
from ..queue import TimeoutQueue
from ..queue.housekeeping import JobRun
from ..scans.turns import database_now_ms

# Every job, in the order they run.
JOBS = ("scan", "prune")


@dataclass(frozen=True)
class LastRun:
    job: str
    started: datetime
    # Seconds since it started, by the database's clock (the one every runner's turn is judged by).
    age_seconds: float
    where: str
    runner: str
    ended: datetime | None
    elapsed_ms: int | None
    complete: bool | None
    figures: dict[str, Any]
    # When the last complete run started (None: none recorded).
    complete_started: datetime | None
    complete_age_seconds: float | None

    def as_dict(self) -> dict[str, Any]:
        figures = asdict(self)
        for name in ("started", "ended", "complete_started"):
            figures[name] = None if figures[name] is None else figures[name].isoformat()
        return figures


def _at(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def _maybe_at(ms: int | None) -> datetime | None:
    return None if ms is None else _at(ms)


def last_runs(queue: TimeoutQueue | None = None) -> dict[str, LastRun | None]:
    """Each job's last run (None: never ran, or Redis lost the record). Raises QueueUnavailable."""
    housekeeping = (queue or TimeoutQueue.from_settings()).housekeeping
    runs: dict[str, JobRun] = housekeeping.last_runs(JOBS)
    now_ms = database_now_ms()
    shown: dict[str, LastRun | None] = {}
    for job in JOBS:
        run = runs.get(job)
        shown[job] = None if run is None else LastRun(
            job=job, started=_at(run.started_ms), age_seconds=max(0, now_ms - run.started_ms) / 1000,
            where=run.where, runner=run.runner, ended=_maybe_at(run.ended_ms), elapsed_ms=run.elapsed_ms,
            complete=run.complete, figures=run.figures, complete_started=_maybe_at(run.complete_started_ms),
            complete_age_seconds=None if run.complete_started_ms is None
            else max(0, now_ms - run.complete_started_ms) / 1000)
    return shown


def last_runs_or_none() -> dict[str, LastRun | None] | None:
    """``last_runs()``, or None when Redis cannot be reached (the page and metrics say so)."""
    try:
        return last_runs()
    except QueueUnavailable:
        return None
