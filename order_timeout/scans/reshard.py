"""Move every member, of every kind, from the layout of an old ``SHARDS`` to the current one, losing none.

Deploy the new ``SHARDS`` everywhere first: from then on, saves schedule and
consumers claim in the new layout, and what waits in the old one is stranded
(the compensation scan would close it, late). The reshard copies each member
(its deadline and its retry state) into the shard it belongs to now, then
takes it out of the old shard only if it is still as it was read. A member
leased in the old layout (by a consumer still running the old setting) is
moved once its lease runs out; the reshard waits for that.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from ..conf import settings
from ..queue import SLICE, Shard, TimeoutQueue, redis_errors
from ..timers.members import now_score
from ..timers.registry import registry


@dataclass
class ReshardResult:
    old_shards: int
    new_shards: int
    dry_run: bool = False
    # Members copied into the new layout (or, with dry_run, that would be).
    moved: int = 0
    # Leases still live in the old layout when the reshard stopped waiting.
    still_leased: int = 0
    passes: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Reshard:
    def __init__(self, old_shards: int, *, queue: TimeoutQueue | None = None, dry_run: bool = False,
                 wait_seconds: float | None = None, clock_ms: Callable[[], int] | None = None,
                 kinds: list[Any] | None = None) -> None:
        base = queue or TimeoutQueue.from_settings()
        # Every kind's queue, old layout and new: the order close's, the reminders', each timer's.
        self.layouts = [(base.of_kind(kind.key_space), TimeoutQueue(base.client, base.prefix, old_shards,
                                                                    kind.key_space))
                        for kind in (kinds if kinds is not None else registry.kinds())]
        self.new, self.old = self.layouts[0]
        self.dry_run = dry_run
        self.wait_seconds = settings.longest_in_hand() + 5 if wait_seconds is None else wait_seconds
        self.clock_ms = clock_ms or now_score_now
        self.result = ReshardResult(old_shards, len(self.new.shards), dry_run=dry_run)

    def run(self) -> ReshardResult:
        give_up_at = time.monotonic() + self.wait_seconds
        while True:
            self.result.passes += 1
            self.result.still_leased = 0
            for new, old in self.layouts:
                self.new, self.old = new, old
                for shard in old.shards:
                    self._move_shard(shard)
            if self.dry_run or not self.result.still_leased or time.monotonic() >= give_up_at:
                return self.result
            time.sleep(1.0)

    def _move_shard(self, source: Shard) -> None:
        now = self.clock_ms()
        for members in self._scan(source.keys.pending):
            self._move(source, {member: (score, None) for member, score in members}, now)
        for members in self._scan(source.keys.leased):
            expired = {member: (None, lease) for member, lease in members if lease <= now}
            self.result.still_leased += sum(1 for member, lease in members
                                            if lease > now and self._leaves(source, member))
            self._move(source, expired, now)

    def _scan(self, key: str) -> Iterator[list[tuple[str, int]]]:
        with redis_errors("read the old layout"):
            batch: list[tuple[str, int]] = []
            for member, score in self.new.client.zscan_iter(key, count=SLICE):
                batch.append((member.decode() if isinstance(member, bytes) else member, int(score)))
                if len(batch) >= SLICE:
                    yield batch
                    batch = []
            if batch:
                yield batch

    def _leaves(self, source: Shard, member: str) -> bool:
        return self.new.shard_for(member).keys.tag != source.keys.tag

    def _move(self, source: Shard, where: Mapping[str, tuple[int | None, int | None]], now: int) -> None:
        leaving = {member: place for member, place in where.items() if self._leaves(source, member)}
        if not leaving:
            return
        self.result.moved += len(leaving)
        if self.dry_run:
            return
        state = self._state(source, list(leaving))
        for target, part in self.new.by_shard(leaving).items():
            target.schedule({m: _due(leaving[m][0], now) for m in part}, only_missing=True)
            self._copy_state(target, {m: state[m] for m in part})
        args: list[Any] = [now]
        for member, (score, lease) in leaving.items():
            args += [member, "" if score is None else score, "" if lease is None else lease]
        with redis_errors("take members out of the old layout"):
            self.new.scripts["move_out"](keys=source.keys.all(), args=args)

    def _state(self, source: Shard, members: list[str]) -> dict[str, tuple[Any, ...]]:
        keys = source.keys
        with redis_errors("read retry state"):
            pipe = self.new.client.pipeline(transaction=False)
            pipe.hmget(keys.attempts, members)
            pipe.hmget(keys.first_failure, members)
            pipe.hmget(keys.takeovers, members)
            pipe.zmscore(keys.busy, members)
            attempts, first, takeovers, busy = pipe.execute()
        return {member: (count, since, taken, locked) for member, count, since, taken, locked
                in zip(members, attempts, first, takeovers, busy, strict=True)}

    def _copy_state(self, target: Shard, state: dict[str, tuple[Any, ...]]) -> None:
        keys = target.keys
        with redis_errors("copy retry state"):
            pipe = self.new.client.pipeline(transaction=False)
            for member, (attempts, first, takeovers, busy) in state.items():
                if attempts is not None:
                    pipe.hsetnx(keys.attempts, member, attempts)
                if first is not None:
                    pipe.hsetnx(keys.first_failure, member, first)
                if takeovers is not None:
                    pipe.hsetnx(keys.takeovers, member, takeovers)
                if busy is not None:
                    pipe.zadd(keys.busy, {member: busy}, nx=True)
            pipe.execute()


def _due(score: int | None, now: int) -> int:
    """A lease that ran out comes back due: it was due when it was claimed."""
    return now if score is None else score


def now_score_now() -> int:
    from django.utils import timezone

    return now_score(timezone.now())


def reshard(old_shards: int, **options: Any) -> ReshardResult:
    return Reshard(old_shards, **options).run()
