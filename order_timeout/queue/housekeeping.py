"""What the app's housekeeping keeps in Redis: where the compensation scan's walk starts, the
prune's turn and totals, and the version of the timers' pauses.

Nothing here is the truth about an order. Lost with the rest of Redis, each is rebuilt by its
next run: the scan walks every overdue row again (as it must, since Redis lost its members too),
the prune runs at the next beat, and its totals count again from zero (a Prometheus counter's
reset).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import redis_errors
from .keys import GlobalKeys


@dataclass(frozen=True)
class ScanMark:
    """Where a kind's scan starts: below ``from_ms`` the last scan found only open dead letters;
    ``full_ms``: when a scan last walked every overdue row from the oldest."""

    from_ms: int
    full_ms: int


@dataclass(frozen=True)
class PruneRecord:
    """The prune's figures as Redis holds them: totals per table, the last run's, and when it ended."""

    totals: dict[str, int] = field(default_factory=dict)
    last: dict[str, int] = field(default_factory=dict)
    at_ms: int | None = None


# Taking a job's turn (lua/job_turn.lua): what the script answered.
TAKEN, HELD, NOT_DUE = 1, 0, -1
# What the record of a job's last run holds (``<job>:<field>`` in the hash).
RUN_FIELDS = ("started", "where", "runner", "token", "ended", "elapsed_ms", "complete", "figures",
              "complete_started")


@dataclass(frozen=True)
class JobRun:
    """A housekeeping job's last run as the fleet recorded it (times by the database's clock, ms)."""

    job: str
    started_ms: int
    where: str
    runner: str
    # None while it runs (or after its runner died before its end).
    ended_ms: int | None = None
    elapsed_ms: int | None = None
    complete: bool | None = None
    figures: dict[str, Any] = field(default_factory=dict)
    # When the last complete run started: the next is due an interval after it.
    complete_started_ms: int | None = None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class Housekeeping:
    """The housekeeping keys of one queue (``GlobalKeys``); every call one round trip."""

    def __init__(self, client: Any, keys: GlobalKeys, scripts: Callable[[], Mapping[str, Any]] | None = None) -> None:
        self.client = client
        self.keys = keys
        self._scripts = scripts

    # -- whose turn: one runner of each job for the whole fleet (scans/turns.py) ----------------

    def job_lock(self, job: str) -> str:
        """The lock of ``job``: the scan's is the one every compensation scan takes."""
        return self.keys.compensation_lock if job == "scan" else self.keys.prune_lock

    def take_turn(self, job: str, token: str, ttl_ms: int, interval_ms: int, where: str,
                  runner: str, now_ms: int) -> int:
        """TAKEN, HELD or NOT_DUE, judged at ``now_ms`` (the database's time); see lua/job_turn.lua."""
        assert self._scripts is not None
        with redis_errors(f"take the {job}'s turn"):
            status, _ = self._scripts()["job_turn"](
                keys=[self.job_lock(job), self.keys.housekeeping_runs],
                args=[job, token, ttl_ms, interval_ms, where, runner, now_ms])
        return int(status)

    def renew_turn(self, job: str, token: str, ttl_ms: int) -> bool:
        """Keep the job's lock; False once it is no longer ``token``'s (another runner may hold it)."""
        assert self._scripts is not None
        with redis_errors(f"renew the {job}'s lock"):
            return bool(self._scripts()["renew_lock"](keys=[self.job_lock(job)], args=[token, ttl_ms]))

    def end_turn(self, job: str, token: str, *, complete: bool, figures: Mapping[str, Any], now_ms: int) -> bool:
        """Record the run's end and release the lock, if still ``token``'s; see lua/job_done.lua."""
        assert self._scripts is not None
        with redis_errors(f"record the {job}'s end"):
            return bool(self._scripts()["job_done"](
                keys=[self.job_lock(job), self.keys.housekeeping_runs],
                args=[job, token, int(complete), json.dumps(dict(figures), sort_keys=True, default=str), now_ms]))

    def last_runs(self, jobs: Sequence[str]) -> dict[str, JobRun]:
        """Each job's last run, by job name (a job that never ran, or whose record Redis lost, is absent)."""
        names = [f"{job}:{name}" for job in jobs for name in RUN_FIELDS]
        with redis_errors("read the housekeeping's last runs"):
            values = self.client.hmget(self.keys.housekeeping_runs, names)
        fields: dict[str, dict[str, str]] = {}
        for field_name, raw_value in zip(names, values, strict=True):
            if raw_value is not None:
                job, _, name = field_name.partition(":")
                fields.setdefault(job, {})[name] = _text(raw_value)
        runs = {}
        for job, own in fields.items():
            try:
                runs[job] = JobRun(
                    job=job, started_ms=int(own["started"]), where=own.get("where", ""),
                    runner=own.get("runner", ""),
                    ended_ms=int(own["ended"]) if "ended" in own else None,
                    elapsed_ms=int(own["elapsed_ms"]) if "elapsed_ms" in own else None,
                    complete=own["complete"] == "1" if "complete" in own else None,
                    figures=json.loads(own["figures"]) if "figures" in own else {},
                    complete_started_ms=int(own["complete_started"]) if "complete_started" in own else None)
            except (KeyError, ValueError):
                continue  # not ours to read: the job's next run writes it anew
        return runs

    def scan_mark(self) -> ScanMark | None:
        with redis_errors("read where the scan starts"):
            values = self.client.hmget(self.keys.scan_mark, ["from", "full"])
        if None in values:
            return None
        try:
            return ScanMark(int(values[0]), int(values[1]))
        except ValueError:
            return None  # not ours to read: the scan walks everything and writes it anew

    def set_scan_mark(self, mark: ScanMark) -> None:
        with redis_errors("record where the next scan starts"):
            self.client.hset(self.keys.scan_mark, mapping={"from": mark.from_ms, "full": mark.full_ms})

    def record_prune(self, deleted: Mapping[str, int], at_ms: int) -> None:
        with redis_errors("record what the prune deleted"):
            pipe = self.client.pipeline(transaction=False)
            for table, count in deleted.items():
                pipe.hincrby(self.keys.pruned, f"total:{table}", count)
            pipe.hset(self.keys.pruned, mapping={"at": at_ms, **{f"last:{t}": n for t, n in deleted.items()}})
            pipe.execute()

    def pauses_version(self) -> str | None:
        """The pauses' version (None: none set, or Redis lost it)."""
        with redis_errors("read the pauses' version"):
            value = self.client.get(self.keys.pauses)
        return None if value is None else value.decode() if isinstance(value, bytes) else str(value)

    def bump_pauses(self, token: str, *, only_if_missing: bool = False) -> str:
        """A new version (``only_if_missing``: only where Redis has none); the version it holds now."""
        with redis_errors("bump the pauses' version"):
            if only_if_missing:
                self.client.set(self.keys.pauses, token, nx=True)
                value = self.client.get(self.keys.pauses)
                return value.decode() if isinstance(value, bytes) else str(value)
            self.client.set(self.keys.pauses, token)
            return token

    def prune_record(self) -> PruneRecord:
        with redis_errors("read what the prune deleted"):
            values = self.client.hgetall(self.keys.pruned)
        totals: dict[str, int] = {}
        last: dict[str, int] = {}
        at_ms = None
        for raw_name, raw_value in values.items():
            name = raw_name.decode() if isinstance(raw_name, bytes) else raw_name
            try:
                value = int(raw_value)
            except ValueError:
                continue
            if name == "at":
                at_ms = value
            elif name.startswith("total:"):
                totals[name[len("total:"):]] = value
            elif name.startswith("last:"):
                last[name[len("last:"):]] = value
        return PruneRecord(totals, last, at_ms)
