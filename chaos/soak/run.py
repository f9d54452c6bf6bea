"""``scripts/chaos --soak SECONDS [--database mariadb|postgresql] ...``: the soak, from start to report.

It sets up as the fault runs do (private servers on free loopback ports under a temporary
directory, the harness's settings in every process), with the webhook's target started first so
its address is in every process's environment, the harness's own included (staff's "close now"
runs the close here). Then the stream, the consumers, the beat and staff; a sample every
``--sample-every`` seconds and the kills on their schedule; the settling; the checks; the report
(DIR/results.md, also printed, and DIR/results.json with every sample). Exits 1 when an invariant
failed, 0 otherwise, whatever grew. Every process and server it started is gone when it exits.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
import uuid
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

from .. import provenance
from .plan import WEBHOOK, Plan

ROOT = Path(__file__).resolve().parents[2]
# Seconds of scheduling noise on top of the scan's own bound (grace, two beats and the longest tick):
# an order open this long past it is one the scan missed, not one a busy machine delayed.
SLACK = 30.0


def parse_args(argv: list[str]) -> argparse.Namespace:
    default = Plan(seconds=0)
    parser = argparse.ArgumentParser(prog="scripts/chaos --soak", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--soak", type=float, required=True, metavar="SECONDS",
                        help="How long orders come (the docs' figure: 1800; CI: 120).")
    parser.add_argument("--database", choices=("mariadb", "postgresql"), default="mariadb")
    parser.add_argument("--rate", type=float, default=default.rate, help="Orders a second.")
    parser.add_argument("--consumers", type=int, default=default.consumers)
    parser.add_argument("--sample-every", type=float, default=default.sample_every)
    parser.add_argument("--retention", type=float, default=default.retention,
                        help="NOTICE_RETENTION, REMINDER_RETENTION and DEAD_LETTER_RETENTION, in seconds.")
    parser.add_argument("--prune-interval", type=float, default=default.prune_interval)
    parser.add_argument("--compensation-interval", type=float, default=default.compensation_interval,
                        help="Seconds between two beat ticks (the scan; the prune when PRUNE_INTERVAL passed).")
    parser.add_argument("--full-interval", type=float, default=default.full_interval,
                        help="COMPENSATION_FULL_INTERVAL, in seconds.")
    parser.add_argument("--sigkill-every", type=float, default=default.sigkill_every,
                        help="Seconds between two SIGKILLs of a consumer (never consumer 0).")
    parser.add_argument("--sigterm-every", type=float, default=default.sigterm_every,
                        help="Seconds between two SIGTERMs of a consumer (never consumer 0).")
    parser.add_argument("--staff-every", type=float, default=default.staff_every,
                        help="Seconds between two rounds of staff at the dead letters.")
    parser.add_argument("--out", type=Path, default=None, help="Default: chaos/out/soak-DATABASE.")
    parser.add_argument("--keep-logs", action="store_true",
                        help="Copy the processes' logs to DIR/logs (always done when an invariant failed).")
    parser.add_argument("--break", dest="broken", choices=("closed-twice",), default=None,
                        help="For the harness's own test: write a second delivery of one closed order before "
                             "the checks, which must then fail.")
    args = parser.parse_args(argv)
    for name in ("soak", "rate", "sample_every", "retention", "prune_interval", "compensation_interval",
                 "full_interval", "sigkill_every", "sigterm_every", "staff_every"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} takes a positive number")
    if args.consumers < 1:
        parser.error("--consumers takes a positive number")
    args.out = args.out or ROOT / "chaos" / "out" / f"soak-{args.database}"
    return args


def _interrupted(signum: int, frame: FrameType | None) -> None:
    """The first Ctrl-C or SIGTERM unwinds the run (its cleanup stops everything); later ones wait."""
    for later in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(later, signal.SIG_IGN)
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str]) -> int:
    import django

    from ..processes import kill_all
    from ..servers import PrivateMariaDB, PrivatePostgreSQL, PrivateRedis, Servers, child_environment
    from .target import CountingSink

    args = parse_args(argv)
    plan = Plan(seconds=args.soak, database=args.database, rate=args.rate, consumers=args.consumers,
                sample_every=args.sample_every, retention=args.retention, prune_interval=args.prune_interval,
                compensation_interval=args.compensation_interval, full_interval=args.full_interval,
                sigkill_every=args.sigkill_every, sigterm_every=args.sigterm_every, staff_every=args.staff_every)
    tuning = plan.tuning()
    workdir = Path(tempfile.mkdtemp(prefix="chaos-soak-"))
    database = (PrivatePostgreSQL(workdir / "postgresql") if plan.database == "postgresql"
                else PrivateMariaDB(workdir / "mariadb"))
    servers = Servers(database, PrivateRedis(workdir / "redis"))
    secret = uuid.uuid4().hex
    # Before Django starts: the test shop declares its webhook handler at start-up, from the environment.
    sink = CountingSink(secret=secret, key_prefix=f"{WEBHOOK}:{tuning.order_model.lower()}:").start()
    env = {**child_environment(servers, tuning), **plan.environment(sink.url, secret)}
    os.environ.clear()
    os.environ.update(env)
    django.setup()
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _interrupted)
    logs = workdir / "logs"
    began = time.monotonic()
    try:
        print(f"soak: private {plan.database} on 127.0.0.1:{database.port}, Redis on {servers.redis.port}, "
              f"under {workdir}", flush=True)
        database.install()
        database.start()
        database.create_database()
        servers.redis.directory.mkdir(parents=True, exist_ok=True)
        servers.redis.start(fresh=True)
        logs.mkdir(parents=True)

        from django.core.management import call_command

        logging.getLogger("order_timeout").setLevel(logging.ERROR)
        call_command("migrate", verbosity=0)
        run = soak(plan, tuning, env, logs, sink, broken=args.broken)
        run.update({"command": "scripts/chaos " + " ".join(argv), "elapsed_s": round(time.monotonic() - began, 1)})
        return _write(run, args, logs, database)
    except KeyboardInterrupt:
        print("\ninterrupted: stopping every process and server this run started", file=sys.stderr)
        return 130
    finally:
        kill_all()
        servers.kill_all()
        sink.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def _write(run: dict[str, Any], args: argparse.Namespace, logs: Path, database: Any) -> int:
    from .report import markdown

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(run, indent=2, default=str))
    table = markdown(run)
    (out / "results.md").write_text(table)
    passed = all(check["ok"] for check in run["checks"])
    if not passed or args.keep_logs:
        shutil.rmtree(out / "logs", ignore_errors=True)
        shutil.copytree(logs, out / "logs")
        for server_log in database.directory.glob("*.out"):
            shutil.copy(server_log, out / "logs" / server_log.name)
        if (database.directory / "error.log").exists():
            shutil.copy(database.directory / "error.log", out / "logs" / "error.log")
    print()
    print(table)
    print(f"Wrote {out / 'results.md'} and results.json{' (and the logs)' if not passed or args.keep_logs else ''}"
          f" in {run['elapsed_s']:.0f} s.")
    return 0 if passed else 1


def soak(plan: Plan, tuning: Any, env: dict[str, str], logs: Path, sink: Any, *, broken: str | None) -> dict[str, Any]:
    """Run the plan; return everything the report needs (plain data)."""
    from django.utils import timezone

    from order_timeout import get_order_model

    from ..consumers import ConsumerPool
    from . import checks, growth, sampling
    from .fit import FLOORS
    from .schedule import TaskBeat, run_schedule, settle, wait_until_started
    from .staff import StaffDesk
    from .stream import Errors, OrderStream, PaymentDesk
    from .tables import orders_table

    errors = Errors()
    payments = PaymentDesk(errors)
    stream = OrderStream(plan, payments, errors)
    staff = StaffDesk(plan.staff_every, plan.staff_after, errors)
    pool = ConsumerPool(plan.consumers, env, logs)
    beat = TaskBeat(plan.compensation_interval, env, logs, rebuild=False)
    bound = tuning.compensation_grace + 2 * tuning.compensation_interval + SLACK
    pool.start()
    try:
        wait_until_started(pool, logs)
        beat.start()
        payments.start()
        stream.start()
        staff.start()
        try:
            samples, kills = run_schedule(plan, pool, stream, beat, bound)
        finally:
            stream.stop()
            staff.stop()
            payments.stop()
        settled = settle(sink, stream.last_deadline, bound + beat.longest_tick)
        samples.append(sampling.take(time.monotonic() - stream.began, stream.created, "settle", pool.pids(),
                                     bound + beat.longest_tick).as_dict())
    finally:
        beat.stop()
        pool.stop()
    stopped_at = timezone.now()
    if broken == "closed-twice":
        _break_closed_twice()
    run = checks.Run(
        sigkills=(kills["SIGKILL"], sum(1 for _, name, _ in plan.kills() if name == "SIGKILL")),
        sigterms=(kills["SIGTERM"], sum(1 for _, name, _ in plan.kills() if name == "SIGTERM")),
        unexpected_exits=[f"consumer {e.slot} (pid {e.pid}) exited {e.status}" for e in pool.unexpected_exits],
        failed_ticks=[f"pid {scan.pid} exited {scan.status}" for scan in beat.scans if scan.status != 0],
        ticks=len(beat.scans), harness_errors=errors.first, harness_error_count=errors.count,
        open_past_bound=[sample["open_past_bound"] for sample in samples],
        late_reminders=[sample["late_reminders"] for sample in samples], bound=bound + beat.longest_tick,
        settled=settled, stopped_at=stopped_at)
    verdicts, facts = checks.judge(run, sink)
    facts |= {"payments (paid, refused: refund, settled already)": ", ".join(
        str(payments.outcomes.get(outcome, 0)) for outcome in ("paid", "refund", "settled")),
        "longest beat tick (s)": round(beat.longest_tick, 1), **beat.pruned()}
    series = growth.all_series(samples, plan, orders_table())
    window = growth.fitted(samples, plan)
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), "commit": provenance.commit(),
        "database_name": provenance.database_name(), "machine": provenance.machine(), "plan": {**plan.as_dict(),
                                                                         "rss_reference": plan.rss_reference},
        "tuning": tuning.as_dict(), "orders": stream.created, "cohorts": dict(stream.by_cohort),
        "ticks": len(beat.scans),
        "staff": f"{staff.visits} visits: " + (", ".join(f"{k} {v}" for k, v in sorted(staff.counts.items()) if v)
                                               or "nothing to resolve"),
        "kills": dict(kills), "checks": [asdict(check) for check in verdicts], "facts": facts,
        "window": {"from_s": plan.fit_from, "samples": len(window),
                   "orders_from": window[0]["orders"] if window else 0,
                   "orders_to": window[-1]["orders"] if window else 0},
        "floors": FLOORS, "bytes_are": _bytes_are(), "series": [one.as_dict() for one in series],
        "targets": [target.as_dict() for target in growth.targets(series, samples, plan)],
        "samples": samples, "model": get_order_model()._meta.label,
    }


def _break_closed_twice() -> None:
    """What ``--break closed-twice`` does: one closed order gets a second delivery, as a close
    committed twice would leave it."""
    from ..models import Delivery

    first = Delivery.objects.order_by("pk").first()
    if first is not None:
        Delivery.objects.create(order_id=first.order_id, delivered_at=first.delivered_at, pid=0)


def _bytes_are() -> str:
    from django.db import connection

    if connection.vendor == "postgresql":
        return "`pg_total_relation_size` (the table's files: heap, indexes, TOAST; dead rows not yet vacuumed count)."
    return ("`data_length + index_length` of `information_schema.TABLES` after `ANALYZE TABLE` (the pages the "
            "table's B-trees hold, free space within them included).")


