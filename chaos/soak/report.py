"""The soak's results as markdown (printed, written to DIR/results.md, and the docs' table)."""

from __future__ import annotations

from typing import Any

from .fit import FLAT, MIN_SAMPLES, TOO_FEW
from .growth import LONG_LIVED

# Rows of the table of memory over time: about this many, the reference moment and the last among them.
TIME_ROWS = 12


def _amount(value: float, measure: str) -> str:
    if measure in ("bytes", "rss_kb"):
        kb = value / 1024 if measure == "bytes" else value
        return f"{kb / 1024:,.1f} MB" if abs(kb) >= 10 * 1024 else f"{kb:,.1f} kB"
    return f"{value:,.0f}" if measure in ("rows", "keys", "members") else f"{value:,.1f}"


def _slope(value: float, measure: str) -> str:
    if measure == "bytes":
        return f"{value / 1024:+,.2f} kB"
    if measure == "rss_kb":
        return f"{value:+,.1f} kB"
    return f"{value:+,.2f}"


def _interval(fit: dict[str, Any], measure: str) -> str:
    return f"{_slope(fit['slope'], measure)} ({_slope(fit['low'], measure)} … {_slope(fit['high'], measure)})"


def _span(fit: dict[str, Any] | None, measure: str) -> str:
    return "–" if fit is None else f"{_amount(fit['first'], measure)} → {_amount(fit['last'], measure)}"


def _combined(measures: list[dict[str, Any]]) -> str:
    """One verdict for a table's or a pattern's measures: flat when every one is; else what is not."""
    verdicts = {one["verdict"] for one in measures}
    expected = next((one["expected"] for one in measures if one["expected"]), "")
    if verdicts == {FLAT}:
        verdict = FLAT
    elif verdicts <= {FLAT, TOO_FEW, "no fit"}:
        verdict = TOO_FEW
    else:
        off = [f"{one['measure'].replace('_kb', '')} {one['verdict']}" for one in measures
               if one["verdict"] not in (FLAT, TOO_FEW, "no fit")]
        verdict = ", ".join(off) if expected else f"**{', '.join(off)}**"
    return f"{verdict} (expected: {expected})" if expected else verdict


def _by_name(series: list[dict[str, Any]], group: str) -> dict[str, dict[str, dict[str, Any]]]:
    named: dict[str, dict[str, dict[str, Any]]] = {}
    for one in series:
        if one["group"] == group:
            named.setdefault(one["name"], {})[one["measure"]] = one
    return named


def _constant(measures: dict[str, dict[str, Any]]) -> bool:
    return all(one["fit"] is not None and one["fit"]["slope"] == 0 and one["fit"]["low"] == one["fit"]["high"]
               and one["fit"]["first"] == one["fit"]["last"] for one in measures.values())


def table_growth(series: list[dict[str, Any]]) -> list[str]:
    lines = ["| table | rows | rows per 1,000 orders (95 % interval) | bytes | bytes per 1,000 orders "
             "(95 % interval) | verdict |", "|---|---:|---:|---:|---:|---|"]
    for name, measures in _by_name(series, "table").items():
        rows, size = measures["rows"], measures.get("bytes")
        lines.append(f"| `{name}` | {_span(rows['fit'], 'rows')} | "
                     f"{_interval(rows['fit'], 'rows') if rows['fit'] else '–'} | "
                     f"{_span(size['fit'], 'bytes') if size else '–'} | "
                     f"{_interval(size['fit'], 'bytes') if size and size['fit'] else '–'} | "
                     f"{_combined(list(measures.values()))} |")
    return lines


def key_growth(series: list[dict[str, Any]]) -> list[str]:
    """The key patterns whose figures moved, one row each; the others named in one line."""
    lines = ["| key pattern | keys | members | members per 1,000 orders (95 % interval) | bytes | "
             "bytes per 1,000 orders (95 % interval) | verdict |", "|---|---:|---:|---:|---:|---:|---|"]
    still = []
    for name, measures in _by_name(series, "redis").items():
        if _constant(measures):
            still.append(f"`{name}`")
            continue
        members, size = measures["members"], measures["bytes"]
        lines.append(f"| `{name}` | {_span(measures['keys']['fit'], 'keys')} | {_span(members['fit'], 'members')} | "
                     f"{_interval(members['fit'], 'members') if members['fit'] else '–'} | "
                     f"{_span(size['fit'], 'bytes')} | {_interval(size['fit'], 'bytes') if size['fit'] else '–'} | "
                     f"{_combined(list(measures.values()))} |")
    if still:
        lines += ["", f"The same keys, members and bytes at every fitted sample (flat): {', '.join(still)}."]
    return lines


def other_growth(series: list[dict[str, Any]]) -> list[str]:
    lines = ["| series | value | per 1,000 orders (95 % interval) | verdict |", "|---|---:|---:|---|"]
    for one in series:
        if one["group"] in ("server", "process"):
            fit, measure = one["fit"], one["measure"]
            lines.append(f"| {one['name']} | {_span(fit, measure)} | {_interval(fit, measure) if fit else '–'} | "
                         f"{_combined([one])} |")
    return lines


def _picked(samples: list[dict[str, Any]], reference: float) -> list[dict[str, Any]]:
    """About TIME_ROWS samples spread over the run, the first at or after ``reference`` and the
    last among them."""
    if len(samples) <= TIME_ROWS:
        return samples
    step = len(samples) / (TIME_ROWS - 1)
    chosen = {round(index * step) for index in range(TIME_ROWS - 1)} | {len(samples) - 1}
    chosen |= {next((i for i, sample in enumerate(samples) if sample["at"] >= reference), len(samples) - 1)}
    return [samples[index] for index in sorted(chosen) if index < len(samples)]


def time_table(samples: list[dict[str, Any]], reference: float) -> list[str]:
    slots = max((len(sample["consumers"]) for sample in samples), default=0)
    names = [f"consumer {slot}" + (" (never killed)" if slot == LONG_LIVED else " (killed in turn)")
             for slot in range(slots)]
    lines = ["| t | orders | " + " | ".join(f"{name} RSS" for name in names)
             + " | harness RSS | database connections | Redis clients | Redis used_memory | load |",
             "|---:|---:|" + "---:|" * (slots + 5)]
    previous: dict[int, int] = {}
    for sample in _picked(samples, reference):
        cells = []
        for slot in range(slots):
            process = sample["consumers"][slot] if slot < len(sample["consumers"]) else None
            if process is None or process["rss_kb"] is None:
                cells.append("–")
                continue
            restarted = " (new)" if previous.get(slot) not in (None, process["pid"]) else ""
            previous[slot] = process["pid"]
            cells.append(f"{process['rss_kb'] / 1024:.1f} MB{restarted}")
        harness = f"{sample['harness_rss_kb'] / 1024:.1f} MB" if sample["harness_rss_kb"] else "–"
        settled = " (the stream over)" if sample["phase"] != "stream" else ""
        lines.append(f"| {sample['at'] / 60:.1f} min{settled} | {sample['orders']:,} | " + " | ".join(cells)
                     + f" | {harness} | {sample['database_connections']} | {sample['redis']['connected_clients']} | "
                       f"{sample['redis']['used_memory'] / 2**20:.1f} MB | {sample.get('load', 0):.1f} |")
    return lines


def markdown(run: dict[str, Any]) -> str:
    plan, machine = run["plan"], run["machine"]
    checks = run["checks"]
    failed = [check for check in checks if not check["ok"]]
    window = run["window"]
    lines = [
        f"Soak on {run['database_name']}, {plan['seconds']:g} s at {plan['rate']:g} orders/s: run of {run['date']}, "
        f"commit {run['commit']}, {run['elapsed_s']:.0f} s in all.",
        f"Machine: {machine['cpus']} x {machine['cpu']}, {machine['memory_gib']} GiB; {machine['database']}, "
        f"Redis {machine['redis']}, Python {machine['python']}, Django {machine['django']}.",
        f"Command: `{run['command']}`",
        "",
        f"What ran: {run['orders']:,} orders ({', '.join(f'{k} {v:,}' for k, v in run['cohorts'].items())}); "
        f"{plan['consumers']} consumers, consumer 0 never killed, the others SIGKILLed every "
        f"{plan['sigkill_every']:g} s and SIGTERMed every {plan['sigterm_every']:g} s in turn, each restarted at "
        f"once (SIGKILLs: {run['kills'].get('SIGKILL', 0)}, SIGTERMs: {run['kills'].get('SIGTERM', 0)}); the beat's "
        f"task (`order_timeout.tasks.compensate`: the scan, and the prune) every {plan['compensation_interval']:g} s "
        f"({run['ticks']} ticks); staff every {plan['staff_every']:g} s ({run['staff']}).",
        f"Ages: NOTICE_RETENTION, REMINDER_RETENTION and DEAD_LETTER_RETENTION {plan['retention']:g} s, "
        f"PRUNE_INTERVAL {plan['prune_interval']:g} s, COMPENSATION_FULL_INTERVAL {plan['full_interval']:g} s, "
        f"COMPENSATION_GRACE {run['tuning']['compensation_grace']:g} s, LEASE_SECONDS "
        f"{run['tuning']['lease_seconds']:g} s, BATCH_SIZE {run['tuning']['batch_size']}, REMINDERS "
        f"[{plan['reminder']:g}], RETRY_DELAYS {list(run['tuning']['retry_delays'])}.",
        "",
        "## Invariants",
        "",
        (f"All {len(checks)} hold." if not failed else
         f"**FAILED** ({len(failed)} of {len(checks)}): " + "; ".join(f"{c['name']} ({c['detail']})" for c in failed)),
        "",
        *(f"- {key}: {value}" for key, value in run["facts"].items()),
        "",
        "## Growth per 1,000 orders at steady state",
        "",
        f"Sampled every {plan['sample_every']:g} s; fitted over the stream's second half (from {window['from_s']:g} s: "
        f"{window['samples']} samples, orders {window['orders_from']:,} to {window['orders_to']:,}). Each series is "
        "fitted against the orders created by least squares; the interval is the slope ± Student's t (95 %, n − 2) "
        "times its standard error. **Flat**: the interval contains 0, or the slope is under the series' noise "
        f"floor per 1,000 orders ({', '.join(f'{k} {v:g}' for k, v in run['floors'].items())}; bytes in bytes, "
        f"rss in kB); fewer than {MIN_SAMPLES} samples: no verdict. Bytes: {run['bytes_are']}",
        "",
        *table_growth(run["series"]),
        "",
        *key_growth(run["series"]),
        "",
        *other_growth(run["series"]),
        "",
        "## Memory and connections over time",
        "",
        *time_table(run["samples"], plan["rss_reference"]),
        "",
        "## Targets",
        "",
        *(f"- {target['name']}: {'met' if target['met'] else 'not judged' if target['met'] is None else '**not met**'}"
          f" ({target['detail']})" for target in run["targets"]),
    ]
    return "\n".join(lines) + "\n"
