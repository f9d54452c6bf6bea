"""What the app's housekeeping keeps in Redis: where the compensation scan's walk starts, the
prune's turn and totals, and the version of the timers' pauses.

Nothing here is the truth about an order. Lost with the rest of Redis, each is rebuilt by its
next run: the scan walks every overdue row again (as it must, since Redis lost its members too),
the prune runs at the next beat, and its totals count again from zero (a Prometheus counter's
reset).
"""

from __future__ import annotations

from collections.abc import Mapping
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


class Housekeeping:
    """The housekeeping keys of one queue (``GlobalKeys``); every call one round trip."""

    def __init__(self, client: Any, keys: GlobalKeys) -> None:
        self.client = client
        self.keys = keys

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

    def take_prune_turn(self, token: str, every_ms: int) -> bool:
        """True when no prune ran in the last ``every_ms``: this caller's turn (SET NX PX)."""
        with redis_errors("take the prune's turn"):
            return bool(self.client.set(self.keys.prune_turn, token, nx=True, px=every_ms))

    def give_back_prune_turn(self, token: str) -> None:
        """A prune that stopped before it was done: the next beat goes on with it."""
        with redis_errors("give back the prune's turn"):
            if self.client.get(self.keys.prune_turn) in (token, token.encode()):
                self.client.delete(self.keys.prune_turn)

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
