"""The benchmark's slow receivers workload (bench/slow_receivers.py): its counts from the commit
records and the consumers' stderr, its section of the report, and what of it fails the run (an
order closed twice or never, a consumer crashing; never its timings). No timing is asserted."""

from __future__ import annotations

import copy

from bench.report import markdown, verdict
from bench.slow_receivers import given_up, least_claim, tally

# A consumer's stderr at -v 0 (two batches given up, the claims halved after the first), as a run wrote it.
LOG = """System check identified some issues:

WARNINGS:
?: (order_timeout.W012) Notice handler 'order-expired-email' has a timeout of 10 s, more than half of \
BATCH_TIME_LIMIT (2 s): one slow delivery would cost its batch its time.
2026-12-05 17:46:37,553 WARNING order_timeout close: a batch of 200 still running after BATCH_TIME_LIMIT (2s): \
giving it up; its database session is ended, and its members are taken over as a batch, then one at a time if it \
dies again.
2026-12-05 17:46:37,563 WARNING order_timeout close: a batch of 200 was given up for time with 94 done: claiming \
at most 47 from now on, more again once batches finish well inside BATCH_TIME_LIMIT (2s).
2026-12-05 17:46:41,002 WARNING order_timeout close: a batch of 47 still running after BATCH_TIME_LIMIT (2s): \
giving it up; its database session is ended, and its members are taken over as a batch, then one at a time if it \
dies again.
2026-12-05 17:46:41,010 WARNING order_timeout close: a batch of 47 was given up for time with 20 done: claiming \
at most 10 from now on, more again once batches finish well inside BATCH_TIME_LIMIT (2s).
2026-12-05 17:46:41,011 WARNING order_timeout Could not hand over the leases of the batch given up: Redis down
Received SIGTERM; finishing the batch in hand.
"""


def test_an_order_recorded_twice_counts_twice_and_the_drain_runs_from_the_deadline_to_the_last_close():
    # 3 orders due at t=100, two consumers, receivers of 2 s an order: their own time is 3 s.
    commits = [(1, 100.5), (2, 101.0), (2, 101.2), (3, 106.0)]

    counts = tally(3, 100.0, commits, never=0, logs=[LOG, ""], delay=2.0)

    assert (counts["closed"], counts["never"], counts["twice"], counts["unrecorded"]) == (3, 0, 1, 0)
    assert (counts["drain_s"], counts["receivers_s"], counts["ratio"]) == (6.0, 3.0, 2.0)
    assert (counts["given_up"], counts["least_claim"]) == ([2, 0], [10, None])


def test_a_run_that_did_not_drain_has_no_drain_nor_ratio_but_says_its_latest_close():
    counts = tally(3, 100.0, [(1, 101.0), (2, 139.0)], never=1, logs=["", ""], delay=0.02)

    assert (counts["closed"], counts["never"], counts["drain_s"], counts["ratio"]) == (2, 1, None, None)
    assert counts["latest_s"] == 39.0


def test_only_the_lease_guards_warning_counts_as_a_batch_given_up():
    assert given_up(LOG) == 2
    assert given_up("2026-12-05 17:46:37,553 INFO order_timeout giving it up") == 0


def test_the_least_claim_is_the_smallest_the_batch_sizes_announced_and_none_before_them():
    assert least_claim(LOG) == 10
    assert least_claim("2026-12-05 17:46:37,553 WARNING order_timeout close: a batch of 200 still running") is None


RUN = {"orders": 600, "closed": 600, "never": 0, "twice": 0, "unrecorded": 0, "drain_s": 8.47, "latest_s": 8.47,
       "receivers_s": 6.0, "ratio": 1.41, "given_up": [1, 1], "least_claim": [47, 46], "batch": 200,
       "delay_s": 0.02, "time_limit_s": 2.0, "cap_s": 60.0, "consumers_ready_s": 0.8, "waited_s": 8.5,
       "took_s": 11.0, "errors": []}
MACHINE = {"cpus": 2, "cpu": "?", "memory_gib": 1, "database": "MariaDB", "redis": "7", "python": "3", "django": "5"}


def alone(**changes) -> dict:
    """A run of --slow-receivers-only: no row, the workload's result."""
    return {"systems": {}, "errors": {}, "quick": True, "sizes": {}, "machine": MACHINE,
            "slow_receivers": {**copy.deepcopy(RUN), **changes}}


def test_the_workload_alone_prints_its_section_and_meets_its_targets():
    report = markdown(alone())

    assert report.startswith("Slow receivers: 600 orders due at one instant on 2 consumers")
    assert "| 8.47 s | 6 s | 1.41x | 1, 1 | 47, 46 | 0 | 0 | yes |" in report
    assert verdict(alone()) == []


def test_thrashing_is_a_result_not_a_failure():
    """Batches given up again and again and a drain past twice the receivers' time miss the
    targets in the table; only a wrong close or a crash fails the run."""
    thrashing = alone(drain_s=15.01, latest_s=15.01, ratio=2.5, given_up=[3, 3], least_claim=[None, None])

    assert "| 15.01 s | 6 s | 2.50x | 3, 3 | -, - | 0 | 0 | **no** |" in markdown(thrashing)
    assert verdict(thrashing) == []


def test_an_order_closed_twice_or_never_or_a_consumer_crashing_fails_the_run():
    failed = alone(twice=2, never=5, closed=595, drain_s=None, ratio=None, waited_s=60.0, errors=["Traceback"])

    assert "| 595 of 600 in 60 s | 6 s | - |" in markdown(failed)
    assert verdict(failed) == ["slow receivers: 2 orders closed twice", "slow receivers: 5 of 600 orders never closed",
                               "slow receivers: 1 consumer error(s)"]
