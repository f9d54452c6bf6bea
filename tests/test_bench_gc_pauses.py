"""The closers' full garbage collections (bench/gc_pauses.py): counted, told inside a batch or not,
written at exit, read back and counted in a workload's window. Behaviour only: no timing is asserted."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.gc_pauses import Collection, Collections, Written, read, tally, write
from bench.report import markdown


@pytest.fixture
def collections() -> Iterator[Collections]:
    counting = Collections().start()
    yield counting
    counting.stop()


def test_a_full_collection_inside_a_wrapped_call_is_counted_as_in_a_batch(collections: Collections) -> None:
    batch = collections.batch(lambda: gc.collect(2))

    batch()

    assert collections.batches == 1
    assert [seen.in_batch for seen in collections.seen] == [True]
    assert collections.seen[0].seconds >= 0


def test_a_full_collection_between_batches_is_counted_apart_and_younger_ones_not_at_all(
        collections: Collections) -> None:
    collections.batch(lambda: None)()

    gc.collect(2)
    gc.collect(0)
    gc.collect(1)

    assert [seen.in_batch for seen in collections.seen] == [False]


def test_a_stopped_count_counts_no_more(collections: Collections) -> None:
    collections.stop()

    gc.collect(2)

    assert collections.seen == []


def test_what_a_process_wrote_is_read_back_and_counted_in_the_window_alone(tmp_path: Path) -> None:
    consumer = Collections()
    consumer.batches = 7
    consumer.seen = [Collection(100.0, 0.010, True), Collection(105.0, 0.030, False), Collection(200.0, 0.5, True)]
    write(consumer, tmp_path)
    floor = Written(pid=1, batches=0, seen=[Collection(101.0, 0.002, False)])

    counted = tally([*read(tmp_path), floor], since=99.0, until=110.0)

    assert counted is not None
    assert (counted["collections"], counted["in_batch"]) == (3, 1)
    assert counted["longest_ms"] == pytest.approx(30.0) and counted["total_ms"] == pytest.approx(42.0)
    # A process that ran no batch of ours has none to be in.
    assert [process["in_batch"] for process in counted["processes"]] == [1, None]


def test_no_process_wrote_anything_and_nothing_is_reported(tmp_path: Path) -> None:
    assert tally(read(tmp_path), 0.0, 1.0) is None


def test_the_report_says_each_rows_collections_per_workload() -> None:
    counted = {"collections": 3, "in_batch": 2, "total_ms": 60.3, "longest_ms": 41.2,
               "processes": [{"collections": 2}, {"collections": 1}]}
    run = {"orders": 10, "closed": 10, "drained": True, "drain_s": 1.0,
           "lateness_ms": {"p50": 1.0, "p99": 2.0, "max": 3.0}, "gc": counted}
    held = {"label": "ours_held", "closers": "2", "idle": None, "steady": None, "burst": run}
    data = {"systems": {"ours_held": held},
            "sizes": {"steady_rate": 1, "steady_seconds": 1, "burst": 10, "idle": 1, "celery_idle": 1},
            "quick": True, "errors": {}, "machine": {"cpus": 2, "cpu": "x", "memory_gib": 1, "database": "d",
                                                     "redis": "r", "python": "p", "django": "dj"}}

    text = markdown(data)

    assert ("| ours_held | - | gen-2 collections: 3 (in a batch: 2), longest 41.2 ms, 60.3 ms in all; "
            "by process 2, 1 |") in text
