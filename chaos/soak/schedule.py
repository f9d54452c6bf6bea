"""The soak's clock: samples and kills at their moments, the beat's task, and the wait at the end.

Samples and kills run in the harness's main thread, in the order of their moments from the
stream's start (a sample takes a few hundred milliseconds; a kill that follows it waits that
long). A kill goes to the process its slot holds at that moment; one meeting a slot between an
exit and its restart (the supervisor restarts within 50 ms) tries again for a second.
"""

from __future__ import annotations

import json
import signal
import time
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.utils import timezone

from order_timeout import get_order_model
from order_timeout.models import Notice

from ..beat import Beat
from ..consumers import ConsumerPool
from ..management.commands.chaos_beat_task import RESULT_PREFIX
from . import sampling
from .checks import came_to_an_end
from .plan import Plan
from .stream import OrderStream

SAMPLE = "sample"


class TaskBeat(Beat):
    """Celery beat as the soak plays it: the beat entry's task each tick (``chaos_beat_task``), so
    the prune runs where a shop's runs, when ``PRUNE_INTERVAL`` has passed."""

    command = "chaos_beat_task"

    def results(self) -> list[dict[str, Any]]:
        """What each tick's task returned, in order (read back from the ticks' log)."""
        log = self.logs / "scans.log"
        if not log.exists():
            return []
        return [json.loads(line.split(RESULT_PREFIX, 1)[1]) for line in log.read_text(errors="replace").splitlines()
                if RESULT_PREFIX in line]

    def pruned(self) -> dict[str, Any]:
        """The rows the ticks' prunes deleted, by table, as the task reported them (nothing when it
        reports no prune)."""
        deleted: Counter[str] = Counter()
        prunes = 0
        for result in self.results():
            for key, value in result.items():
                if "prune" in key and isinstance(value, dict):
                    figures = value.get("deleted", value)
                    if isinstance(figures, dict) and figures:
                        prunes += 1
                        deleted.update({table: int(count) for table, count in figures.items()
                                        if isinstance(count, int)})
        if not prunes:
            return {"rows pruned by the beat's task": "none reported"}
        return {"beat ticks that pruned": prunes, "rows pruned by the beat's task": ", ".join(
            f"{table} {count:,}" for table, count in sorted(deleted.items()))}


def wait_until_started(pool: ConsumerPool, logs: Path, timeout: float = 60) -> None:
    """Until each consumer printed its first line (it then claims within milliseconds)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        started = sum(1 for log in logs.glob(f"{pool.name}-*.log")
                      if "Timeout consumer running" in log.read_text(errors="replace"))
        if started >= pool.size:
            return
        time.sleep(0.2)
    raise RuntimeError(f"not every consumer started within {timeout:g} s (their logs are in {logs})")


def _kill(pool: ConsumerPool, slot: int, name: str) -> bool:
    signum = signal.SIGKILL if name == "SIGKILL" else signal.SIGTERM
    deadline = time.monotonic() + 1.0
    while True:
        if pool.kill_pid(pool.pids()[slot], signum):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def run_schedule(plan: Plan, pool: ConsumerPool, stream: OrderStream, beat: Beat,
                 bound: float) -> tuple[list[dict[str, Any]], Counter[str]]:
    """Every sample and kill of the plan at its moment; the samples, and the kills that landed."""
    moments = [index * plan.sample_every for index in range(int(plan.seconds // plan.sample_every) + 1)]
    if moments[-1] < plan.seconds:
        moments.append(plan.seconds)
    events: list[tuple[float, str, int]] = sorted([*((moment, SAMPLE, -1) for moment in moments), *plan.kills()])
    samples: list[dict[str, Any]] = []
    kills: Counter[str] = Counter()
    for moment, what, slot in events:
        time.sleep(max(0.0, stream.began + moment - time.monotonic()))
        if what == SAMPLE:
            sample = sampling.take(time.monotonic() - stream.began, stream.created, "stream", pool.pids(),
                                   bound + beat.longest_tick)
            samples.append(sample.as_dict())
            print(progress(sample), flush=True)
        elif _kill(pool, slot, what):
            kills[what] += 1
    return samples, kills


def progress(sample: sampling.Sample) -> str:
    """One line per sample while the soak runs."""
    rows = ", ".join(f"{name.removeprefix('order_timeout_')} {figure['rows']:,}"
                     for name, figure in sample.tables.items())
    consumers = " / ".join(f"{process['rss_kb'] / 1024:.0f}" if process["rss_kb"] else "–"
                           for process in sample.consumers)
    return (f"  {sample.at:6.0f} s  {sample.orders:>8,} orders | rows: {rows} | Redis: "
            f"{sum(figure['keys'] for figure in sample.keys.values())} keys, "
            f"{sample.redis['used_memory'] / 2**20:.1f} MB | consumers {consumers} MB | "
            f"connections {sample.database_connections} | open past bound {sample.open_past_bound} "
            f"({sample.took:.2f} s)")


def settle(sink: Any, last_deadline: datetime | None, bound: float) -> bool:
    """Wait until every order due came to an end, no notice is pending and the target accepted as
    many notices as orders closed; False if that took longer than ``bound`` past the last deadline."""
    model = get_order_model()
    closed = model._base_manager.filter(**{model.TIMEOUT_STATUS_FIELD: model.TIMEOUT_CLOSED_STATUS})
    give_up = (last_deadline or timezone.now()) + timedelta(seconds=bound)
    while True:
        now = timezone.now()
        if (last_deadline is None or now > last_deadline) and came_to_an_end(now) == 0 \
                and not Notice.objects.filter(state=Notice.State.PENDING).exists() \
                and len(sink.accepted_orders()) >= closed.count():
            return True
        if now > give_up:
            return False
        time.sleep(1.0)
