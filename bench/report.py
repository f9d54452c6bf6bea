"""The benchmark's table (markdown), its targets (issues 4, 19 and 21), and the picture."""

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


def _part(result: dict[str, Any] | None, render: Any) -> str:
    return render(result) if result else "-"


def _ratio(value: float | None, to: float | None) -> str:
    return f"{value / to:.2f}x" if value and to else "-"


def median_round(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Of a row's rounds, the one whose burst closes/s is the median (the only one, with one round)."""
    rated = sorted(runs, key=lambda run: ((run.get("burst") or {}).get("closes_per_s") or 0))
    return rated[len(rated) // 2]


def round_ratios(data: dict[str, Any], new: str, old: str, figure: int = 0) -> list[float]:
    """Each round's new/old ratio of burst closes/s (``figure`` 0) or CPU per close (1), in order."""
    pairs = zip((data.get("rounds") or {}).get(new, []), (data.get("rounds") or {}).get(old, []), strict=False)
    return [mine[figure] / theirs[figure] for mine, theirs in pairs if mine[figure] and theirs[figure]]


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def markdown(data: dict[str, Any]) -> str:
    if not data["systems"]:  # --slow-receivers-only: no row ran
        return "\n".join([*_slow_receivers_lines(data)[1:], "", _machine_line(data)]) + "\n"
    sizes = data["sizes"]
    systems = data["systems"]
    floor = (systems.get("floor") or {}).get("burst") or {}
    seeds = (systems.get("seed_zset") or {}).get("burst") or {}
    compared = data.get("compare")
    previous = (systems.get(f"ours@{compared['ref']}") or {}).get("burst") or {} if compared else {}
    lines = [
        f"Steady: {sizes['steady_rate']:,} deadlines/s for {sizes['steady_seconds']:g} s. "
        f"Burst: {sizes['burst']:,} orders due at one instant. "
        f"Idle: {sizes['idle']:,} pending ({sizes['celery_idle']:,} for Celery), nothing due."
        + (" **Quick mode: shrunk workloads, not comparable with a full run.**" if data["quick"] else ""),
        "",
        "Ratios are to rows of this same run: the burst's closes/s divided by the floor's, by the "
        "seeds' ZSET design's" + (f" and by this project at {compared['ref']}'s" if compared else "")
        + "; the steady p99 less the floor's.",
        "",
        "| system | closers | steady lateness p50 / p99 / max (ms) | steady p99 − floor's (ms) "
        "| burst lateness p50 / p99 / max (ms) | burst closes/s | ÷ floor | ÷ seeds' ZSET "
        + (f"| ÷ at {compared['ref']} " if compared else "")
        + "| burst drained in | closers' CPU per burst close (ms) | ÷ floor's | DB queries / close: steady, burst "
        "| Redis commands / close: steady, burst | idle DB queries/s "
        "| idle Redis commands sent/s (run inside Redis) | memory / pending order | create tx added p50 / p99 (ms) |",
        "|" + "---|" * (17 + bool(compared)),
    ]
    floor_p99 = (((systems.get("floor") or {}).get("steady") or {}).get("lateness_ms") or {}).get("p99")
    for name, system in systems.items():
        idle = system["idle"] or {}
        memory = "as above" if not idle else {
            "worker": f"{idle['worker_bytes_per_pending']:,.0f} B worker RSS "
                      f"+ {idle['redis_bytes_per_pending']:,.0f} B broker",
            "redis": f"{idle['redis_bytes_per_pending']:,.0f} B (Redis)",
            "broker": f"{idle['worker_bytes_per_pending']:,.0f} B broker RSS (RabbitMQ)",
        }.get(system.get("memory", "redis"), "0 extra (the row itself)")
        create = data.get("create", {}).get(name, {})
        steady, burst = system.get("steady"), system.get("burst")
        rate = (burst or {}).get("closes_per_s")
        p99 = ((steady or {}).get("lateness_ms") or {}).get("p99")
        lines.append(
            f"| {system['label']}{_smaller(system)} | {system['closers']} | {_part(steady, _lateness)} "
            f"| {_num(p99 - floor_p99) if p99 is not None and floor_p99 is not None else '-'} "
            f"| {_part(burst, _lateness)} | {_num(rate, 0)} | {_ratio(rate, floor.get('closes_per_s'))} "
            f"| {_ratio(rate, seeds.get('closes_per_s'))} "
            + (f"| {_ratio(rate, previous.get('closes_per_s'))} " if compared else "")
            + f"| {_part(burst, _burst)} | {_num((burst or {}).get('cpu_ms_per_close'), 3)} "
            f"| {_ratio((burst or {}).get('cpu_ms_per_close'), floor.get('cpu_ms_per_close'))} "
            f"| {_num((steady or {}).get('db_queries_per_close'), 2)}, "
            f"{_num((burst or {}).get('db_queries_per_close'), 3)} "
            f"| {_num((steady or {}).get('redis_commands_per_close'), 2)}, "
            f"{_num((burst or {}).get('redis_commands_per_close'), 3)} "
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
    for row in ("ours", "ours_reminders"):
        if not compared or row not in systems or f"{row}@{compared['ref']}" not in systems:
            continue
        from .compare import ratios

        lines += ["", f"{systems[row]['label']}, against itself at {compared['ref']} ({compared['sha'][:7]}), "
                      "same run, same machine, rows run one after the other:", "",
                  "| figure | now | at " + compared["ref"] + " | now / then |", "|---|---|---|---|"]
        lines += [f"| {label} | {_num(new, 2)} | {_num(old, 2)} | {_num(ratio, 2) if ratio else '-'} |"
                  for label, new, old, ratio in ratios(data, row, f"{row}@{compared['ref']}")]
    if compared and data.get("rounds"):
        lines += ["", f"Rounds, alternating each row with its run at {compared['ref']} (the figures above are each "
                      "row's median round): burst closes/s now / then, and closers' CPU per close now / then, "
                      "round by round, and their medians:", "",
                  "| row | closes/s ratio by round | median | CPU per close ratio by round | median |",
                  "|---|---|---|---|---|"]
        from .compare import COMPARED

        for row in COMPARED:
            if row not in systems or f"{row}@{compared['ref']}" not in systems:
                continue
            speed = round_ratios(data, row, f"{row}@{compared['ref']}")
            cpu = round_ratios(data, row, f"{row}@{compared['ref']}", figure=1)
            if speed:
                lines.append(f"| {systems[row]['label']} | {', '.join(f'{r:.2f}' for r in speed)} "
                             f"| {_median(speed):.2f}x | {', '.join(f'{r:.2f}' for r in cpu)} "
                             f"| {_median(cpu):.2f}x |" if cpu else f"| {systems[row]['label']} | "
                             f"{', '.join(f'{r:.2f}' for r in speed)} | {_median(speed):.2f}x | - | - |")
    # The shop row's target is to its own floor: it is reported without the plain row too.
    measured_targets = targets(data) if "ours" in systems or "floor_shop" in systems else []
    if measured_targets:
        lines += ["", "Targets, each a ratio between rows of this run (issues 13 and 15):", "",
                  "| target | measured | met |", "|---|---|---|"]
        lines += [f"| {target} | {measured} | {'yes' if met else '**no**'} |"
                  for target, measured, met in measured_targets]
    lines += _gc_lines(data)
    lines += _parts_lines(data)
    lines += _trips_lines(data)
    lines += _crash_lines(data)
    lines += _slow_receivers_lines(data)
    lines += _notices_lines(data)
    lines += _scale_lines(data)
    lines += ["", _machine_line(data)]
    return "\n".join(lines) + "\n"


def _smaller(system: dict[str, Any]) -> str:
    """A row run on smaller workloads (a peer's ``limits``) says its sizes."""
    sizes = system.get("sizes")
    if not sizes:
        return ""
    return (f" (smaller workloads: steady {sizes['steady_seconds']:g} s, burst {sizes['burst']:,}, "
            f"crash {sizes['crash']:,})")


def _gc_lines(data: dict[str, Any]) -> list[str]:
    """The closers' full garbage collections in each timed workload (bench/gc_pauses.py)."""
    rows = [(system["label"], [(system.get(kind) or {}).get("gc") for kind in ("steady", "burst")])
            for system in data["systems"].values()]
    rows = [(label, counted) for label, counted in rows if any(counted)]
    if not rows:
        return []
    lines = ["", "Full (generation-2) garbage collections in the closers' processes while each workload was timed: "
                 "how many, how many inside a batch (our consumers only: from the claim that returned members to "
                 "the batch's settling), the longest pause and all of them together; then the count in each "
                 "process. A full collection stops its process, and inside a batch it holds the batch's row locks "
                 "and lease while it runs.", "",
             "| system | steady | burst |", "|---|---|---|"]
    lines += [f"| {label} | " + " | ".join(_gc_cell(count) for count in counted) + " |" for label, counted in rows]
    return lines


def _gc_cell(counted: dict[str, Any] | None) -> str:
    if not counted:
        return "-"
    in_batch = "" if counted["in_batch"] is None else f" (in a batch: {counted['in_batch']})"
    text = f"gen-2 collections: {counted['collections']}{in_batch}"
    if counted["collections"]:
        text += f", longest {_num(counted['longest_ms'], 1)} ms, {_num(counted['total_ms'], 1)} ms in all"
    if len(counted["processes"]) > 1:
        text += "; by process " + ", ".join(str(process["collections"]) for process in counted["processes"])
    return text


def _parts_lines(data: dict[str, Any]) -> list[str]:
    """Where a close's time goes (bench/parts.py), per claimed member, by part, with the promise each buys."""
    parts = data.get("parts")
    if not parts:
        return []
    from .parts import FLOOR_PARTS, PROMISES, ROWS

    rows = [row for row in ROWS if row in parts]
    floor = parts.get("floor") or {}
    rounds = floor.get("rounds")
    lines = ["", f"Where the close's time goes: one consumer in the harness's process closes {data['parts_orders']:,} "
                 "due orders as each row's closers would (bench/shapes.py); each part's own time (wall, the "
                 "server's work for a statement included), in µs per claimed member: a held member (the held "
                 "row's tenth) is claimed, locked and read like the others, and not closed. "
                 + (f"Each figure is its median over {rounds} rounds, the rows alternated in each (each part's "
                    "median on its own: the parts need not add up to the total). " if rounds else "")
                 + "The floor's three steps on the same rows (it closes every order it claims): "
                 + ", ".join(f"{part.removeprefix('floor: ')} {_num(floor.get(part), 1)}" for part in FLOOR_PARTS)
                 + f", {_num(floor.get('total'), 1)} µs in all.", "",
             "| part | " + " | ".join(rows) + " | what it buys |", "|---|" + "---|" * len(rows) + "---|"]
    for part, promise in PROMISES.items():
        lines.append(f"| {part} | " + " | ".join(_num(parts[row].get(part), 1) for row in rows) + f" | {promise} |")
    lines.append("| **total per claimed member** | " + " | ".join(f"**{_num(parts[row]['total'], 1)}**" for row in rows)
                 + f" | ÷ the floor's {_num(floor.get('total'), 1)}: "
                 + ", ".join(_ratio(parts[row]["total"], floor.get("total")) for row in rows) + " |")
    lines.append("| total per closed order | " + " | ".join(_num(parts[row].get("total_per_closed"), 1) for row in rows)
                 + " | the same time over the orders closed: members claimed / closed "
                 + ", ".join(f"{_num(parts[row].get('claimed'), 0)} / {_num(parts[row].get('closed'), 0)}"
                             for row in rows) + " |")
    return lines


def _trips_lines(data: dict[str, Any]) -> list[str]:
    """Round trips per batch of each row's shape (bench/trips.py), database / Redis."""
    if not data.get("trips"):
        return []
    from .trips import ABOUT, lines

    return ["", ABOUT, "", *lines(data["trips"])]


def _crash_lines(data: dict[str, Any]) -> list[str]:
    """The crash workload (bench/crash.py): what a killed closer cost each row, and each row's note
    (also for a row that did not run it: ``--quick`` leaves our variants out)."""
    systems = [system for system in data["systems"].values() if system.get("crash")]
    if not systems:
        return []
    sizes = data["sizes"]
    lease = sizes.get("crash_lease_seconds")
    lines = ["", f"Crash: {sizes['crash']:,} orders due at one instant; once a third is closed, one closer "
                 "process and its children get SIGKILL and it is started again at once, as a supervisor "
                 "would. The wait ends when nothing is unpaid or in flight; or when nothing is in flight and "
                 "nothing closed for the closer's start-up + 1 s; or "
                 f"{sizes['crash_cap_seconds']:g} s after the kill. Our consumers' LEASE_SECONDS: "
                 + (f"{lease:g} s (shortened for the quick run)" if lease else "30 s (the default)") + ". "
                 "Never: still unpaid when the wait ended. Twice: `order_expired` receivers committed "
                 "twice. Late: closed after the bound, where the pace before the kill would have drained "
                 "the burst, plus 1 s. A lost Redis is not measured: the notes say what it does.", "",
             "| system | closed | never | twice | late (bound s) | latest close after the deadline (s) "
             "| killed after (closed then) | a crash, a lost broker |", "|---|---|---|---|---|---|---|---|"]
    for system in data["systems"].values():
        run, note = system.get("crash"), system.get("crash_note") or "-"
        if not run:
            lines.append(f"| {system['label']} | not run | | | | | | {note} |")
            continue
        lines.append(_crash_row(system["label"], run, note))
        frozen = system.get("crash_frozen")
        if frozen:
            lines.append(_crash_row(f"{system['label']}, {frozen['frozen']} frozen (SIGSTOP, not restarted)",
                                    frozen, "As above: a frozen consumer stops beating and is taken for dead."))
        emptied = system.get("crash_redis_lost")
        if emptied:
            lines.append(_crash_row(f"{system['label']}, its Redis emptied (FLUSHDB), no closer killed",
                                    emptied, "The Redis-lost part of the note above, measured."))
    return lines


def _crash_row(label: str, run: dict[str, Any], note: str) -> str:
    unrecorded = f" ({run['unrecorded']:,} unrecorded)" if run.get("unrecorded") else ""
    return (f"| {label} | {run['closed']:,} of {run['orders']:,}{unrecorded} "
            f"| {'**' + format(run['never'], ',') + '**' if run['never'] else 0} | {run['twice']:,} "
            f"| {_num(run['late'])} ({_num(run['late_bound_s'], 2)}) | {_num(run['latest_s'], 2)} "
            f"| {run['killed_after_s']:.2f} s ({run['closed_at_kill']:,}) | {note} |")


def _slow_receivers_lines(data: dict[str, Any]) -> list[str]:
    """The slow receivers workload (bench/slow_receivers.py): one row, its targets beside it."""
    run = data.get("slow_receivers")
    if not run:
        return []
    given_up = run["given_up"]
    least = ", ".join("-" if size is None else str(size) for size in run["least_claim"])
    drained = (f"{run['drain_s']:.2f} s" if run["drain_s"] is not None
               else f"{run['closed']:,} of {run['orders']:,} in {run['waited_s']:.0f} s")
    ratio = f"{run['ratio']:.2f}x" if run["ratio"] is not None else "-"
    met = run["ratio"] is not None and run["ratio"] <= 2.0 and max(given_up, default=0) <= 1
    return ["", f"Slow receivers: {run['orders']:,} orders due at one instant on {len(given_up)} consumers started "
                f"for it alone (batch {run['batch']}, BATCH_TIME_LIMIT {run['time_limit_s']:g} s), whose "
                f"`order_expired` receiver takes {1000 * run['delay_s']:g} ms an order, so a batch of "
                f"{run['batch']} needs {run['batch'] * run['delay_s']:g} s. It shows whether a batch given up for "
                "time is given up again and again (rolled back, taken over whole) or each consumer, after one, "
                "claims what fits: the drain against the receivers' own time (orders x their time / consumers; "
                "target: at most 2x) and the batches each consumer gave up (target: at most 1).", "",
            "| drained in | receivers' own time | ratio | batches given up, per consumer | least claim after, "
            "per consumer | closed twice | never closed | targets met |", "|---|---|---|---|---|---|---|---|",
            f"| {drained} | {run['receivers_s']:g} s | {ratio} | {', '.join(str(n) for n in given_up)} | {least} "
            f"| {_bold(run['twice'])} | {_bold(run['never'])} | {'yes' if met else '**no**'} |"]


def _notices_lines(data: dict[str, Any]) -> list[str]:
    """The notices rows (bench/notices.py): each workload's notices, and the crashes'."""
    from .notices import WAIT_CAPS
    rows = [(name, system) for name, system in data["systems"].items() if system.get("delivers_notices")]
    if not rows:
        return []
    plain = ((data["systems"].get("ours") or {}).get("burst") or {}).get("closes_per_s")
    lines = ["", "Notices: one webhook per closed order, POSTed to a local HTTP sink (a ThreadingHTTPServer on "
                 "loopback in the harness, answering 200 at once) that records each request's Idempotency-Key "
                 "and arrival. Expected: one per order the database shows closed. Lateness: the first arrival "
                 "of an order's key - the close's COMMIT. Pending: still held by the row when the wait ended (at "
                 f"most {WAIT_CAPS} times the workload's cap after the closes); lost: neither delivered nor pending. "
                 "Closes/s: the burst's, as in the main table.", "",
             "| row | workload | closes/s ÷ the plain row's | notices expected | delivered | lost | duplicates "
             "| pending at the end | lateness after the commit p50 / p99 / max (ms) | waited after the closes (s) "
             "| closers' CPU per order, close and notice (ms) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for _name, system in rows:
        for kind in ("steady", "burst"):
            run = system.get(kind)
            notices = (run or {}).get("notices")
            if not notices:
                continue
            late = notices["lateness_ms"]
            ratio = _ratio(run.get("closes_per_s"), plain) if kind == "burst" else "-"
            lines.append(
                f"| {system['label']}{_smaller(system)} | {kind} | {ratio} | {notices['expected']:,} "
                f"| {notices['delivered']:,} | {_bold(notices['lost'])} | {notices['duplicates']:,} "
                f"| {notices['pending']:,} | {_num(late['p50'])} / {_num(late['p99'])} / {_num(late['max'])} "
                f"| {_num(notices.get('waited_s'), 1)} | {_num(notices.get('cpu_ms_per_order'), 3)} |")
    crashes = [(system, system[result]) for _name, system in rows for result in ("crash", "crash_worker")
               if (system.get(result) or {}).get("notices")]
    if crashes:
        lines += ["", "Notices in the crash workload (as above: a process killed with SIGKILL once a third of the "
                      "burst is closed, started again at once): notices expected (one per order closed), delivered, "
                      "lost (neither delivered nor pending when the wait ended), delivered twice or more "
                      "(duplicates: each with the same key), and their lateness after the close's COMMIT.", "",
                  "| row | killed | orders closed | notices delivered | lost | duplicates (orders) "
                  "| pending at the end | lateness after the commit p50 / p99 / max (s) | waited after the kill (s) |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for system, run in crashes:
            notices = run["notices"]
            late = {part: (value / 1000 if value == value else None) for part, value in notices["lateness_ms"].items()}
            lines.append(
                f"| {system['label']} | {run.get('killed', 'a closer')} | {run['closed']:,} of {run['orders']:,} "
                f"| {notices['delivered']:,} of {notices['expected']:,} | {_bold(notices['lost'])} "
                f"| {notices['duplicates']:,} ({notices['duplicated_orders']:,}) | {notices['pending']:,} "
                f"| {_num(late['p50'], 2)} / {_num(late['p99'], 2)} / {_num(late['max'], 2)} "
                f"| {_num(run.get('waited_after_kill_s'), 1)} |")
    return lines


def _bold(count: int) -> str:
    return f"**{count:,}**" if count else "0"


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
    return (f"Commit {data.get('commit', '?')}. Machine: {m['cpus']} CPUs ({m['cpu']}), {m['memory_gib']} GiB; "
            f"database {database}, Redis {m['redis']}, Python {m['python']}, Django {m['django']}; every "
            f"server and process on the same machine. Run took {data.get('elapsed_s', 0):.0f} s.")


# The full run's burst (workloads.FULL); a smaller one is held to less of the floor's rate.
FULL_BURST = 100_000


def targets(data: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """The targets, as ratios between rows of the same run (absolute figures travel badly)."""
    systems = data["systems"]
    ours = systems.get("ours") or {}
    burst, idle = ours.get("burst") or {}, ours.get("idle") or {}
    rate = burst.get("closes_per_s") or 0
    rows: list[tuple[str, str, bool]] = []

    def burst_rate(name: str) -> float:
        return ((systems.get(name) or {}).get("burst") or {}).get("closes_per_s") or 0

    def steady_p99(name: str) -> float | None:
        return (((systems.get(name) or {}).get("steady") or {}).get("lateness_ms") or {}).get("p99")

    def burst_cpu(name: str) -> float:
        return ((systems.get(name) or {}).get("burst") or {}).get("cpu_ms_per_close") or 0

    if burst_rate("floor"):
        floor_rate = burst_rate("floor")
        if "ours" in systems:
            # A burst's fixed costs weigh more in a small one: 0.8x in the full run's, 0.6x below it.
            full = (data.get("sizes") or {}).get("burst", 0) >= FULL_BURST
            least = 0.8 if full else 0.6
            rows.append((f">= {least:g}x the floor's burst closes/s (" + (f"a burst of {FULL_BURST:,} or more)" if full
                                                                          else f"a burst under {FULL_BURST:,})"),
                         f"{rate / floor_rate:.2f}x", rate >= least * floor_rate))
        if burst_rate("ours_per_order"):
            rows.append(("an order_expired receiver per order: >= 0.35x the floor's burst closes/s",
                         f"{burst_rate('ours_per_order') / floor_rate:.2f}x",
                         burst_rate("ours_per_order") >= 0.35 * floor_rate))
    if burst_cpu("floor") and burst_cpu("ours"):
        rows.append(("closers' CPU per burst close <= 2x the floor's",
                     f"{burst_cpu('ours') / burst_cpu('floor'):.1f}x", burst_cpu("ours") <= 2 * burst_cpu("floor")))
    floor_p99, p99 = steady_p99("floor"), steady_p99("ours")
    if floor_p99 is not None and p99 is not None:
        window = data.get("batch_window_ms", 3.0)
        rows.append((f"steady p99 <= the floor's + BATCH_WINDOW ({window:g} ms) + 10 ms",
                     f"{p99:.1f} ms vs {floor_p99:.1f} + {window:g} + 10", p99 <= floor_p99 + window + 10))
    if burst_rate("seed_zset") and "ours" in systems:
        rows.append((">= 20x the seeds' ZSET design in the burst", f"{rate / burst_rate('seed_zset'):.1f}x",
                     rate >= 20 * burst_rate("seed_zset")))
    compared = data.get("compare")

    then = f"@{compared['ref']}" if compared else ""

    def against_then(row: str) -> tuple[float, str] | None:
        """The row's burst closes/s over its own at the compared commit: with several rounds, the
        median of the rounds' own ratios (each round's two runs side by side), else the one ratio."""
        if not (then and burst_rate(row + then) and burst_rate(row)):
            return None
        by_round = round_ratios(data, row, row + then)
        if len(by_round) > 1:
            return _median(by_round), f", median of {len(by_round)} rounds"
        return burst_rate(row) / burst_rate(row + then), ""

    plain = against_then("ours")
    if plain:
        rows.append((f">= 1.0x the burst closes/s at {then[1:]}{plain[1]}", f"{plain[0]:.2f}x",
                     plain[0] >= 1.0))
    like_for_like = then and burst_rate("ours_per_order") and burst_rate("ours" + then)
    if like_for_like:
        # The compared commit's closers record per order (its bench/recorder.py): so does this row.
        rows.append((f"an order_expired receiver per order: the burst closes/s over ours at {then[1:]} (the same "
                     "recorder)", f"{burst_rate('ours_per_order') / burst_rate('ours' + then):.2f}x",
                     burst_rate("ours_per_order") >= burst_rate("ours" + then)))
    for row, what in (("ours", "plain"), ("ours_reminders", "one reminder per order"),
                      ("ours_held", "10 % of the burst held")):
        measured = against_then(row)
        if measured:
            rows.append((f"{what}: >= 0.97x the burst closes/s at {then[1:]}{measured[1]}",
                         f"{measured[0]:.2f}x", measured[0] >= 0.97))
    reminders_p99 = steady_p99("ours_reminders")
    if reminders_p99 is not None and p99:
        rows.append(("one reminder per order: close p99 <= 1.5x the plain row's",
                     f"{reminders_p99 / p99:.2f}x", reminders_p99 <= 1.5 * p99))
    if burst_rate("ours_held") and rate:
        rows.append(("10 % of the burst held: the others' closes/s >= 0.9x the plain row's",
                     f"{burst_rate('ours_held') / rate:.2f}x", burst_rate("ours_held") >= 0.9 * rate))
    if burst_rate("ours_shop_batch") and rate:
        rows.append(("shop model with batch receivers: >= 0.6x the plain row's burst closes/s",
                     f"{burst_rate('ours_shop_batch') / rate:.2f}x", burst_rate("ours_shop_batch") >= 0.6 * rate))
    if burst_rate("ours_shop_batch") and burst_rate("floor_shop"):
        # Its own floor does the shop receiver's INSERT too: what is left is the app's share.
        shop_floor = burst_rate("floor_shop")
        rows.append(("shop model with batch receivers: >= 0.85x the shop floor's burst closes/s (its UPDATE and "
                     "the shop's INSERT)", f"{burst_rate('ours_shop_batch') / shop_floor:.2f}x",
                     burst_rate("ours_shop_batch") >= 0.85 * shop_floor))
    if burst_rate("ours_notices") and rate:
        rows.append(("close + one notice per order: >= 0.7x the plain row's burst closes/s",
                     f"{burst_rate('ours_notices') / rate:.2f}x", burst_rate("ours_notices") >= 0.7 * rate))
    noticed = systems.get("ours_notices") or {}
    counted: list[tuple[str, dict[str, Any]]] = [
        (kind, (noticed.get(kind) or {})["notices"]) for kind in ("steady", "burst", "crash")
        if (noticed.get(kind) or {}).get("notices")]
    if counted:
        rows.append(("close + one notice per order: 0 notices lost (" + ", ".join(kind for kind, _ in counted) + ")",
                     ", ".join(f"{notices['lost']:,}" for _, notices in counted),
                     not any(notices["lost"] for _, notices in counted)))
    if burst:
        rows.append(("<= 0.05 DB queries per close (burst)", _num(burst["db_queries_per_close"], 3),
                     (burst["db_queries_per_close"] or 99) <= 0.05))
    if idle:
        rows += [
            ("idle: 0 DB queries", f"{_num(idle['db_queries_per_s'], 2)}/s", idle["db_queries_per_s"] == 0),
            ("<= 130 bytes of Redis per pending order", f"{_num(idle['redis_bytes_per_pending'], 0)} B",
             idle["redis_bytes_per_pending"] <= 130),
        ]
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
        samples = (system.get("steady") or {}).get("lateness_samples")
        if samples:
            fractions = [(i + 1) / len(samples) for i in range(len(samples))]
            late_ax.plot([max(s, 0.01) for s in samples], fractions, label=system["label"])
    late_ax.set_xscale("log")
    late_ax.set_xlabel("lateness: commit of the close - deadline (ms, log)")
    late_ax.set_ylabel("fraction of orders closed")
    late_ax.set_title("Steady workload: lateness distribution")
    late_ax.grid(True, which="both", alpha=0.3)
    late_ax.legend(fontsize=8)

    names = [name for name in systems if systems[name].get("burst")]
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


def verdict(data: dict[str, Any]) -> list[str]:
    """What fails the run: anyone closing an order twice; one of our systems (this project on
    either model, or on the cluster) crashing or leaving a workload undrained; one of our rows
    closing an order twice or never in the crash workload, or our consumers in the slow receivers
    workload (its targets are timings: reported, never failed). Another system struggling, or losing
    orders to the crash, is a result, not a failure; no timing ever fails it."""
    runs = [(name, kind, s[kind]) for name, s in data["systems"].items() for kind in ("steady", "burst")
            if s.get(kind)]
    failures = [f"{name} {kind}: {run['closed_twice']} orders closed twice"
                for name, kind, run in runs if run["closed_twice"]]
    failures += [f"{name} {kind}: {run['held_closed']} orders closed while their payment was in flight"
                 for name, kind, run in runs if run.get("held_closed")]
    ours = {name for name in data["systems"] if name.startswith(("ours", "floor"))}
    failures += [f"{name}: {len(errors)} consumer error(s)" for name, errors in data["errors"].items()
                 if name in ours]
    failures += [f"{name} {kind}: {run['closed']:,} of {run['orders']:,} orders closed"
                 for name, kind, run in runs if name in ours and not run["drained"]]
    crashes = [(f"{name} {result}", s[result]) for name, s in data["systems"].items()
               for result in ("crash", "crash_frozen", "crash_redis_lost")
               if s.get(result) and name.startswith("ours")]
    failures += [f"{name}: {run['twice']} orders closed twice" for name, run in crashes if run["twice"]]
    failures += [f"{name}: {run['never']:,} of {run['orders']:,} orders never closed"
                 for name, run in crashes if run["never"]]
    failures += notices_failures(data)
    slow = data.get("slow_receivers")
    if slow:
        failures += [f"slow receivers: {slow['twice']} orders closed twice"] if slow["twice"] else []
        failures += [f"slow receivers: {slow['never']:,} of {slow['orders']:,} orders never closed"] \
            if slow["never"] else []
        failures += [f"slow receivers: {len(slow['errors'])} consumer error(s)"] if slow["errors"] else []
    failures += [f"cluster burst with {run['shards']} shard(s): {run['closed']:,} of {run['orders']:,} "
                 "orders closed" for run in data.get("cluster") or [] if run["closed"] != run["orders"]]
    return failures


def notices_failures(data: dict[str, Any]) -> list[str]:
    """One of our notices rows losing a notice, or still holding one undelivered when its wait ended
    (an undrained workload), in any workload, the crash's included: its promise is at least once."""
    failures = []
    for name, system in data["systems"].items():
        if not (name.startswith("ours") and system.get("delivers_notices")):
            continue
        for kind in ("steady", "burst", "crash"):
            notices = (system.get(kind) or {}).get("notices") or {}
            if notices.get("lost"):
                failures.append(f"{name} {kind}: {notices['lost']:,} of {notices['expected']:,} notices lost")
            if notices.get("pending"):
                failures.append(f"{name} {kind}: {notices['pending']:,} of {notices['expected']:,} notices still "
                                "undelivered when the wait ended")
            if notices.get("unasked"):
                failures.append(f"{name} {kind}: {notices['unasked']:,} notices of orders not closed")
    return failures
