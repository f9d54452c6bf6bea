"""``python -m bench [--quick] [--out DIR] [--systems a,b]``: every system, every workload, one run.

Run through ``scripts/bench``, which starts MariaDB and Redis and points
DATABASE_URL, REDIS_URL and CELERY_BROKER_URL at databases of the benchmark's
own (they are emptied here).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
os.environ["SHOP_RECORD_EXPIRIES"] = "0"
# The order close alone, as the ref it is compared with ran it: no timer of the test shop's own.
os.environ["SHOP_TIMERS"] = "0"
# Nor a notice of its own (an e-mail per close): the notices rows' closers turn them on (bench/systems.py).
os.environ["SHOP_NOTICES"] = "0"


def parse_args(argv: list[str]) -> argparse.Namespace:
    from .systems import SYSTEMS

    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true",
                        help="Shrink every workload (CI runs this; numbers are not comparable).")
    parser.add_argument("--out", type=Path, default=Path("bench/out"))
    parser.add_argument("--systems", help="Comma-separated rows (default: every row; with --quick, all "
                                           f"but the peers: {', '.join(n for n, c in SYSTEMS.items() if c.full_only)})")
    parser.add_argument("--no-scale", action="store_true",
                        help="Skip the bulk schedule() and the Redis Cluster bursts.")
    parser.add_argument("--compare", metavar="REF",
                        help="Also run this project's row on the code of git ref REF (a worktree), "
                             "right after it, and report new/old ratios.")
    parser.add_argument("--no-parts", action="store_true",
                        help="Skip the per-part cost of a close (bench/parts.py).")
    parser.add_argument("--parts-rounds", type=int, default=3, metavar="N",
                        help="Rounds of the parts, the rows alternated in each (after one thrown away): "
                             "each part is its median over them.")
    parser.add_argument("--no-trips", action="store_true",
                        help="Skip the round trips per batch of each row's shape (bench/trips.py).")
    parser.add_argument("--burst", type=int, metavar="N",
                        help="Orders in the burst (default 100,000; 1,000 with --quick): a small burst's "
                             "figures differ from a large one's (fixed costs per burst weigh more).")
    parser.add_argument("--rounds", type=int, default=1,
                        help="Run the chosen rows this many times, alternating (ours, then REF's, ...): "
                             "each figure is the round of median burst closes/s, each ratio the median of "
                             "the rounds' ratios (one VM's row-to-row spread is +-15 %%).")
    parser.add_argument("--slow-receivers-only", action="store_true",
                        help="Run the slow receivers workload alone (bench/slow_receivers.py: 600 orders on two "
                             "consumers whose receivers take 20 ms an order), none of the rows, the scale or "
                             "the parts. Every run that has our row runs it too.")
    args = parser.parse_args(argv)
    if args.slow_receivers_only:
        if args.compare:
            parser.error("--slow-receivers-only runs no row: --compare would have nothing to compare")
        args.systems = args.systems or "ours"
        if "ours" not in args.systems.split(","):
            parser.error("--slow-receivers-only runs on our consumers: --systems must name ours")
        args.no_scale = args.no_parts = args.no_trips = True
    if args.systems is None:
        args.systems = ",".join(name for name, cls in SYSTEMS.items() if not (args.quick and cls.full_only))
    unknown = set(args.systems.split(",")) - set(SYSTEMS)
    if unknown:
        parser.error(f"unknown system(s) {', '.join(sorted(unknown))}; known: {', '.join(SYSTEMS)}")
    return args


def machine() -> dict[str, Any]:
    from django.db import connection
    from django_redis import get_redis_connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT VERSION()")
        version = str(cursor.fetchone()[0])
    database = (f"PostgreSQL {version.split()[1]}" if connection.vendor == "postgresql"
                else f"MariaDB {version}")
    memory = next((line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                   if line.startswith("MemTotal")), "?")
    return {
        "python": platform.python_version(), "cpus": os.cpu_count(),
        "memory_gib": round(int(memory) / 2**20, 1) if memory != "?" else None,
        "cpu": next((line.split(":", 1)[1].strip() for line in
                     Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")), "?"),
        "database": database, "redis": get_redis_connection("order_timeout").info()["redis_version"],
        "django": __import__("django").get_version(),
    }


def _commit() -> str:
    """The commit the run measured (a '+' when the checkout had changes): docs name their run."""
    import subprocess

    from .systems import ROOT

    sha = subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], cwd=ROOT, capture_output=True,
                         text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                           capture_output=True, text=True).stdout.strip()
    return sha + ("+" if dirty else "")


def main(argv: list[str]) -> int:
    import django

    django.setup()
    from django.conf import settings
    args = parse_args(argv)
    from django.core.management import call_command
    from django_redis import get_redis_connection

    from . import broker, crash, report, workloads
    from .systems import SYSTEMS, Ours

    sizes = workloads.QUICK if args.quick else workloads.FULL
    if args.burst:
        from dataclasses import replace

        sizes = replace(sizes, burst=args.burst)
    from django.db import connection

    # The harness empties its database and Redis: never let it near anything else.
    if not connection.settings_dict["NAME"].endswith("_bench") or os.environ.get("BENCH_OK") != "1":
        print("Refusing to run: use scripts/bench, which points the harness at databases of its "
              "own (a database name ending in _bench) and sets BENCH_OK=1.", file=sys.stderr)
        return 2
    from . import ownership

    try:
        ownership.claim(get_redis_connection("order_timeout"), f"Redis at {os.environ.get('REDIS_URL')}")
        ownership.claim(broker.broker_client(), f"Celery's broker at {os.environ.get('CELERY_BROKER_URL')}")
        if "cluster" in settings.CACHES and not args.no_scale:
            ownership.claim(get_redis_connection("cluster"), "the Redis Cluster")
    except ownership.NotOurs as exc:
        print(f"Refusing to run: {exc}", file=sys.stderr)
        return 2
    call_command("migrate", verbosity=0)
    args.out.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    from order_timeout.conf import settings as order_settings

    data: dict[str, Any] = {"quick": args.quick, "machine": machine(), "sizes": sizes.__dict__,
                            "systems": {}, "errors": {}, "batch_window_ms": 1000 * order_settings.BATCH_WINDOW,
                            "commit": _commit()}
    # --slow-receivers-only: no row, only the workload below that runs on ours.
    chosen = [] if args.slow_receivers_only else [SYSTEMS[name] for name in args.systems.split(",")]
    for cls in [cls for cls in chosen if connection.vendor not in cls.vendors]:
        print(f"{cls.label}: not on {connection.vendor} (it runs on {', '.join(cls.vendors)} only)", flush=True)
        chosen.remove(cls)
    if args.compare:
        from . import compare

        tree, sha = compare.checkout(args.compare)
        data["compare"] = {"ref": args.compare, "sha": sha}
        # Alternating: the ref's row right after ours (and its reminders row after ours), so both
        # meet the same machine.
        for name in compare.COMPARED:
            if SYSTEMS[name] in chosen:
                chosen.insert(chosen.index(SYSTEMS[name]) + 1, compare.at_ref(SYSTEMS[name], tree, args.compare, sha))
        if SYSTEMS["ours"] not in chosen:
            chosen.append(compare.at_ref(SYSTEMS["ours"], tree, args.compare, sha))

    workloads.reset()
    if chosen:
        print("measuring the create transaction ...", flush=True)
        data["create"] = workloads.create_overhead(
            [system for system in (cls(Path()) for cls in chosen) if system.measures_create],
            sizes.create_samples)
    if SYSTEMS["ours"] in chosen:
        print("measuring claim latency as the pending set grows ...", flush=True)
        data["claim_latency"] = workloads.claim_latency(sizes)

    rounds: dict[str, list[dict[str, Any]]] = {}
    for round_number, cls in [(number, cls) for number in range(args.rounds) for cls in chosen]:
        if args.rounds > 1:
            print(f"round {round_number + 1} of {args.rounds}", flush=True)
        record_dir = Path(tempfile.mkdtemp(prefix=f"bench-{cls.name}-"))
        system = cls(record_dir)
        workloads.reset()
        print(f"{system.label}: starting {system.closers}", flush=True)
        system.start()
        idle = None
        timed: dict[str, Any] = {"steady": None, "burst": None}
        row_sizes = system.sized(sizes)
        offsets = {"steady": workloads.steady_offsets(row_sizes), "burst": workloads.burst_offsets(row_sizes)}
        try:
            if "idle" in system.workloads:
                print("  idle ...", flush=True)
                idle = workloads.idle(system, row_sizes)
                system.forget_far_future()
            for kind in ("steady", "burst"):
                if kind in system.workloads:
                    print(f"  {kind} ...", flush=True)
                    timed[kind] = workloads.timed(system, kind, offsets[kind], row_sizes)
        finally:
            system.stop()
        measured = {kind: phase and workloads.results(phase, system) for kind, phase in timed.items()}
        if "crash" in system.workloads and (system.crash_in_quick or not args.quick):
            for result, victim, what in system.crash_victims:
                print(f"  crash ({what} killed) ..." if len(system.crash_victims) > 1 else "  crash ...", flush=True)
                workloads.reset()  # an undrained burst's leftovers would be claimed first
                # A fresh instance: closers of its own, in a folder of their own.
                crashing = cls(record_dir / result)
                measured[result] = {**crash.crash(crashing, row_sizes, victim), "killed": what}
                system.errors += crashing.errors
            for result, victim, what in system.crash_freezes:
                print(f"  crash ({what} frozen) ...", flush=True)
                workloads.reset()
                crashing = cls(record_dir / result)
                measured[result] = {**crash.crash(crashing, row_sizes, victim, freeze=True), "frozen": what}
                system.errors += crashing.errors
            if system.loses_redis:
                print("  crash (Redis emptied) ...", flush=True)
                workloads.reset()
                crashing = cls(record_dir / "crash_redis_lost")
                measured["crash_redis_lost"] = crash.crash(crashing, row_sizes, lose_redis=True)
                system.errors += crashing.errors
        if system.errors:
            data["errors"][system.name] = system.errors
        rounds.setdefault(system.name, []).append({
            "label": system.label, "closers": system.closers, "memory": system.memory, "idle": idle,
            "delivers_notices": system.delivers_notices,
            "crash_note": system.crash_note, "sizes": row_sizes.__dict__ if system.limits else None, **measured,
        })
        if os.environ.get("BENCH_KEEP_LOGS") == "1":
            print(f"  closers' logs kept in {record_dir}", flush=True)
        else:
            shutil.rmtree(record_dir, ignore_errors=True)

    data["systems"] = {name: report.median_round(runs) for name, runs in rounds.items()}
    if args.rounds > 1:
        data["rounds"] = {name: [((run.get("burst") or {}).get("closes_per_s"),
                                  (run.get("burst") or {}).get("cpu_ms_per_close")) for run in runs]
                          for name, runs in rounds.items()}
    if "ours" in args.systems.split(","):
        from . import slow_receivers

        print(f"slow receivers: {slow_receivers.ORDERS} orders due at once, receivers of "
              f"{1000 * slow_receivers.DELAY:g} ms an order, BATCH_TIME_LIMIT {slow_receivers.TIME_LIMIT:g} s ...",
              flush=True)
        workloads.reset()
        record_dir = Path(tempfile.mkdtemp(prefix="bench-slow-receivers-"))
        ours = SYSTEMS["ours"](record_dir)
        assert isinstance(ours, Ours)
        data["slow_receivers"] = slow_receivers.slow_receivers(ours)
        if ours.errors:
            data["errors"]["slow_receivers"] = ours.errors
        if os.environ.get("BENCH_KEEP_LOGS") == "1":
            print(f"  consumers' logs kept in {record_dir}", flush=True)
        else:
            shutil.rmtree(record_dir, ignore_errors=True)
    if not args.no_scale:
        from . import scale

        print("scale: one bulk schedule() ...", flush=True)
        data["bulk_schedule"] = scale.bulk_schedule(sizes.bulk_schedule)
        if "cluster" in settings.CACHES:
            data["cluster"] = []
            for shards in (1, 16):
                print(f"scale: a burst on the Redis Cluster, SHARDS={shards} ...", flush=True)
                record_dir = Path(tempfile.mkdtemp(prefix=f"bench-cluster-{shards}-"))
                data["cluster"].append(scale.cluster_burst(shards, sizes.burst, record_dir,
                                                           sizes.cap_seconds))
                shutil.rmtree(record_dir, ignore_errors=True)

    if not args.no_parts and "ours" in args.systems.split(","):
        from . import parts

        print("parts: where a close's time goes, one consumer in this process ...", flush=True)
        data["parts_orders"] = sizes.parts
        data["parts"] = parts.measure(sizes.parts, args.systems.split(","), args.parts_rounds)

    if not args.no_trips and "ours" in args.systems.split(","):
        from . import trips

        print("round trips: each row's batch, one consumer in this process, counted on the wire ...", flush=True)
        data["trips"] = trips.measure(args.systems.split(","))

    workloads.reset()
    data["elapsed_s"] = round(time.monotonic() - began, 1)
    (args.out / "results.json").write_text(json.dumps(data, indent=2, default=str))
    markdown = report.markdown(data)
    (args.out / "results.md").write_text(markdown)
    if data["systems"]:
        report.plot(data, args.out / "results.png")
    print()
    print(markdown)
    print(f"Wrote {args.out / 'results.json'}, results.md{' and results.png' if data['systems'] else ''} "
          f"in {data['elapsed_s']:.0f} s.")
    for name, errors in data["errors"].items():
        print(f"{name}: a closer exited badly; the end of its stderr:\n{errors[-1]}", file=sys.stderr)
    failures = report.verdict(data)
    for failure in failures:
        print(f"FAILED: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
