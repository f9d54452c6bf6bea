"""The consumers, as a supervisor runs them: N processes, each restarted at once when it exits.

``ConsumerPool`` keeps N ``run_timeout_consumer`` processes alive the way
systemd's ``Restart=always`` would, accounts for every exit (a kill by the
harness, a receiver's ``os._exit()``, or a crash), and is where scenarios
kill, freeze and thaw them.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from order_timeout.timers.watchdog import EXIT_STUCK

from .processes import is_stopped, spawn

logger = logging.getLogger("chaos")

# How a consumer's exit is accounted for.
KILLED_BY_HARNESS = "killed by the harness"
EXITED_IN_RECEIVER = "its receiver exited the process"
# run_timeout_consumer's own exit when a receiver keeps its thread (EXIT_STUCK).
EXITED_STUCK = "it exited, stuck in a receiver"
STOPPED_BY_HARNESS = "stopped at the end"
UNEXPECTED = "unexpected"


@dataclass
class Exit:
    slot: int
    pid: int
    status: int
    cause: str


@dataclass
class Slot:
    number: int
    proc: subprocess.Popen[bytes]
    # The harness killed it: its exit is expected.
    doomed: bool = False
    # time.monotonic() at which a frozen process is thawed (set when first seen frozen).
    thaw_at: float | None = None


@dataclass
class ConsumerPool:
    """``size`` consumers, each restarted as soon as it exits, until ``stop()``."""

    size: int
    env: dict[str, str]
    logs: Path
    # How long a process that froze itself (or was frozen without a hold) stays frozen.
    freeze_hold: float = 6.0
    # Any receiver exit status that is part of the scenario.
    expected_status: int | None = None
    # Its logs are ``{name}-{slot}.log`` (a scenario may run two pools with different settings).
    name: str = "consumer"
    exits: list[Exit] = field(default_factory=list)
    kills: int = 0
    freezes: int = 0
    thaws: int = 0
    slots: list[Slot] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._supervise, name="chaos-supervisor", daemon=True)

    # -- lifetime ------------------------------------------------------------

    def start(self) -> None:
        self.slots = [Slot(number, self._spawn(number)) for number in range(self.size)]
        self._thread.start()

    def _spawn(self, number: int) -> subprocess.Popen[bytes]:
        return spawn(["run_timeout_consumer", "-v", "1"], self.env, self.logs / f"{self.name}-{number}.log")

    def stop(self) -> None:
        """Thaw everything, SIGTERM, wait for the batches in hand; SIGKILL what outlives 30 s."""
        self._stopping.set()
        self._thread.join()
        with self._lock:
            for slot in self.slots:
                if slot.proc.poll() is None:
                    os.kill(slot.proc.pid, signal.SIGCONT)
                    slot.proc.terminate()
            deadline = time.monotonic() + 30
            for slot in self.slots:
                try:
                    slot.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    slot.proc.kill()
                    slot.proc.wait()
                status = slot.proc.returncode
                # One stuck in a receiver cannot finish its batch: it exits 75 at the end too, as it would
                # have a moment later (``hang-forever``'s last taker, stopped as its order is buried).
                cause = (STOPPED_BY_HARNESS if status in (0, -signal.SIGTERM, -signal.SIGKILL)
                         else EXITED_STUCK if status == EXIT_STUCK else UNEXPECTED)
                self._account(slot, cause=cause)

    def _supervise(self) -> None:
        while not self._stopping.wait(0.05):
            with self._lock:
                for slot in self.slots:
                    if slot.proc.poll() is not None:
                        self._account(slot)
                        slot.proc, slot.doomed, slot.thaw_at = self._spawn(slot.number), False, None
                    else:
                        self._thaw_when_due(slot)

    def _account(self, slot: Slot, cause: str | None = None) -> None:
        status = slot.proc.returncode
        if cause is None:
            if slot.doomed:
                cause = KILLED_BY_HARNESS
            elif self.expected_status is not None and status == self.expected_status:
                cause = EXITED_IN_RECEIVER
            elif status == EXIT_STUCK:
                cause = EXITED_STUCK
            else:
                cause = UNEXPECTED
        self.exits.append(Exit(slot.number, slot.proc.pid, status, cause))
        if cause == UNEXPECTED:
            logger.warning("consumer %d (pid %d) exited with status %s", slot.number, slot.proc.pid, status)

    # -- faults ------------------------------------------------------------------

    def _running(self) -> list[Slot]:
        return [slot for slot in self.slots if slot.proc.poll() is None and not slot.doomed]

    def kill_one(self) -> None:
        """SIGKILL a random live consumer; the supervisor starts it again."""
        with self._lock:
            running = self._running()
            if running:
                slot = random.choice(running)
                slot.doomed = True
                slot.proc.kill()
                self.kills += 1

    def kill_pid(self, pid: int, signum: int = signal.SIGKILL) -> bool:
        """SIGKILL this live consumer (one the scenario caught in the act); whether it was one of ours.

        ``signum``: another signal whose exit the supervisor expects (the soak's SIGTERM, a deploy's
        stop: the consumer finishes its batch and exits, and is started again)."""
        with self._lock:
            for slot in self._running():
                if slot.proc.pid == pid:
                    slot.doomed = True
                    slot.proc.send_signal(signum)
                    self.kills += 1
                    return True
        return False

    def freeze_one(self, hold: float, keep_awake: int = 2) -> None:
        """SIGSTOP a random running consumer for ``hold`` seconds, leaving ``keep_awake`` awake.

        A freeze is a consumer's fault, not the fleet's: with every consumer
        frozen, no bound of the lease could hold.
        """
        with self._lock:
            awake = [slot for slot in self._running() if slot.thaw_at is None]
            if len(awake) > keep_awake:
                slot = random.choice(awake)
                os.kill(slot.proc.pid, signal.SIGSTOP)
                slot.thaw_at = time.monotonic() + hold
                self.freezes += 1

    def _thaw_when_due(self, slot: Slot) -> None:
        if slot.thaw_at is None:
            if is_stopped(slot.proc.pid):  # it froze itself (chaos.pauses)
                slot.thaw_at = time.monotonic() + self.freeze_hold
                self.freezes += 1
            return
        if time.monotonic() >= slot.thaw_at:
            os.kill(slot.proc.pid, signal.SIGCONT)
            slot.thaw_at = None
            self.thaws += 1

    @property
    def unexpected_exits(self) -> list[Exit]:
        return [exit_ for exit_ in self.exits if exit_.cause == UNEXPECTED]

    def pids(self) -> list[int]:
        return [slot.proc.pid for slot in self.slots]
