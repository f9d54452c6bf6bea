"""The benchmark fails CI on what is wrong, never on a timing: a double close, a held order
closed, one of our systems crashing or leaving a workload undrained."""

from __future__ import annotations

import copy

from bench.report import verdict

RUN = {"orders": 100, "closed": 100, "closed_twice": 0, "drained": True, "held": 0, "held_closed": 0}
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
