"""Child processes of the harness: started with their output in a file, and all killed at the end.

Also ``repeatedly``, the loop a scenario runs a fault in while it waits.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Every process spawned, so that nothing outlives the run (``kill_all``).
_spawned: list[subprocess.Popen[bytes]] = []
_spawned_lock = threading.Lock()


def spawn(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """Start ``python manage.py <command>`` with its output appended to ``log`` (a file, never a pipe)."""
    with log.open("ab") as out:
        proc = subprocess.Popen([sys.executable, "manage.py", *command], cwd=ROOT, env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    with _spawned_lock:
        _spawned[:] = [*(p for p in _spawned if p.poll() is None), proc]
    return proc


def kill_all() -> None:
    """SIGKILL every spawned process still alive: the last line of the cleanup."""
    with _spawned_lock:
        alive = [proc for proc in _spawned if proc.poll() is None]
    for proc in alive:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
        proc.wait()


def is_stopped(pid: int) -> bool:
    """Whether the process is frozen (SIGSTOP): state T in /proc."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] in ("T", "t")


@contextmanager
def repeatedly(every: float, action: Callable[[], None], *, jitter: float = 0.5) -> Iterator[None]:
    """Call ``action()`` every ``every`` seconds (± ``jitter`` of it) in a thread, while inside."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(every * random.uniform(1 - jitter, 1 + jitter)):
            action()

    thread = threading.Thread(target=loop, name="chaos-fault", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
