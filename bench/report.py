"""The benchmark's table (markdown), the targets of issue 4, and the picture."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _num(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and value != value:  # NaN
        return "-"
    if isinstance(value, (int, float)) and abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _lateness(result: dict[str, Any]) -> str:
    late = result["lateness_ms"]
    text = f"{_num(late['p50'])} / {_num(late['p99'])} / {_num(late['max'])}"
    if not result["drained"]:
        text += f" (only {result['closed']:,} of {result['orders']:,} closed)"
    return text


def _burst(result: dict[str, Any]) -> str:
    text = (f"{_num(result['drain_s'], 2)} s" if result["drained"]
            else f"{result['closed']:,} of {result['orders']:,} in {result['watched_s']:.0f} s")
    if result.get("production_overran_s"):
        text += f" (publishing ran {result['production_overran_s']:.0f} s past the deadline)"
    return text


def markdown(data: dict[str, Any]) -> str:
    sizes = data["sizes"]
    lines = [
        f"Steady: {sizes['steady_rate']:,} deadlines/s for {sizes['steady_seconds']:g} s. "
        f"Burst: {sizes['burst']:,} orders due at one instant. "
        f"Idle: {sizes['idle']:,} pending ({sizes['celery_idle']:,} for Celery), nothing due."
        + (" **Quick mode: shrunk workloads, not comparable with a full run.**" if data["quick"] else ""),
        "",
        "| system | closers | steady lateness p50 / p99 / max (ms) | burst lateness p50 / p99 / max (ms) "
        "| burst closes/s | burst drained in | DB queries / close: steady, burst "
        "| Redis commands / close: steady, burst | idle DB queries/s "
        "| idle Redis round trips/s (commands run) | memory / pending order | create tx added p50 / p99 (ms) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, system in data["systems"].items():
        idle = system["idle"] or {}
        memory = "as above" if not idle else {
            "worker": f"{idle['worker_bytes_per_pending']:,.0f} B worker RSS "
                      f"+ {idle['redis_bytes_per_pending']:,.0f} B broker",
            "redis": f"{idle['redis_bytes_per_pending']:,.0f} B (Redis)",
        }.get(system.get("memory", "redis"), "0 extra (the row itself)")
        create = data.get("create", {}).get(name, {})
        steady, burst = system["steady"], system["burst"]
        lines.append(
            f"| {system['label']} | {system['closers']} | {_lateness(steady)} | {_lateness(burst)} "
            f"| {_num(burst['closes_per_s'], 0)} | {_burst(burst)} "
            f"| {_num(steady['db_queries_per_close'], 2)}, {_num(burst['db_queries_per_close'], 3)} "
            f"| {_num(steady['redis_commands_per_close'], 2)}, {_num(burst['redis_commands_per_close'], 3)} "
            f"| {_num(idle.get('db_queries_per_s'), 1)} | {_num(idle.get('redis_round_trips_per_s'), 1)} "
            f"({_num(idle.get('redis_commands_run_per_s'), 1)}) "
            f"| {memory} | {_num(create.get('added_p50_ms'), 3)} / {_num(create.get('added_p99_ms'), 3)} |"
        )
    if "claim_latency" in data:
        lines += ["", "Claim of 200 due members (this project's `claim.lua`), as the pending set grows:", "",
                  "| pending | round trip p50 (ms) | p99 (ms) | inside Redis (µs per call) |", "|---|---|---|---|"]
        for size, row in data["claim_latency"].items():
            lines.append(f"| {int(size):,} | {_num(row['round_trip_ms']['p50'], 3)} "
                         f"| {_num(row['round_trip_ms']['p99'], 3)} | {_num(row['server_us_per_call'], 1)} |")
    if "ours" in data["systems"]:
        lines += ["", "Targets (issue 4), this project's row:", "", "| target | measured | met |", "|---|---|---|"]
        lines += [f"| {target} | {measured} | {'yes' if met else '**no**'} |"
                  for target, measured, met in targets(data)]
    lines += _scale_lines(data)
    lines += ["", _machine_line(data)]
    return "\n".join(lines) + "\n"


def _scale_lines(data: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    bulk = data.get("bulk_schedule")
    if bulk:
        lines += ["", f"One `schedule()` of {bulk['members']:,} members: {bulk['seconds']:g} s in "
                      f"{bulk['script_calls']:,} script calls (counted in SLOWLOG at 0 us) of at most "
                      f"{bulk.get('slice', 500):,} members; Redis time per call: slowest "
                      f"{_num(bulk['slowest_call_ms'], 2)} ms, p99 {_num(bulk.get('p99_call_ms'), 2)} ms, "
                      f"median {_num(bulk['median_call_ms'], 2)} ms."]
    if data.get("cluster"):
        lines += ["", "A burst on the local Redis Cluster (3 masters, 3 replicas, same machine), "
                      "2 consumers:", "",
                  "| SHARDS | orders | closes/s | drained in | keys per master | Redis CPU s per master |",
                  "|---|---|---|---|---|---|"]
        for run in data["cluster"]:
            keys = " / ".join(f"{n:,}" for n in run["keys_per_master"].values())
            cpu = " / ".join(f"{s:.2f}" for s in run["redis_cpu_s_per_master"].values())
            drain = f"{run['drain_s']:.2f} s" if run["drain_s"] else f"{run['closed']:,} closed"
            lines.append(f"| {run['shards']} | {run['orders']:,} | {_num(run['closes_per_s'], 0)} "
                         f"| {drain} | {keys} | {cpu} |")
    return lines


def _machine_line(data: dict[str, Any]) -> str:
    m = data["machine"]
    database = m.get("database") or f"MariaDB {m.get('mariadb')}"
    return (f"Machine: {m['cpus']} CPUs ({m['cpu']}), {m['memory_gib']} GiB; database {database}, "
            f"Redis {m['redis']}, Python {m['python']}, Django {m['django']}; every server and "
            f"process on the same machine. Run took {data.get('elapsed_s', 0):.0f} s.")


def targets(data: dict[str, Any]) -> list[tuple[str, str, bool]]:
    ours = data["systems"]["ours"]
    steady, burst, idle = ours["steady"], ours["burst"], ours["idle"]
    seed = data["systems"].get("seed_zset", {}).get("burst", {})
    rows = [
        ("steady lateness p99 <= 20 ms", f"{_num(steady['lateness_ms']['p99'])} ms",
         steady["lateness_ms"]["p99"] <= 20),
        ("steady lateness max <= 100 ms", f"{_num(steady['lateness_ms']['max'])} ms",
         steady["lateness_ms"]["max"] <= 100),
        (">= 20,000 closes/s in the burst", f"{_num(burst['closes_per_s'], 0)}/s",
         (burst["closes_per_s"] or 0) >= 20_000),
        ("burst drained in <= 8 s", _burst(burst), bool(burst["drained"] and burst["drain_s"] <= 8)),
        ("no script call holds Redis > 5 ms", f"slowest {_num(burst['slowest_script_ms'], 2)} ms"
         if burst["slowest_script_ms"] else "none over 1 ms", (burst["slowest_script_ms"] or 0) <= 5),
        ("<= 0.05 DB queries per close (burst)", _num(burst["db_queries_per_close"], 3),
         (burst["db_queries_per_close"] or 99) <= 0.05),
        ("idle: 0 DB queries", f"{_num(idle['db_queries_per_s'], 2)}/s", idle["db_queries_per_s"] == 0),
        ("idle: <= 2 Redis commands/s per consumer (sent; run inside Redis in brackets)",
         f"{_num(idle['redis_round_trips_per_s'] / idle['processes'], 2)}/s "
         f"({_num(idle['redis_commands_run_per_s'] / idle['processes'], 2)}/s)",
         idle["redis_round_trips_per_s"] / idle["processes"] <= 2),
        ("<= 130 bytes of Redis per pending order", f"{_num(idle['redis_bytes_per_pending'], 0)} B",
         idle["redis_bytes_per_pending"] <= 130),
    ]
    if seed.get("closes_per_s"):
        ratio = (burst["closes_per_s"] or 0) / seed["closes_per_s"]
        rows.append((">= 20x the seeds' ZSET design in the burst", f"{ratio:.0f}x", ratio >= 20))
    create = data.get("create", {}).get("ours")
    if create:
        rows.append(("<= 0.5 ms p50 added to the create transaction",
                     f"{create['added_p50_ms']:.3f} ms", create["added_p50_ms"] <= 0.5))
    claims = data.get("claim_latency", {})
    if len(claims) >= 2:
        p50s = [row["round_trip_ms"]["p50"] for row in claims.values()]
        rows.append((f"claim latency flat (within 2x) from {int(min(claims, key=int)):,} to "
                     f"{int(max(claims, key=int)):,} pending",
                     " / ".join(f"{p:.3f}" for p in p50s) + " ms", max(p50s) <= 2 * min(p50s)))
    return rows


def plot(data: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = data["systems"]
    fig, (late_ax, rate_ax) = plt.subplots(1, 2, figsize=(13, 4.8))
    for system in systems.values():
        samples = system["steady"]["lateness_samples"]
        if samples:
            fractions = [(i + 1) / len(samples) for i in range(len(samples))]
            late_ax.plot([max(s, 0.01) for s in samples], fractions, label=system["label"])
    late_ax.set_xscale("log")
    late_ax.set_xlabel("lateness: commit of the close - deadline (ms, log)")
    late_ax.set_ylabel("fraction of orders closed")
    late_ax.set_title("Steady workload: lateness distribution")
    late_ax.grid(True, which="both", alpha=0.3)
    late_ax.legend(fontsize=8)

    names = list(systems)
    rates = [systems[n]["burst"]["closes_per_s"] or 0 for n in names]
    bars = rate_ax.bar(range(len(names)), rates, color="tab:blue")
    rate_ax.set_xticks(range(len(names)), names,
                       rotation=15, fontsize=8)
    rate_ax.set_yscale("log")
    rate_ax.set_ylabel("closes per second (log)")
    rate_ax.set_title("Burst workload: sustained closes/s")
    for bar, rate in zip(bars, rates, strict=True):
        rate_ax.annotate(f"{rate:,.0f}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                         ha="center", va="bottom", fontsize=8)
    fig.suptitle("django-order-timeout vs the seeds' designs and Celery ETA"
                 + (" (quick mode)" if data["quick"] else ""))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
