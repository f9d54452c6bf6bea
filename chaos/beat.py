"""Celery beat, played by the harness: the compensation scan every ``COMPENSATION_INTERVAL``.

Like beat, it starts a scan on every tick whether or not the previous one has
finished (the scans' own Redis lock decides who works), running
``order_timeout_compensate`` (and ``--rebuild`` first, where a scenario asks)
as subprocesses. How long a tick takes is the "scan time" of the bounds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from .processes import spawn


@dataclass
class Scan:
    command: str
    pid: int
    started_at: datetime
    ended_at: datetime
    status: int

    @property
    def seconds(self) -> float:
        return (self.ended_at - self.started_at).total_seconds()


class Beat:
    """A thread that ticks every ``interval`` seconds; each tick runs in a thread of its own."""

    # What each tick runs: the scan's management command (the soak runs the beat's Celery task).
    command = "order_timeout_compensate"

    def __init__(self, interval: float, env: dict[str, str], logs: Path, *, rebuild: bool) -> None:
        self.interval = interval
        self.env = env
        self.logs = logs
        self.rebuild = rebuild
        self.scans: list[Scan] = []
        # Seconds from a tick to the end of its close scan: the "scan time" of the bounds.
        self.tick_seconds: list[float] = []
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-beat", daemon=True)
        self._ticks: list[threading.Thread] = []
        self._running: set[subprocess.Popen[bytes]] = set()
        self._lock = threading.Lock()

    def start(self) -> None:
        self._thread.start()

    def stop(self, grace: float = 10.0) -> None:
        """No more ticks; scans still running get ``grace`` seconds, then SIGKILL."""
        self._stopping.set()
        self._thread.join()
        deadline = time.monotonic() + grace
        for tick in self._ticks:
            tick.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            for proc in self._running:
                os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
        for tick in self._ticks:
            tick.join()

    def scanned_since(self, moment: datetime, timeout: float) -> bool:
        """Wait (at most ``timeout`` s) for a scan started after ``moment`` to have finished well.

        A scan is a process that starts Django first: on a loaded machine one started a
        tick after ``moment`` may end seconds later, so a scenario waits for it, not for a
        fixed margin past the tick.
        """
        deadline = time.monotonic() + timeout
        while True:
            if any(scan.started_at > moment and scan.status == 0 for scan in self.scans):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.2)

    @property
    def longest_tick(self) -> float:
        return max(self.tick_seconds, default=0.0)

    @property
    def still_running(self) -> int:
        return len(self._running)

    def running_pids(self) -> list[int]:
        """The scans running now (a scenario tells their requests from the consumers')."""
        with self._lock:
            return [proc.pid for proc in self._running]

    def _run(self) -> None:
        tick = time.monotonic() + self.interval
        while not self._stopping.wait(max(0.0, tick - time.monotonic())):
            thread = threading.Thread(target=self._tick, name="chaos-beat-tick", daemon=True)
            self._ticks.append(thread)
            thread.start()
            tick += self.interval

    def _tick(self) -> None:
        began = time.monotonic()
        if self.rebuild and self._scan(["--rebuild"]) is None:
            return
        if self._scan([]) is not None:
            self.tick_seconds.append(time.monotonic() - began)

    def _scan(self, options: list[str]) -> int | None:
        """Run one scan to its end; None when the beat stopped it."""
        began = datetime.now(UTC)
        with self._lock:  # stop() sets the flag, then kills under this lock: no scan escapes it
            if self._stopping.is_set():
                return None
            proc = spawn([self.command, *options], self.env, self.logs / "scans.log")
            self._running.add(proc)
        status = proc.wait()
        with self._lock:
            self._running.discard(proc)
        if status == -signal.SIGKILL and self._stopping.is_set():
            return None
        self.scans.append(Scan(" ".join([self.command.removeprefix("order_timeout_"), *options]), proc.pid,
                               began, datetime.now(UTC), status))
        return status
