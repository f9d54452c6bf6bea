"""The benchmark fails CI on what is wrong, never on a timing: a double close, a held order
closed, one of our systems crashing or leaving a workload undrained."""

from __future__ import annotations

import copy

import pytest

from bench.report import targets, verdict

RUN = {"orders": 100, "closed": 100, "closed_twice": 0, "drained": True, "held": 0, "held_closed": 0,
       "db_queries_per_close": 0.01}
DATA = {
    "systems": {
        "ours": {"steady": dict(RUN), "burst": dict(RUN)},
        "ours_shop": {"steady": dict(RUN), "burst": dict(RUN)},
        "ours_held": {"steady": None, "burst": {**RUN, "held": 10}},
        "celery_eta": {"steady": {**RUN, "closed": 40, "drained": False}, "burst": dict(RUN)},
    },
    "errors": {},
}


def test_a_clean_run_passes_even_when_another_system_falls_behind():
    assert verdict(DATA) == []


def test_our_shop_row_crashing_fails_the_run():
    data = copy.deepcopy(DATA)
    data["errors"]["ours_shop"] = ["Traceback ... ImproperlyConfigured"]

    assert verdict(data) == ["ours_shop: 1 consumer error(s)"]


def test_a_workload_of_ours_that_never_drains_fails_the_run():
    data = copy.deepcopy(DATA)
    data["systems"]["ours_shop"]["burst"].update(closed=60, drained=False)

    assert verdict(data) == ["ours_shop burst: 60 of 100 orders closed"]


def test_an_order_closed_twice_or_a_held_order_closed_fails_the_run_whoever_did_it():
    data = copy.deepcopy(DATA)
    data["systems"]["celery_eta"]["burst"]["closed_twice"] = 2
    data["systems"]["ours_held"]["burst"]["held_closed"] = 1

    assert verdict(data) == ["celery_eta burst: 2 orders closed twice",
                             "ours_held burst: 1 orders closed while their payment was in flight"]


def comparison(rounds_now: list[float], rounds_then: list[float]) -> dict:
    """A run of the plain row against its own at an older commit, in alternated rounds (closes/s, CPU)."""
    median_now, median_then = sorted(rounds_now)[len(rounds_now) // 2], sorted(rounds_then)[len(rounds_then) // 2]
    return {"compare": {"ref": "abc1234"},
            "systems": {"ours": {"burst": {**RUN, "closes_per_s": median_now}},
                        "ours@abc1234": {"burst": {**RUN, "closes_per_s": median_then}}},
            "rounds": {"ours": [(rate, 1.0) for rate in rounds_now],
                       "ours@abc1234": [(rate, 1.0) for rate in rounds_then]},
            "errors": {}}


def test_the_comparison_with_an_older_commit_is_the_median_of_the_rounds_own_ratios():
    """Round by round 0.98x, 0.95x, 0.99x (the machine slowed both runs of the first): met, 0.98x,
    though the median rounds' own rates read 95 / 100 = 0.95x."""
    data = comparison([60, 95, 99], [61, 100, 100])

    plain = [row for row in targets(data) if row[0].startswith("plain")]
    assert plain == [("plain: >= 0.97x the burst closes/s at abc1234, median of 3 rounds", "0.98x", True)]


def test_a_single_round_compares_the_two_rows_as_they_are():
    data = comparison([90], [100])

    plain = [row for row in targets(data) if row[0].startswith("plain")]
    assert plain == [("plain: >= 0.97x the burst closes/s at abc1234", "0.90x", False)]


def against_the_floor(burst: int, ours: float, cpu: float = 0.004) -> dict:
    """A run of the plain row and the floor (burst closes/s; closers' CPU per close, the floor's 0.002 ms)."""
    return {"sizes": {"burst": burst}, "errors": {},
            "systems": {"floor": {"burst": {**RUN, "closes_per_s": 100.0, "cpu_ms_per_close": 0.002}},
                        "ours": {"burst": {**RUN, "closes_per_s": ours, "cpu_ms_per_close": cpu}}}}


@pytest.mark.parametrize(("burst", "ours", "row"), [
    (100_000, 79, (">= 0.8x the floor's burst closes/s (a burst of 100,000 or more)", "0.79x", False)),
    (100_000, 80, (">= 0.8x the floor's burst closes/s (a burst of 100,000 or more)", "0.80x", True)),
    (30_000, 60, (">= 0.6x the floor's burst closes/s (a burst under 100,000)", "0.60x", True)),
])
def test_the_plain_burst_is_held_to_0_8x_the_floor_in_the_full_burst_and_0_6x_in_a_smaller_one(burst, ours, row):
    assert [found for found in targets(against_the_floor(burst, ours)) if "the floor's burst" in found[0]] == [row]


@pytest.mark.parametrize(("cpu", "measured", "met"), [(0.004, "2.0x", True), (0.0042, "2.1x", False)])
def test_the_closers_cpu_per_close_is_held_to_2x_the_floors(cpu, measured, met):
    rows = [found for found in targets(against_the_floor(100_000, 80, cpu)) if found[0].startswith("closers' CPU")]

    assert rows == [("closers' CPU per burst close <= 2x the floor's", measured, met)]
