"""The run's results as a markdown table (for people and docs/reliability.md) and as JSON."""

from __future__ import annotations

from typing import Any


def _seconds(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def _count(value: int) -> str:
    return f"{value:,}"


def markdown(run: dict[str, Any]) -> str:
    machine = run["machine"]
    tuning = run["tuning"]
    lines = [
        f"Chaos run of {run['date']}, commit {run['commit']}, {'quick' if run['quick'] else 'full'} "
        f"mode, {run['elapsed_s']:.0f} s in all.",
        f"Machine: {machine['cpus']} x {machine['cpu']}, {machine['memory_gib']} GiB; "
        f"MariaDB {machine['mariadb']}, Redis {machine['redis']}, Python {machine['python']}, "
        f"Django {machine['django']}.",
        f"Settings: LEASE_SECONDS {tuning['lease_seconds']:g}, RETRY_DELAYS "
        f"{list(tuning['retry_delays'])}, MAX_TAKEOVERS {tuning['max_takeovers']}, COMPENSATION_GRACE "
        f"{tuning['compensation_grace']:g}, COMPENSATION_INTERVAL {tuning['compensation_interval']:g}, "
        f"BATCH_SIZE {tuning['batch_size']}, HOLD_RECHECK {tuning.get('hold_recheck', 30):g}, "
        f"NOTICE_RETRY_DELAYS [{', '.join(f'{delay:g}' for delay in tuning.get('notice_retry_delays', ()))}]; "
        f"REMINDERS [{', '.join(f'{lead:g}' for lead in tuning.get('reminders', ()))}] in `reminders` "
        f"and `every-kind` only; "
        f"order model {tuning['order_model']}.",
        "The queue's Redis: " + (f"a Redis Cluster of three primaries, SHARDS {tuning.get('shards', 1)}; every "
                                 "Redis fault is done to every node." if run.get("redis_cluster")
                                 else "one server."),
        "",
        "| scenario | cohort | must end | orders | closed | dead letters | paid | max late (s) "
        "| p99 late (s) | max after heal (s) | bound (s) | holds |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for scenario in run["scenarios"]:
        for index, row in enumerate(scenario["figures"]):
            name = f"**{scenario['name']}**" if index == 0 else ""
            holds = "yes" if row["unsettled"] == 0 and row["within_bound"] else "**NO**"
            lines.append(
                f"| {name} | {row['cohort']} | {row['expect']} | {_count(row['orders'])} | "
                f"{_count(row['closed'])} | {_count(row['dead_letters'])} | {_count(row['paid'])} | "
                f"{_seconds(row['late_max'])} | {_seconds(row['late_p99'])} | "
                f"{_seconds(row['after_heal_max'])} | {row['bound_text'] or '–'} | {holds} |")
    lines += ["", "| scenario | what was done | invariants | facts | took | load |",
              "|---|---|---|---|---:|---:|"]
    for scenario in run["scenarios"]:
        checks = scenario["checks"]
        failed = [check for check in checks if not check["ok"]]
        verdict = (f"all {len(checks)} hold" if not failed else
                   "**FAILED**: " + "; ".join(f"{c['name']} ({c['detail']})" for c in failed))
        facts = ", ".join(f"{key}: {value}" for key, value in scenario["facts"].items())
        lines.append(f"| {scenario['name']} | {scenario['title']} | {verdict} | {facts} | "
                     f"{scenario['elapsed_s']:.0f} s | {scenario.get('load', '?')} |")
    return "\n".join(lines) + "\n"
