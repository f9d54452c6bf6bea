"""``python -m chaos.soak.side_by_side A/results.json B/results.json``: two soaks' growth side by side.

The tables of docs/benchmarks.md's "Storage and memory over time" section, printed from the runs'
own results (one soak per database, the same plan), so the docs' figures are the runs' to the
digit: every app table's and key pattern's growth per 1,000 orders with its interval and verdict,
the servers' and consumer 0's series, each run's memory over time and the targets.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from .report import _by_name, _combined, _constant, _interval, _span, time_table


def _cell(measures: dict[str, dict[str, Any]] | None, measure: str) -> str:
    one = (measures or {}).get(measure)
    return _interval(one["fit"], measure) if one and one["fit"] else "–"


def _verdict(measures: dict[str, dict[str, Any]] | None) -> str:
    return _combined(list(measures.values())) if measures else "–"


def tables(runs: list[dict[str, Any]]) -> list[str]:
    names = [run["database_name"] for run in runs]
    by_run = [_by_name(run["series"], "table") for run in runs]
    lines = ["| table | " + " | ".join(f"{name}: rows per 1,000 orders | bytes per 1,000 orders | verdict"
                                        for name in names) + " |",
             "|---|" + "---:|---:|---|" * len(runs)]
    for table in sorted({name for named in by_run for name in named}):
        lines.append(f"| `{table}` | " + " | ".join(
            f"{_cell(named.get(table), 'rows')} | {_cell(named.get(table), 'bytes')} | {_verdict(named.get(table))}"
            for named in by_run) + " |")
    return lines


def keys(runs: list[dict[str, Any]]) -> list[str]:
    names = [run["database_name"] for run in runs]
    by_run = [_by_name(run["series"], "redis") for run in runs]
    patterns = sorted({name for named in by_run for name in named})
    still = [pattern for pattern in patterns if all(pattern in named and _constant(named[pattern]) for named in by_run)]
    lines = ["| key pattern | " + " | ".join(f"{name}: keys | members per 1,000 orders | bytes per 1,000 orders | "
                                              "verdict" for name in names) + " |",
             "|---|" + "---:|---:|---:|---|" * len(runs)]
    for pattern in patterns:
        if pattern in still:
            continue
        cells = []
        for named in by_run:
            measures = named.get(pattern)
            span = _span(measures["keys"]["fit"], "keys") if measures else "–"
            cells.append(f"{span} | {_cell(measures, 'members')} | {_cell(measures, 'bytes')} | {_verdict(measures)}")
        lines.append(f"| `{pattern}` | " + " | ".join(cells) + " |")
    if still:
        lines += ["", "The same keys, members and bytes at every fitted sample of both runs (flat): "
                      + ", ".join(f"`{pattern}`" for pattern in still) + "."]
    return lines


def others(runs: list[dict[str, Any]]) -> list[str]:
    names = [run["database_name"] for run in runs]
    lines = ["| series | " + " | ".join(f"{name}: value | per 1,000 orders | verdict" for name in names) + " |",
             "|---|" + "---:|---:|---|" * len(runs)]
    series = [{(one["name"], one["measure"]): one for one in run["series"] if one["group"] in ("server", "process")}
              for run in runs]
    for key in dict.fromkeys(key for named in series for key in named):
        cells = []
        for named in series:
            one = named.get(key)
            cells.append("– | – | –" if one is None else
                         f"{_span(one['fit'], key[1])} | {_interval(one['fit'], key[1]) if one['fit'] else '–'} | "
                         f"{_combined([one])}")
        lines.append(f"| {key[0]} | " + " | ".join(cells) + " |")
    return lines


def main(paths: list[str]) -> str:
    runs = [json.loads(Path(path).read_text()) for path in paths]
    lines = ["#### Tables", "", *tables(runs), "", "#### Redis key patterns", "", *keys(runs), "",
             "#### Servers and consumer 0", "", *others(runs)]
    for run in runs:
        lines += ["", f"#### Memory and connections over time, {run['database_name']}", "",
                  *time_table(run["samples"], run["plan"]["rss_reference"])]
    lines += ["", "#### Targets", ""]
    for run in runs:
        lines += [f"- {run['database_name']}: {target['name']}: "
                  + ("met" if target["met"] else "not judged" if target["met"] is None else "**not met**")
                  + f" ({target['detail']})" for target in run["targets"]]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(main(sys.argv[1:]), end="")
