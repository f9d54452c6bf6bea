"""``python -m bench.housekeeping [--rows N] [--rounds R] [--out DIR]``: closes first, a scan beside them.

The consumers run the fleet's housekeeping in a thread of their own (order_timeout/scans/housekeeper.py).
Its promise: a scan going on in the same fleet never holds up a due batch. This measures it: a table of
``--rows`` open orders, every one known to Redis and due within the scan's healing horizon (so the scan
reads them all, chunk by chunk, and checks each against Redis), and a steady row of orders falling due
while two consumers close them: once with ``--no-housekeeping`` (no scan anywhere), once with the
housekeeping on, so that one of the two runs the scan over the whole table as the row falls due. Each
round runs both, in turn first; the lateness of each close is its commit's time minus its deadline
(bench/recorder.py). The verdict compares the p99 with the scan to the p99 without, against the spread
of the runs without it: the benchmark's own noise on this machine.

Run through ``scripts/bench --housekeeping``, which points DATABASE_URL at a database of the
benchmark's own (``order_timeout_bench``) and REDIS_URL at Redis database 10; both are emptied here.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from . import standalone

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")

FULL_ROWS = 1_000_000
# The steady row: orders a second, falling due this long after the orders are written (the
# consumers started, and their housekeeping thread took its turn within its first second).
RATE, LEAD_SECONDS = 500, 1.0
# The row lasts this share of a scan's length (measured once, alone, before the rounds), less the
# seconds the consumers take to start and the row to be written: the scan runs beside all of it.
ROW_SHARE_OF_SCAN, ROW_STARTS_AFTER = 0.6, 6.0
# The consumers' COMPENSATION_INTERVAL in both modes: its healing horizon (twice the interval, plus
# the grace) holds the whole table, whose deadlines start this far ahead and never fall due here.
INTERVAL_SECONDS = 3600
TABLE_DUE_IN = timedelta(minutes=30)
PER_DEADLINE = 3
MODES = ("without", "with")


def systems() -> dict[str, Any]:
    from .systems import Ours

    class WithoutHousekeeping(Ours):
        name, label = "ours_without_housekeeping", "2 consumers, --no-housekeeping"

        def commands(self) -> list[list[str]]:
            return [[*command, "--no-housekeeping"] for command in super().commands()]

    class WithHousekeeping(Ours):
        name, label = "ours_with_housekeeping", "2 consumers, the housekeeping on (one runs the scan)"

    return {"without": WithoutHousekeeping, "with": WithHousekeeping}


def forget_last_runs() -> None:
    """The fleet's record of its last scan and prune (and their locks): the scan is due at once."""
    from order_timeout.queue import TimeoutQueue

    queue = TimeoutQueue.from_settings()
    keys = queue.housekeeping.keys
    queue.client.delete(keys.housekeeping_runs, keys.scan_mark, keys.compensation_lock, keys.prune_lock)


def last_scan() -> dict[str, Any] | None:
    from order_timeout.reporting.housekeeping import last_runs

    run = last_runs()["scan"]
    return None if run is None else run.as_dict()


def overlap(scan: dict[str, Any] | None, start: datetime, seconds: float) -> float:
    """The share of the steady row's deadlines that fell while the scan ran."""
    if scan is None or scan["ended"] is None:
        return 0.0
    began, ended = datetime.fromisoformat(scan["started"]), datetime.fromisoformat(scan["ended"])
    end = start + timedelta(seconds=seconds)
    covered = (min(ended, end) - max(began, start)).total_seconds()
    return max(0.0, covered) / seconds


def one_run(mode: str, sizes: Any, seconds: float) -> dict[str, Any]:
    from . import workloads

    record_dir = Path(tempfile.mkdtemp(prefix=f"bench-housekeeping-{mode}-"))
    system = systems()[mode](record_dir)
    system.phase_env = {"ORDER_TIMEOUT_COMPENSATION_INTERVAL": str(INTERVAL_SECONDS)}
    forget_last_runs()
    system.start()
    try:
        phase = workloads.timed(system, "steady", workloads.steady_offsets(sizes), sizes)
    finally:
        system.stop()
    result = workloads.results(phase, system)
    scan = last_scan()
    if not system.errors:
        shutil.rmtree(record_dir, ignore_errors=True)
    return {"mode": mode, "closed": result["closed"], "orders": result["orders"],
            "closed_twice": result["closed_twice"], "lateness_ms": result["lateness_ms"],
            "closers_exited_badly": system.errors, "scan": scan,
            "scan_overlap": overlap(scan, phase.start, seconds),
            "closers_logs": None if not system.errors else str(record_dir)}


def scan_alone() -> float:
    """Seconds one heal scan over the table takes with nothing else running, at a consumer's pace
    (and the table and its index in memory for the rounds, as bench/scan.py's warm-up does)."""
    from order_timeout.scans.compensation import CompensationScan
    from order_timeout.scans.housekeeper import PACE

    began = time.perf_counter()
    CompensationScan(heal=True, pace=PACE).run()
    return time.perf_counter() - began


def row_seconds(scan_seconds: float) -> float:
    return max(2.0, ROW_SHARE_OF_SCAN * scan_seconds - ROW_STARTS_AFTER)


def table_still_open(first_deadline: datetime) -> int:
    """The table's rows still open (by their deadlines: its ids have gaps, InnoDB hands out an
    INSERT ... SELECT's ids in blocks)."""
    from order_timeout.models import Order

    return Order.objects.filter(Order.unpaid_q(), expires_at__gte=first_deadline).count()


def measure(rows: int, rounds: int, rate: int, seconds: float | None) -> tuple[list[dict[str, Any]], float, float]:
    """The rounds' runs, the scan's length alone and the row's length."""
    from django.utils import timezone

    from order_timeout.models import Order

    from . import scan, workloads

    scan.empty_tables()
    first_deadline = timezone.now() + TABLE_DUE_IN
    scan.insert_orders(rows, first_deadline, PER_DEADLINE)
    scan.schedule_all()
    workloads.keep_statistics(Order)
    alone = scan_alone()
    seconds = seconds or row_seconds(alone)
    print(f"  a scan alone: {alone:.1f} s; the steady row: {rate} orders/s for {seconds:.1f} s", flush=True)
    sizes = replace(workloads.QUICK, steady_rate=rate, steady_seconds=seconds, lead_seconds=LEAD_SECONDS,
                    cap_seconds=60)
    runs = []
    for number in range(rounds):
        # In turn first, so that a drift of the machine through the rounds weighs on both modes.
        for mode in MODES if number % 2 == 0 else MODES[::-1]:
            print(f"  round {number + 1} of {rounds}, {mode} the housekeeping ...", flush=True)
            run = one_run(mode, sizes, seconds)
            run["round"] = number + 1
            runs.append(run)
            print(f"    p99 {run['lateness_ms']['p99']:.1f} ms, {run['closed']:,} of {run['orders']:,} closed, "
                  f"the scan beside {run['scan_overlap']:.0%} of the row", flush=True)
    open_after = table_still_open(first_deadline)
    scan.empty_tables()
    for run in runs:
        run["table_open_after"] = open_after
    return runs, alone, seconds


def verdict(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The p99 with the scan beside the closes against the p99 without, and the noise of the runs
    without it (the highest over the lowest): within the noise when the ratio is no more than it."""
    p99 = {mode: [run["lateness_ms"]["p99"] for run in runs if run["mode"] == mode] for mode in MODES}
    without, with_ = statistics.median(p99["without"]), statistics.median(p99["with"])
    noise = max(p99["without"]) / min(p99["without"])
    ratio = with_ / without
    return {"p99_without_ms": p99["without"], "p99_with_ms": p99["with"], "median_without_ms": without,
            "median_with_ms": with_, "ratio": ratio, "noise": noise, "within_noise": ratio <= noise}


def failures(result: dict[str, Any]) -> list[str]:
    """What breaks the run's premise or a promise: a close missed or doubled, a closer that exited
    badly, a row of the table closed, a scan that did not run beside the row (or ran without it)."""
    found = []
    for run in result["runs"]:
        where = f"{result['database']}, round {run['round']}, {run['mode']} the housekeeping"
        if run["closed"] != run["orders"] or run["closed_twice"]:
            found.append(f"{where}: {run['closed']} of {run['orders']} closed, {run['closed_twice']} twice")
        if run["closers_exited_badly"]:
            found.append(f"{where}: a consumer exited badly: {run['closers_exited_badly'][0][-300:]}")
        if run["mode"] == "without" and run["scan"] is not None:
            found.append(f"{where}: a scan ran with --no-housekeeping")
        if run["mode"] == "with" and round(run["scan_overlap"], 3) < 1:
            found.append(f"{where}: the scan ran beside {run['scan_overlap']:.0%} of the row only")
        if run["table_open_after"] != result["rows"]:
            found.append(f"{where}: {result['rows'] - run['table_open_after']} of the table's rows closed")
    return found


def markdown(results: list[dict[str, Any]]) -> str:
    lines = [
        "| database | open rows scanned | round | housekeeping | closed | p50 (ms) | p99 (ms) | max (ms) "
        "| the scan ran (s) | rows it examined | beside the row |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for result in results:
        for run in result["runs"]:
            scan, lateness = run["scan"], run["lateness_ms"]
            took = "none" if scan is None or scan["elapsed_ms"] is None else f"{scan['elapsed_ms'] / 1000:.1f}"
            examined = "" if scan is None else f"{scan['figures'].get('examined', 0):,}"
            lines.append(
                f"| {result['database']} | {result['rows']:,} | {run['round']} | {run['mode']} "
                f"| {run['closed']:,} of {run['orders']:,} | {lateness['p50']:.1f} | {lateness['p99']:.1f} "
                f"| {lateness['max']:.1f} | {took} | {examined} | {run['scan_overlap']:.0%} |")
    lines += ["", "| database | p99 without (median of rounds) | p99 with | with ÷ without "
                  "| noise: the runs without, highest ÷ lowest | within the noise |", "|---|---|---|---|---|---|"]
    for result in results:
        v = result["verdict"]
        lines.append(f"| {result['database']} | {v['median_without_ms']:.1f} ms | {v['median_with_ms']:.1f} ms "
                     f"| {v['ratio']:.2f}x | {v['noise']:.2f}x | {'yes' if v['within_noise'] else 'NO'} |")
    first = results[0]
    lines += ["", f"Run: {first['commit']}, {first['date']}, {first['rate']} orders/s for {first['seconds']:.1f} s "
                  f"a run, {first['rounds']} rounds, 2 consumers (batch 500), a scan alone "
                  f"{first['scan_alone_s']:.1f} s, COMPENSATION_INTERVAL "
                  f"{INTERVAL_SECONDS} s, {first['cpus']} CPUs ({first['cpu']})"]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.housekeeping", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=FULL_ROWS,
                        help=f"Open orders the scan reads (default {FULL_ROWS:,}; fewer for a quick run).")
    parser.add_argument("--rounds", type=int, default=3, help="Rounds of both runs (default 3).")
    parser.add_argument("--rate", type=int, default=RATE, help=f"The steady row's orders a second ({RATE}).")
    parser.add_argument("--seconds", type=float, default=None,
                        help=f"How long the steady row falls due (default: {ROW_SHARE_OF_SCAN:g} of a scan's "
                             f"length alone, less {ROW_STARTS_AFTER:g} s): shorter than the scan.")
    parser.add_argument("--out", type=Path, default=Path("bench/out/housekeeping"))
    parser.add_argument("--report", action="store_true",
                        help="Only print the results already in --out, every database side by side.")
    args = parser.parse_args(argv)
    if args.report:
        return standalone.report(args.out, markdown, failures)
    if args.rounds < 2:
        parser.error("--rounds must be at least 2: the noise is the spread between rounds")

    # The consumers' interval, for the harness's own scan too (its healing horizon holds the table).
    os.environ["ORDER_TIMEOUT_COMPENSATION_INTERVAL"] = str(INTERVAL_SECONDS)
    import django

    django.setup()
    from django.core.management import call_command
    from django_redis import get_redis_connection

    from . import ownership, scan

    # It empties its tables and its Redis database: never let it near anything else.
    refused = standalone.refusal("--housekeeping")
    if refused:
        print(f"Refusing to run: {refused}", file=sys.stderr)
        return 2
    client = get_redis_connection("order_timeout")
    client.flushdb()
    ownership.keep_mark(client)
    call_command("migrate", verbosity=0)
    database = scan.database_name()
    print(f"{database}: steady closes beside a scan over {args.rows:,} open rows", flush=True)
    runs, alone, seconds = measure(args.rows, args.rounds, args.rate, args.seconds)
    client.flushdb()
    ownership.keep_mark(client)
    result = {"database": database, "commit": scan.commit(), "date": datetime.now(UTC).date().isoformat(),
              "rows": args.rows, "rounds": args.rounds, "rate": args.rate, "seconds": seconds,
              "scan_alone_s": alone,
              "cpus": os.cpu_count(), "cpu": scan.cpu_model(), "runs": runs, "verdict": verdict(runs)}
    return standalone.write(args.out, result, markdown, failures)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
