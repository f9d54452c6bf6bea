"""The benchmark's crash workload (bench/crash.py): its counts, its records that outlive a SIGKILL,
and what of it fails the run (our rows closing an order twice or never; anyone else's loss is a result)."""

from __future__ import annotations

import copy
import os
import signal
import subprocess
import sys
from pathlib import Path

from bench.crash import LATE_MARGIN, tally
from bench.recorder import read_commits
from bench.report import markdown, verdict

from .conftest import wait_for

CRASH = {"orders": 100, "closed": 100, "never": 0, "twice": 0, "late": 0, "late_bound_s": 1.5,
         "latest_s": 0.4, "unrecorded": 0, "killed_after_s": 0.2, "closed_at_kill": 40}


def test_an_order_recorded_twice_counts_twice_and_a_close_past_the_bound_counts_late():
    # 4 orders due at t=100, 2 closed by 0.5 s (pace 4/s: drained by 1 s), the third 3 s late.
    commits = [(1, 100.2), (2, 100.4), (3, 103.0), (3, 103.1)]

    counts = tally(4, 100.0, commits, never=1, killed_at=100.5, closed_at_kill=2)

    assert counts["twice"] == 1
    assert counts["late_bound_s"] == 1 + LATE_MARGIN
    assert counts["late"] == 1
    assert counts["closed"] == 3 and counts["never"] == 1 and counts["unrecorded"] == 0
    assert counts["latest_s"] == 3.0


def test_a_close_with_no_record_is_counted_closed_but_unrecorded():
    counts = tally(3, 100.0, [(1, 100.1), (2, 100.2)], never=0, killed_at=100.2, closed_at_kill=2)

    assert (counts["closed"], counts["unrecorded"]) == (3, 1)


def test_eager_records_of_a_process_killed_with_sigkill_survive_it(tmp_path: Path):
    script = ("import os, signal; from bench import recorder; recorder.append([(7, 1.5)]); "
              "os.kill(os.getpid(), signal.SIGKILL)")
    env = {**os.environ, "BENCH_RECORD_DIR": str(tmp_path), "BENCH_RECORD_EAGER": "1"}
    proc = subprocess.run([sys.executable, "-c", script], env=env, cwd=Path(__file__).parent.parent)

    assert proc.returncode == -signal.SIGKILL
    assert read_commits(tmp_path) == [(7, 1.5)]


def data() -> dict:
    systems = {name: {"label": name, "closers": "", "idle": None, "steady": None, "burst": None,
                      "crash_note": f"{name}'s note", "crash": dict(CRASH)}
               for name in ("ours", "ours_shop", "seed_zset")}
    return {"systems": systems, "errors": {}, "quick": True, "sizes": {
        "steady_rate": 1, "steady_seconds": 1, "burst": 1, "idle": 1, "celery_idle": 1, "crash": 100,
        "crash_cap_seconds": 20, "crash_lease_seconds": 2},
        "machine": {"cpus": 2, "cpu": "?", "memory_gib": 1, "database": "MariaDB", "redis": "7",
                    "python": "3", "django": "5"}}


def test_our_row_closing_an_order_twice_or_never_in_the_crash_fails_the_run():
    run = data()
    run["systems"]["ours"]["crash"].update(never=3, closed=97)
    run["systems"]["ours_shop"]["crash"]["twice"] = 1

    assert verdict(run) == ["ours_shop crash: 1 orders closed twice", "ours crash: 3 of 100 orders never closed"]


def test_another_row_losing_orders_to_the_crash_is_a_result_not_a_failure():
    run = data()
    run["systems"]["seed_zset"]["crash"].update(never=60, closed=40)

    assert verdict(run) == []
    assert "| seed_zset | 40 of 100 | **60** | 0 |" in markdown(copy.deepcopy(run))


def test_the_crash_table_gives_every_row_its_note_even_one_that_did_not_run_it():
    run = data()
    run["systems"]["ours_shop"]["crash"] = None

    table = markdown(run)

    assert "| ours_shop | not run | | | | | | ours_shop's note |" in table
    assert "ours's note" in table


def test_our_frozen_consumers_crash_has_its_row_and_fails_the_run_if_it_lost_an_order():
    run = data()
    run["systems"]["ours"]["crash_frozen"] = {**CRASH, "never": 2, "closed": 98, "frozen": "a consumer"}

    assert verdict(run) == ["ours crash_frozen: 2 of 100 orders never closed"]
    assert "| ours, a consumer frozen (SIGSTOP, not restarted) | 98 of 100 | **2** |" in markdown(copy.deepcopy(run))


def test_a_frozen_closer_stays_stopped_until_the_system_stops_and_thaws_it(tmp_path: Path):
    from bench.systems import System

    class Sleeper(System):
        startup_seconds = 0.0

        def commands(self) -> list[list[str]]:
            return [[sys.executable, "-c", "import time; time.sleep(60)"]]

    system = Sleeper(tmp_path)
    system.start()
    try:
        system.freeze_one(0)
        wait_for(lambda: process_state(system.pids()[0]) == "T")
    finally:
        proc = system.procs[0]
        system.stop()  # SIGTERM reaches a stopped process only once it is continued

    assert proc.returncode == -signal.SIGTERM


def process_state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_a_redis_emptied_crash_has_its_row_and_our_row_losing_an_order_to_it_fails_the_run():
    run = data()
    run["systems"]["ours"]["crash_redis_lost"] = {**CRASH, "never": 1, "closed": 99}
    run["systems"]["seed_zset"]["crash_redis_lost"] = {**CRASH, "never": 60, "closed": 40}

    assert verdict(run) == ["ours crash_redis_lost: 1 of 100 orders never closed"]
    table = markdown(copy.deepcopy(run))
    assert "| ours, its Redis emptied (FLUSHDB), no closer killed | 99 of 100 | **1** |" in table
    assert "| seed_zset, its Redis emptied (FLUSHDB), no closer killed | 40 of 100 | **60** |" in table
