"""Full garbage collections in a closer's process: how many, how long, and how many inside a batch.

A generation-2 collection stops the whole process while it walks every object;
inside a batch it does so holding the batch's row locks and its lease, and a
burst's closes/s and lateness carry the pause. The bench app (bench/apps.py)
installs this in every closer the harness starts: a ``gc.callbacks`` entry
that notes each generation-2 collection (when it began, how long it took,
whether a batch was in progress), and a wrapper around ``Consumer.process``
that tells a batch. A batch, here: one call of ``Consumer.process``, from the
claim that returned members to the batch's settling (its ack rides the next
claim and is not in it). Each process writes its collections to
BENCH_RECORD_DIR as it exits (``gc-<pid>.txt``), as the recorder writes its
commits, and the harness counts those that began inside a workload's window.

The callback runs at every collection of every generation (a Python call, at
the start and at the end), and returns at once but for generation 2.
"""

from __future__ import annotations

import atexit
import functools
import gc
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Collection:
    at: float  # wall time (time.time()) when it began: the harness's windows are wall times
    seconds: float
    in_batch: bool


class Collections:
    """One process's generation-2 collections, and the batches it ran (``batch``-wrapped calls)."""

    def __init__(self) -> None:
        self.seen: list[Collection] = []
        self.batches = 0
        # Batches in progress: any thread's (a collection stops them all). A lock: the notices'
        # deliveries run on threads of their own.
        self._running = 0
        self._lock = threading.Lock()
        self._began: tuple[float, float] | None = None

    def observe(self, phase: str, info: dict[str, Any]) -> None:
        """A ``gc.callbacks`` entry."""
        if info["generation"] != 2:
            return
        if phase == "start":
            self._began = (time.time(), time.perf_counter())
        elif self._began is not None:
            at, began = self._began
            self.seen.append(Collection(at, time.perf_counter() - began, self._running > 0))
            self._began = None

    def start(self) -> Collections:
        gc.callbacks.append(self.observe)
        return self

    def stop(self) -> None:
        if self.observe in gc.callbacks:
            gc.callbacks.remove(self.observe)

    def batch(self, function: Callable[..., T]) -> Callable[..., T]:
        """``function``, each call of it a batch."""

        @functools.wraps(function)
        def run(*args: Any, **kwargs: Any) -> T:
            with self._lock:
                self.batches += 1
                self._running += 1
            try:
                return function(*args, **kwargs)
            finally:
                with self._lock:
                    self._running -= 1

        return run


_installed: Collections | None = None


def install() -> None:
    """Count this process's collections and its consumer's batches, and write them to
    BENCH_RECORD_DIR at exit (a closer's process: bench/apps.py); nothing without that folder."""
    global _installed
    if _installed is not None or not os.environ.get("BENCH_RECORD_DIR"):
        return
    from order_timeout.consumer import Consumer

    _installed = Collections().start()
    setattr(Consumer, "process", _installed.batch(Consumer.process))  # noqa: B010 (mypy: no assigning a method)
    atexit.register(write, _installed, Path(os.environ["BENCH_RECORD_DIR"]))


def write(collections: Collections, directory: Path) -> None:
    """``gc-<pid>.txt``: the batches run, then one line per collection."""
    lines = [f"batches {collections.batches}\n"]
    lines += [f"{seen.at:.6f} {seen.seconds:.6f} {int(seen.in_batch)}\n" for seen in collections.seen]
    (directory / f"gc-{os.getpid()}.txt").write_text("".join(lines))


@dataclass
class Written:
    """What one process wrote."""

    pid: int
    batches: int
    seen: list[Collection] = field(default_factory=list)


def read(directory: Path) -> list[Written]:
    written = []
    for path in sorted(directory.glob("gc-*.txt")):
        head, *rest = path.read_text().splitlines()
        seen = [Collection(float(at), float(seconds), in_batch == "1")
                for at, seconds, in_batch in (line.split() for line in rest)]
        written.append(Written(int(path.stem.removeprefix("gc-")), int(head.split()[1]), seen))
    return written


def tally(processes: list[Written], since: float, until: float) -> dict[str, Any] | None:
    """The collections that began from ``since`` to ``until``, by process and in all. ``in_batch``
    is None for a process that ran no batch of ours (a peer's worker, the floor): none to be in."""
    if not processes:
        return None
    by_process: list[dict[str, Any]] = []
    for process in processes:
        inside = [seen for seen in process.seen if since <= seen.at <= until]
        by_process.append({
            "pid": process.pid, "collections": len(inside),
            "in_batch": sum(seen.in_batch for seen in inside) if process.batches else None,
            "total_ms": round(1000 * sum(seen.seconds for seen in inside), 2),
            "longest_ms": round(1000 * max((seen.seconds for seen in inside), default=0.0), 2)})
    counted = [process["in_batch"] for process in by_process if process["in_batch"] is not None]
    return {"collections": sum(process["collections"] for process in by_process),
            "in_batch": sum(counted) if counted else None,
            "total_ms": round(sum(process["total_ms"] for process in by_process), 2),
            "longest_ms": max(process["longest_ms"] for process in by_process),
            "processes": by_process}
