"""Counters read from the servers themselves, so every system is measured the same way."""

from __future__ import annotations

import statistics
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.db import connection


def db_questions() -> int:
    """Statements the database has received from all clients.

    MariaDB: SHOW GLOBAL STATUS 'Questions'. PostgreSQL: the calls pg_stat_statements
    counted (scripts/bench loads it), plus the transactions' BEGIN/COMMIT, which it
    does not count, so both count what a client sends.
    """
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT (SELECT coalesce(sum(calls), 0) FROM pg_stat_statements)"
                           " + (SELECT sum(xact_commit + xact_rollback) * 2 FROM pg_stat_database)")
            return int(cursor.fetchone()[0])
        cursor.execute("SHOW GLOBAL STATUS LIKE 'Questions'")
        return int(cursor.fetchone()[1])


def redis_commands(client: Any) -> int:
    """Commands Redis has processed (scripts' inner calls included)."""
    return int(client.info("stats")["total_commands_processed"])


def redis_memory(client: Any) -> int:
    return int(client.info("memory")["used_memory"])


@dataclass
class Counters:
    """DB statements and Redis commands between ``start()`` and ``stop()``, minus our own."""

    client: Any
    questions: int = 0
    commands: int = 0
    own_queries: int = 0

    def start(self) -> Counters:
        self.questions, self.commands = db_questions(), redis_commands(self.client)
        self.own_queries = 1  # the SHOW STATUS that ends the window
        return self

    def stop(self) -> tuple[int, int]:
        questions = db_questions() - self.questions - self.own_queries
        # INFO itself counts once at each end.
        commands = redis_commands(self.client) - self.commands - 2
        return max(questions, 0), max(commands, 0)


class ClientCommands:
    """Commands clients send, told apart from those scripts run inside Redis (via MONITOR).

    ``total_commands_processed`` counts a script's inner calls too; a consumer
    that sends one EVALSHA a second sends one command a second, however many
    reads its script does. A pipeline's commands count one each, though they
    share one round trip (an idle consumer's refresh: two commands, one trip).
    """

    def __init__(self, client: Any) -> None:
        from redis import ConnectionPool, Redis

        self.client = client
        # A connection of its own that never times out: a quiet spell is the point.
        pool = client.connection_pool
        self.watcher = Redis(connection_pool=ConnectionPool(
            connection_class=pool.connection_class,
            **{**pool.connection_kwargs, "socket_timeout": None}))
        self.sent = self.in_scripts = 0
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> ClientCommands:
        self._thread.start()
        self._ready.wait(5)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self.client.ping()  # wakes the monitor so it sees the flag
        self._thread.join(5)
        self.sent = max(0, self.sent - 1)  # that PING

    def _watch(self) -> None:
        with self.watcher.monitor() as monitor:
            self._ready.set()
            while not self._stop.is_set():
                entry = monitor.next_command()
                if self._stop.is_set():
                    return
                if entry.get("client_type") == "lua":
                    self.in_scripts += 1
                else:
                    self.sent += 1


def process_tree(pid: int) -> list[int]:
    """``pid`` and every process below it (a Celery worker's pool)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo += children.get(current, [])
    return tree


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def summary(values: list[float]) -> dict[str, float]:
    return {"p50": percentile(values, 50), "p99": percentile(values, 99),
            "max": max(values) if values else float("nan"),
            "mean": statistics.fmean(values) if values else float("nan")}
