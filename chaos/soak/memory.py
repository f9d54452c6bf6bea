"""A process's memory and open files, as Linux reports them in ``/proc``."""

from __future__ import annotations

import os
from pathlib import Path


def rss_kb(pid: int) -> int | None:
    """Resident memory (``VmRSS``, kB); None when the process is gone (killed a moment ago)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def open_files(pid: int) -> int | None:
    """File descriptors the process holds (sockets included); None when it is gone."""
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
