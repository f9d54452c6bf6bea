"""The benchmark's notices rows (issue 26): the sink that records what reaches it, the counts of
lost and duplicated notices, the commit records taken at the COMMIT, and what of it fails the run.
Behaviour only: no timing is asserted."""

from __future__ import annotations

import copy
import time
from types import SimpleNamespace

import pytest
import urllib3
from django.db import transaction

from bench import recorder
from bench.notices import await_deliveries, key_of, pk_of, tally
from bench.report import markdown, verdict
from bench.sink import Sink


@pytest.fixture
def sink():
    running = Sink().start()
    yield running
    running.stop()


def post(url: str, key: str, pool: urllib3.PoolManager | None = None) -> int:
    response = (pool or urllib3.PoolManager()).request(
        "POST", url, body=b'{"order": 1}', headers={"Content-Type": "application/json", "Idempotency-Key": key},
        retries=False)
    return response.status


def test_the_sink_records_each_requests_key_in_the_order_they_came(sink):
    pool = urllib3.PoolManager()
    before = time.time()

    statuses = [post(sink.url, key, pool) for key in ("a", "b", "a")]

    assert statuses == [200, 200, 200]
    assert [key for key, _at in sink.received()] == ["a", "b", "a"]
    assert all(at >= before for _key, at in sink.received())
    assert sink.count() == 3


def test_the_sink_answers_what_it_is_told_and_records_the_refused_too(sink):
    sink.status = 503

    assert post(sink.url, "refused") == 503
    assert [key for key, _at in sink.received()] == ["refused"]


def test_a_cleared_sink_starts_counting_again(sink):
    post(sink.url, "old")
    sink.clear()

    assert sink.received() == [] and sink.last_arrival() is None


def test_a_key_names_its_order_and_no_other_key_does():
    assert pk_of(key_of(42)) == 42
    assert pk_of("order-expired-email:order_timeout.order:42") is None
    assert pk_of("something else") is None


def test_the_tally_counts_delivered_duplicates_pending_and_lost():
    closed = {1, 2, 3, 4, 5}
    committed = dict.fromkeys(closed, 100.0)
    received = [(key_of(1), 100.5), (key_of(2), 100.2), (key_of(2), 130.0), (key_of(3), 101.0),
                (key_of(99), 100.1), ("a stray", 100.1)]

    counts = tally(closed, committed, received, low=1, high=5, pending=1)

    assert counts["expected"] == 5
    assert counts["delivered"] == 3
    assert counts["duplicates"] == 1 and counts["duplicated_orders"] == 1
    # 4 and 5 never came; the row still holds one of them: one pending, one lost.
    assert counts["pending"] == 1 and counts["lost"] == 1
    # Order 99 is outside the workload: a stray, as the request with no order's key.
    assert counts["strays"] == 2 and counts["unasked"] == 0
    # The first arrival of each key counts: 2's duplicate does not make it later.
    assert counts["lateness_ms"]["max"] == pytest.approx(1000.0)
    assert counts["lateness_ms"]["p50"] == pytest.approx(500.0)


def test_a_notice_of_an_order_that_is_not_closed_is_counted_apart():
    counts = tally({1}, {1: 10.0}, [(key_of(1), 10.1), (key_of(2), 10.1)], low=1, high=2)

    assert (counts["delivered"], counts["unasked"], counts["lost"]) == (1, 1, 0)


def test_the_wait_for_deliveries_ends_once_every_closed_order_has_its_notice(sink):
    for pk in (1, 2, 3):
        sink.record(key_of(pk), time.time())

    waited = await_deliveries(sink, {1, 2, 3}, 1, 3, pending=lambda: 99, cap_seconds=30)

    assert waited < 30


def test_the_wait_for_deliveries_ends_when_nothing_is_pending_and_the_sink_is_quiet(sink):
    sink.record(key_of(1), time.time() - 10)

    waited = await_deliveries(sink, {1, 2}, 1, 2, pending=lambda: 0, cap_seconds=30)

    assert waited < 30


def test_duplicates_do_not_end_the_wait_while_a_notice_is_still_missing(sink):
    for _ in range(3):
        sink.record(key_of(1), time.time())

    waited = await_deliveries(sink, {1, 2}, 1, 2, pending=lambda: 1, cap_seconds=1.5)

    assert waited >= 1.5


@pytest.mark.django_db(transaction=True)
def test_commit_records_of_one_transaction_are_taken_together_and_a_rollback_records_none(monkeypatch):
    monkeypatch.delenv("BENCH_RECORD_EAGER", raising=False)
    monkeypatch.setattr(recorder, "_commits", [])
    monkeypatch.setattr(recorder, "_open", None)
    later: list[float] = []

    with transaction.atomic():
        for pk in (1, 2, 3):
            recorder.on_expired_at_commit(None, SimpleNamespace(pk=pk))
            # A slow callback after each order's (the Celery peer's publish) does not move their time.
            transaction.on_commit(lambda: (time.sleep(0.01), later.append(time.time())))
    with transaction.atomic():
        recorder.on_expired_at_commit(None, SimpleNamespace(pk=4))
        transaction.set_rollback(True)
    with transaction.atomic():
        recorder.on_expired_at_commit(None, SimpleNamespace(pk=5))

    assert [pk for pk, _at in recorder._commits] == [1, 2, 3, 5]
    times = dict(recorder._commits)
    assert times[1] == times[2] == times[3] < later[0]


@pytest.mark.django_db(transaction=True)
def test_an_order_closed_outside_a_transaction_is_recorded_at_once(monkeypatch):
    monkeypatch.delenv("BENCH_RECORD_EAGER", raising=False)
    monkeypatch.setattr(recorder, "_commits", [])
    monkeypatch.setattr(recorder, "_open", None)

    recorder.on_expired_at_commit(None, SimpleNamespace(pk=7))
    recorder.on_expired_at_commit(None, SimpleNamespace(pk=8))

    assert [pk for pk, _at in recorder._commits] == [7, 8]


NOTICES = {"expected": 100, "delivered": 100, "duplicates": 0, "duplicated_orders": 0, "pending": 0, "lost": 0,
           "unasked": 0, "strays": 0, "lateness_ms": {"p50": 5.0, "p99": 9.0, "max": 12.0, "mean": 5.0},
           "lateness_samples": [], "waited_s": 0.1, "cpu_ms_per_order": 0.5}
RUN = {"orders": 100, "closed": 100, "closed_twice": 0, "drained": True, "held": 0, "held_closed": 0,
       "db_queries_per_close": 0.01, "closes_per_s": 1000.0, "lateness_ms": {"p50": 1.0, "p99": 2.0, "max": 3.0},
       "drain_s": 0.1, "watched_s": 1.0, "cpu_ms_per_close": 0.1, "redis_commands_per_close": 1.0}
CRASH = {"orders": 100, "closed": 100, "never": 0, "twice": 0, "late": 0, "late_bound_s": 1.5, "latest_s": 0.4,
         "unrecorded": 0, "killed_after_s": 0.2, "closed_at_kill": 40, "waited_after_kill_s": 3.0}


def data() -> dict:
    def row(name: str, notices: bool) -> dict:
        runs = {kind: {**RUN, **({"notices": dict(NOTICES)} if notices else {})} for kind in ("steady", "burst")}
        crash = {**CRASH, "killed": "a closer", **({"notices": dict(NOTICES)} if notices else {})}
        return {"label": name, "closers": "", "idle": None, "crash_note": "", "delivers_notices": notices,
                "crash": crash, **runs}

    return {"systems": {"ours": row("ours", False), "ours_notices": row("ours_notices", True),
                        "celery_notices": row("celery_notices", True)},
            "errors": {}, "quick": True,
            "sizes": {"steady_rate": 1, "steady_seconds": 1, "burst": 1, "idle": 1, "celery_idle": 1, "crash": 100,
                      "crash_cap_seconds": 20, "crash_lease_seconds": 2},
            "machine": {"cpus": 2, "cpu": "?", "memory_gib": 1, "database": "MariaDB", "redis": "7",
                        "python": "3", "django": "5"}}


def test_a_clean_notices_run_passes_and_shows_its_tables():
    clean = data()

    assert verdict(clean) == []
    text = markdown(clean)
    assert "Notices: one webhook per closed order" in text
    assert "Notices in the crash workload" in text


@pytest.mark.parametrize("kind", ["steady", "burst", "crash"])
def test_our_notices_row_losing_a_notice_fails_the_run(kind):
    lossy = data()
    lossy["systems"]["ours_notices"][kind]["notices"].update(delivered=99, lost=1)

    assert verdict(lossy) == [f"ours_notices {kind}: 1 of 100 notices lost"]


def test_our_notices_row_still_holding_a_notice_when_the_wait_ended_fails_the_run():
    late = data()
    late["systems"]["ours_notices"]["burst"]["notices"].update(delivered=98, pending=2)

    assert verdict(late) == ["ours_notices burst: 2 of 100 notices still undelivered when the wait ended"]


def test_duplicates_of_ours_and_the_peers_losses_are_results_not_failures():
    counted = data()
    counted["systems"]["ours_notices"]["crash"]["notices"].update(duplicates=16, duplicated_orders=16)
    peer = counted["systems"]["celery_notices"]
    peer["crash"]["notices"].update(delivered=60, lost=40)
    peer["crash_worker"] = copy.deepcopy(peer["crash"])

    assert verdict(counted) == []
    assert "| celery_notices | a closer | 100 of 100 | 60 of 100 | **40** |" in markdown(counted)
