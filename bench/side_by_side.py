"""``python -m bench.side_by_side DIR_A DIR_B``: two runs' tables side by side (MariaDB and PostgreSQL).

``BENCH_DATABASE=both scripts/bench`` runs the benchmark on each database in
turn and writes this comparison as ``results.md`` above their two folders.
Each database's figures are read against that database's own floor: the
ratios travel, the absolute figures only illustrate this machine.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def _figures(system: dict[str, Any], floor: dict[str, Any]) -> list[str]:
    steady, burst = system.get("steady") or {}, system.get("burst") or {}
    rate = burst.get("closes_per_s")
    floor_rate = (floor.get("burst") or {}).get("closes_per_s")
    p50 = (steady.get("lateness_ms") or {}).get("p50")
    p99 = (steady.get("lateness_ms") or {}).get("p99")
    return [f"{rate:,.0f}" if rate else "-", f"{rate / floor_rate:.2f}x" if rate and floor_rate else "-",
            f"{p50:.1f} / {p99:.1f}" if p50 is not None and p99 is not None else "-",
            f"{steady['db_queries_per_close']:.2f}" if steady.get("db_queries_per_close") else "-"]


def markdown(runs: list[tuple[str, dict[str, Any]]]) -> str:
    names = [name for name in runs[0][1]["systems"] if all(name in data["systems"] for _, data in runs)]
    header = "| system | " + " | ".join(
        f"{db}: burst closes/s | {db}: ÷ floor | {db}: steady p50 / p99 (ms) | {db}: queries / steady close"
        for db, _ in runs) + " |"
    lines = [header, "|---|" + "---|" * (4 * len(runs))]
    for name in names:
        cells = []
        for _, data in runs:
            cells += _figures(data["systems"][name], data["systems"].get("floor") or {})
        lines.append(f"| {runs[0][1]['systems'][name]['label']} | " + " | ".join(cells) + " |")
    lines += _trips_lines(runs)
    lines.append("")
    for db, data in runs:
        m = data["machine"]
        lines.append(f"- {db}: {m.get('database')}, commit {data.get('commit', '?')}, "
                     f"{'quick' if data['quick'] else 'full'} run of {data.get('elapsed_s', 0):.0f} s.")
    return "\n".join(lines) + "\n"


def _trips_lines(runs: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """The round trips per batch of each row's shape (bench/trips.py), on each database."""
    from .trips import rows_of

    counted = [(db, rows_of(data.get("trips") or {})) for db, data in runs]
    names = list(dict.fromkeys(name for _, rows in counted for name in rows))
    if not names:
        return []
    lines = ["", "Round trips per batch (database / Redis), each phase's first batch left out (bench/trips.py):", "",
             "| row: batches of | " + " | ".join(f"{db}: per batch | {db}: last ack" for db, _ in counted) + " |",
             "|---|" + "---|---|" * len(counted)]
    for name in names:
        cells = []
        for _, rows in counted:
            row = rows.get(name)
            cells += [row["each"] + (f" **{row['error']}**" if row["error"] else ""), row["last_ack"]] if row \
                else ["-", "-"]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def main(folders: list[str]) -> None:
    runs = [(Path(folder).name, json.loads((Path(folder) / "results.json").read_text())) for folder in folders]
    print(markdown(runs), end="")


if __name__ == "__main__":
    main(sys.argv[1:])
