"""From the samples to the verdicts: every series fitted over the steady state, and the targets.

The series: each app table's rows and bytes (and the open dead letters' rows), each Redis key
pattern's keys, members and bytes, the Redis server's memory and clients, the database's
connections, and consumer 0's memory and open files (consumer 0 is never killed: the others are
restarted every minute or so, their memory a sawtooth of warm-ups). The targets of
docs/benchmarks.md: every app table (but the orders, the shop's own) and every key pattern flat;
consumer 0's RSS, from the reference moment on, within ``RSS_TARGET_KB`` of its value then.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .fit import FLAT, FLOORS, Fit, least_squares
from .plan import OPEN_LETTERS, Plan

RSS_TARGET_KB = 5 * 1024
# The consumer slot never killed.
LONG_LIVED = 0


@dataclass(frozen=True)
class Series:
    group: str  # "table", "redis", "server", "process"
    name: str
    measure: str  # a key of FLOORS
    fit: Fit | None
    verdict: str
    # Why growth is expected here (the shop's orders), or "".
    expected: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"group": self.group, "name": self.name, "measure": self.measure, "verdict": self.verdict,
                "expected": self.expected, "fit": self.fit.as_dict() if self.fit else None}


def fitted(samples: Sequence[dict[str, Any]], plan: Plan) -> list[dict[str, Any]]:
    """The samples of the steady state: taken while orders came, in the stream's second half."""
    return [sample for sample in samples if sample["phase"] == "stream" and sample["at"] >= plan.fit_from]


def _series(group: str, name: str, measure: str, window: Sequence[dict[str, Any]],
            read: Callable[[dict[str, Any]], float | None], expected: str = "") -> Series:
    points = [(sample["orders"], value) for sample in window if (value := read(sample)) is not None]
    fit = least_squares([x for x, _ in points], [y for _, y in points])
    verdict = fit.verdict(FLOORS[measure]) if fit else "no fit"
    return Series(group, name, measure, fit, verdict, expected)


def _reader(part: str, name: str, measure: str) -> Callable[[dict[str, Any]], float | None]:
    """A sample's figure of one table or key pattern (0 where the sample has none: no key of it)."""
    return lambda sample: sample[part].get(name, {}).get(measure, 0)


def all_series(samples: Sequence[dict[str, Any]], plan: Plan, orders_table: str) -> list[Series]:
    window = fitted(samples, plan)
    tables = sorted({name for sample in samples for name in sample["tables"]})
    patterns = sorted({name for sample in samples for name in sample["keys"]})
    found: list[Series] = []
    for table in tables:
        expected = "the shop's orders: a row per order, by design" if table == orders_table else ""
        for measure in ("rows",) if table == OPEN_LETTERS else ("rows", "bytes"):
            found.append(_series("table", table, measure, window, _reader("tables", table, measure), expected))
    for pattern in patterns:
        for measure in ("keys", "members", "bytes"):
            found.append(_series("redis", pattern, measure, window, _reader("keys", pattern, measure)))
    found += [
        _series("server", "Redis used_memory", "bytes", window, lambda s: s["redis"]["used_memory"]),
        _series("server", "Redis clients", "connections", window, lambda s: s["redis"]["connected_clients"]),
        _series("server", "database connections", "connections", window, lambda s: s["database_connections"]),
    ]
    if plan.consumers:
        found += [
            _series("process", f"consumer {LONG_LIVED} (never killed) RSS", "rss_kb", window,
                    lambda s: s["consumers"][LONG_LIVED]["rss_kb"] if s["consumers"] else None),
            _series("process", f"consumer {LONG_LIVED} (never killed) open files", "files", window,
                    lambda s: s["consumers"][LONG_LIVED]["open_files"] if s["consumers"] else None),
        ]
    return found


@dataclass(frozen=True)
class Target:
    name: str
    met: bool | None  # None: too few samples to say
    detail: str

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "met": self.met, "detail": self.detail}


def _flat_target(name: str, series: list[Series]) -> Target:
    judged = [one for one in series if not one.expected]
    if not judged or any(one.fit is None or one.verdict == "too few samples" for one in judged):
        return Target(name, None, "too few samples in the fitted half to judge")
    off = [f"{one.name} {one.measure} ({one.verdict})" for one in judged if one.verdict != FLAT]
    return Target(name, not off, "; ".join(off) if off else f"all {len(judged)} series flat")


def rss_target(samples: Sequence[dict[str, Any]], plan: Plan) -> Target:
    """Consumer 0's RSS from the reference moment on, against its value then (one process throughout)."""
    name = f"consumer {LONG_LIVED}'s RSS within {RSS_TARGET_KB // 1024} MB of its value at {plan.rss_reference:g} s"
    stream = [sample for sample in samples if sample["phase"] == "stream" and sample["consumers"]]
    later = [sample for sample in stream if sample["at"] >= plan.rss_reference]
    if len(later) < 2:
        return Target(name, None, "too few samples after the reference moment")
    reference = later[0]["consumers"][LONG_LIVED]
    pids = {sample["consumers"][LONG_LIVED]["pid"] for sample in stream}
    values = [sample["consumers"][LONG_LIVED]["rss_kb"] for sample in later]
    if len(pids) > 1 or None in values:
        return Target(name, False, f"consumer {LONG_LIVED} was restarted ({len(pids)} processes)")
    worst = max((value - reference["rss_kb"] for value in values), key=abs)
    return Target(name, abs(worst) <= RSS_TARGET_KB,
                  f"{reference['rss_kb'] / 1024:.1f} MB at {later[0]['at']:.0f} s, at most {worst / 1024:+.1f} MB "
                  f"from it up to {later[-1]['at']:.0f} s")


def targets(series: list[Series], samples: Sequence[dict[str, Any]], plan: Plan) -> list[Target]:
    return [
        _flat_target("every app table flat (rows and bytes; but the orders)",
                     [one for one in series if one.group == "table"]),
        _flat_target("every Redis key pattern flat (keys, members, bytes)",
                     [one for one in series if one.group == "redis"]),
        rss_target(samples, plan),
    ]
