"""The housekeeping benchmark (bench/housekeeping.py) judges its runs by their premise and its ratio
against its own noise: a run whose scan did not go on beside the closes says nothing, and fails."""

from __future__ import annotations

import copy
from datetime import UTC, datetime

from bench.housekeeping import failures, overlap, verdict

START = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)


def run(mode: str, p99: float, round_number: int = 1, **changes):
    scan = None if mode == "without" else {"started": "2026-12-07T11:59:58+00:00",
                                            "ended": "2026-12-07T12:01:00+00:00", "elapsed_ms": 62000,
                                            "figures": {"examined": 1000}}
    return {"mode": mode, "round": round_number, "closed": 90, "orders": 90, "closed_twice": 0,
            "lateness_ms": {"p50": 5.0, "p99": p99, "max": p99 * 2}, "closers_exited_badly": [],
            "scan": scan, "scan_overlap": 1.0, "table_open_after": 1000, **changes}


RESULT = {"database": "MariaDB", "rows": 1000,
          "runs": [run("without", 20.0), run("with", 22.0), run("with", 21.0, 2), run("without", 25.0, 2)]}


def test_the_scan_within_the_spread_of_the_runs_without_it_is_within_the_noise():
    figures = verdict(RESULT["runs"])

    assert figures["median_without_ms"] == 22.5 and figures["median_with_ms"] == 21.5
    assert figures["noise"] == 1.25
    assert figures["within_noise"]


def test_a_scan_that_costs_more_than_the_noise_is_said_so():
    runs = [run("without", 20.0), run("with", 40.0), run("with", 44.0, 2), run("without", 21.0, 2)]

    figures = verdict(runs)

    assert round(figures["ratio"], 2) == 2.05
    assert not figures["within_noise"]


def test_the_overlap_is_the_share_of_the_row_the_scan_ran_beside():
    scan = {"started": "2026-12-07T12:00:10+00:00", "ended": "2026-12-07T12:00:25+00:00"}

    assert overlap(scan, START, 30) == 0.5
    assert overlap({**scan, "started": "2026-12-07T11:00:00+00:00"}, START, 30) == 25 / 30
    assert overlap(None, START, 30) == 0.0


def test_a_clean_run_has_no_failures():
    assert failures(RESULT) == []


def test_a_scan_that_ended_before_the_row_did_fails_the_run():
    result = copy.deepcopy(RESULT)
    result["runs"][1]["scan_overlap"] = 0.6

    assert failures(result) == ["MariaDB, round 1, with the housekeeping: the scan ran beside 60% of the row only"]


def test_a_scan_with_no_housekeeping_a_missed_close_and_a_closed_table_row_fail_the_run():
    result = copy.deepcopy(RESULT)
    result["runs"][0].update(scan=RESULT["runs"][1]["scan"], closed=89)
    result["runs"][3]["table_open_after"] = 999

    assert failures(result) == [
        "MariaDB, round 1, without the housekeeping: 89 of 90 closed, 0 twice",
        "MariaDB, round 1, without the housekeeping: a scan ran with --no-housekeeping",
        "MariaDB, round 2, without the housekeeping: 1 of the table's rows closed",
    ]
