"""Which run a figure comes from: the commit measured and the machine, for every report of the harness."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def commit() -> str:
    """The commit measured, said to have uncommitted changes when the tracked files have some."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    # Tracked files only: the harness's own new files are not "changes" to what was measured.
    changed = git("status", "--porcelain", "--untracked-files=no")
    return f"{head} (with uncommitted changes)" if changed else head


def machine() -> dict[str, Any]:
    """The machine and the servers' versions, as the database Django is connected to reports its own."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version" if connection.vendor == "postgresql" else "SELECT VERSION()")
        version = str(cursor.fetchone()[0]).split()[0]
    memory = next((line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                   if line.startswith("MemTotal")), "0")
    redis_version = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout
    return {
        "cpus": os.cpu_count(), "memory_gib": round(int(memory) / 2**20, 1),
        "cpu": next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("model name")), "?"),
        # "mariadb": the fault runs' reports name it so; "database": the soak's, which runs on either.
        "database": f"{database_name()} {version}", database_name().lower(): version,
        "redis": redis_version.split("v=")[1].split()[0] if "v=" in redis_version else "?",
        "python": platform.python_version(), "django": __import__("django").get_version(),
    }


def database_name() -> str:
    """The database Django is connected to, as people name it."""
    from django.db import connection

    return "PostgreSQL" if connection.vendor == "postgresql" else "MariaDB"
