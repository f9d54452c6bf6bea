"""``python -m chaos [--quick] [--scenarios a,b] [--out DIR]``: fault scenarios on private servers.

Run through ``scripts/chaos``. Starts a private MariaDB and Redis on free
loopback ports under a temporary directory, runs each scenario (consumers,
the beat, orders, the fault, the heal), counts the invariants in the
database, writes DIR/results.md (also printed) and DIR/results.json, and
exits 1 if any invariant failed (with --quick, a lateness bound missed is
reported, not failed). Every server and process it started is
gone when it exits, Ctrl-C included.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

from . import provenance

ROOT = Path(__file__).resolve().parent.parent


def parse_args(argv: list[str]) -> argparse.Namespace:
    from .scenarios import SCENARIOS, default_names

    by_name = sorted(set(SCENARIOS) - set(default_names()))
    parser = argparse.ArgumentParser(prog="scripts/chaos", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="A few hundred orders per scenario (CI); the default is 10,000.")
    parser.add_argument("--scenarios", default=",".join(default_names()),
                        help=f"Comma-separated; by default, in this order: {', '.join(default_names())}."
                             + (f" Known failures, by name only: {', '.join(by_name)}." if by_name else ""))
    parser.add_argument("--skip", default="",
                        help="Comma-separated scenarios to leave out of --scenarios.")
    parser.add_argument("--spread", type=float, default=None,
                        help="Seconds over which a scenario's deadlines fall (quick: 3, full: 25); "
                             "10 with 10,000 orders is the benchmark's 1,000 deadlines a second.")
    parser.add_argument("--out", type=Path, default=ROOT / "chaos" / "out")
    parser.add_argument("--model", default="order_timeout.Order",
                        help="The order model (with an integer primary key): order_timeout.Order "
                             "or shop.ShopOrder.")
    parser.add_argument("--redis-cluster", action="store_true",
                        help="The queue on a private Redis Cluster of three primaries (SHARDS 3) "
                             "instead of one server; every Redis fault is done to every node.")
    parser.add_argument("--trace", action="store_true",
                        help="Consumers log every lock they take on the order table (implies --keep-logs).")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="BATCH_SIZE of every consumer (default 50; the app's default is 200).")
    parser.add_argument("--keep-logs", action="store_true",
                        help="Copy every scenario's logs to DIR/logs (failed ones are always copied).")
    args = parser.parse_args(argv)
    skipped = [name for name in args.skip.split(",") if name]
    unknown = [name for name in [*args.scenarios.split(","), *skipped] if name not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario(s) {', '.join(unknown)}; known: {', '.join(SCENARIOS)}")
    args.scenarios = ",".join(name for name in args.scenarios.split(",") if name not in skipped)
    return args


def _option(argv: list[str], name: str, default: str) -> str:
    """An option the settings need, read before Django starts (argparse validates it later)."""
    for index, arg in enumerate(argv):
        if arg == name and index + 1 < len(argv):
            return argv[index + 1]
        if arg.startswith(f"{name}="):
            return arg.split("=", 1)[1]
    return default


def _interrupted(signum: int, frame: FrameType | None) -> None:
    """The first Ctrl-C or SIGTERM unwinds the run (its cleanup stops everything); later ones wait."""
    for later in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(later, signal.SIG_IGN)
    raise KeyboardInterrupt(f"signal {signum}")


def run_scenario(scenario: Any, lab: Any, *, quick: bool) -> dict[str, Any]:
    from . import invariants
    from .story import Check, Story

    began = time.monotonic()
    lab.reset(aof=scenario.aof)
    try:
        story = scenario.run(lab)
        failure = None
    except Exception:
        failure = traceback.format_exc()
        story = Story([])
    verdict = invariants.judge(story, lab.scan_seconds, lab.checks())
    if failure:
        verdict.checks.insert(0, Check("the scenario ran to its end", False, failure.splitlines()[-1]))
    return {
        "name": scenario.name, "title": scenario.title, "elapsed_s": round(time.monotonic() - began, 1),
        # Other work on the machine shows here: the 1-minute load average as the scenario ended.
        "load": round(os.getloadavg()[0], 1),
        "passed": verdict.invariants_hold if quick else verdict.passed,
        "figures": [asdict(row) for row in verdict.figures],
        "checks": [asdict(check) for check in verdict.checks],
        "facts": {**lab.consumer_facts(), **story.facts}, "error": failure,
    }


def main(argv: list[str]) -> int:
    if any(arg == "--soak" or arg.startswith("--soak=") for arg in argv):
        # Not a fault run: a steady stream for a given time, on MariaDB or PostgreSQL (chaos.soak).
        from .soak.run import main as soak

        return soak(argv)

    import django

    from .servers import PrivateMariaDB, PrivateRedis, PrivateRedisCluster, Servers, child_environment
    from .tuning import CLUSTER_SHARDS, FULL, QUICK, Tuning

    model = _option(argv, "--model", "order_timeout.Order")
    batch_size = int(_option(argv, "--batch-size", str(Tuning.batch_size)))
    cluster = "--redis-cluster" in argv
    workdir = Path(tempfile.mkdtemp(prefix="chaos-"))
    # The ports are chosen now, so the settings can name the servers before they start.
    if cluster:
        servers = Servers(PrivateMariaDB(workdir / "mariadb"), PrivateRedisCluster(workdir / "redis-cluster"),
                          cache=PrivateRedis(workdir / "redis"))
    else:
        servers = Servers(PrivateMariaDB(workdir / "mariadb"), PrivateRedis(workdir / "redis"))
    tuning = Tuning(order_model=model, batch_size=batch_size, shards=CLUSTER_SHARDS if cluster else 1)
    env = child_environment(servers, tuning)
    os.environ.clear()
    os.environ.update(env)
    django.setup()
    try:
        args = parse_args(argv)
    except SystemExit:
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    from .lab import Lab
    from .processes import kill_all
    from .scenarios import SCENARIOS

    sizes = QUICK if args.quick else FULL
    if args.spread:
        sizes = dataclasses.replace(sizes, spread=args.spread)
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _interrupted)
    keep = False
    began = time.monotonic()
    try:
        redis = (f"a Redis Cluster on 127.0.0.1:{','.join(str(node.port) for node in servers.redis.nodes)}"
                 f" (the cache's Redis on {servers.cache.port})"
                 if isinstance(servers.redis, PrivateRedisCluster) and servers.cache is not None
                 else f"Redis on 127.0.0.1:{servers.redis.port}")
        print(f"private MariaDB on 127.0.0.1:{servers.mariadb.port}, {redis}, under {workdir}", flush=True)
        servers.mariadb.install()
        servers.mariadb.start()
        servers.mariadb.create_database()
        for server in (servers.cache, servers.redis):
            if server is not None:
                server.directory.mkdir(parents=True, exist_ok=True)
                server.start(fresh=True)

        from django.core.management import call_command

        # The app's warnings about the faults we cause belong to the consumers' logs, not here.
        logging.getLogger("order_timeout").setLevel(logging.ERROR)
        call_command("migrate", verbosity=0)
        run: dict[str, Any] = {
            "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), "commit": provenance.commit(),
            "quick": args.quick, "redis_cluster": servers.cluster, "machine": provenance.machine(),
            "tuning": tuning.as_dict(),
            "sizes": asdict(sizes), "scenarios": [],
        }
        for name in args.scenarios.split(","):
            scenario = SCENARIOS[name]
            print(f"{name}: {scenario.title} ...", flush=True)
            logs = workdir / "logs" / name
            lab = Lab(name, servers, tuning, sizes, logs,
                      {**env, "CHAOS_TRACE_DIR": str(logs)} if args.trace else env)
            result = run_scenario(scenario, lab, quick=args.quick)
            run["scenarios"].append(result)
            failed = [check["name"] for check in result["checks"] if not check["ok"]]
            verdict = ("ok" + (f" (late, reported only in --quick: {'; '.join(failed)})" if failed else "")
                       if result["passed"] else "FAILED: " + "; ".join(failed))
            print(f"  {verdict} ({result['elapsed_s']:.0f} s)", flush=True)
            if not result["passed"] or args.keep_logs or args.trace:
                keep = True
                _copy_logs(lab.logs, args.out / "logs" / name, servers)
        run["elapsed_s"] = round(time.monotonic() - began, 1)
        from . import report

        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(run, indent=2, default=str))
        table = report.markdown(run)
        (args.out / "results.md").write_text(table)
        print()
        print(table)
        print(f"Wrote {args.out / 'results.md'} and results.json"
              f"{' (and the logs of failed scenarios)' if keep else ''} in {run['elapsed_s']:.0f} s.")
        return 0 if all(scenario["passed"] for scenario in run["scenarios"]) else 1
    except KeyboardInterrupt:
        print("\ninterrupted: stopping every process and server this run started", file=sys.stderr)
        return 130
    finally:
        kill_all()
        servers.kill_all()
        shutil.rmtree(workdir, ignore_errors=True)


def _copy_logs(source: Path, target: Path, servers: Any) -> None:
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(source, target, dirs_exist_ok=True)
    for server_log in (servers.mariadb.directory / "error.log", *servers.redis.logs()):
        if server_log.exists():
            # A cluster's nodes each have a redis.out: named after their directories.
            name = server_log.name if server_log.parent.name in ("mariadb", "redis") else \
                f"{server_log.parent.name}-{server_log.name}"
            shutil.copy(server_log, target / name)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
