"""The soak (``scripts/chaos --soak``): its arithmetic, and a tiny run of it on real servers.

The fit, the verdicts and the key patterns are pure functions, proved on figures whose answer is
known. The slow test runs a soak of 20 seconds, on private servers of the database this suite
runs on, with ``--break closed-twice``: its report must be whole (every app table, the queue's key
patterns, every consumer's memory, the fits, the targets), every invariant but the broken one
must hold, and the broken one must fail the run. Nothing here asserts a timing: how flat a
series is in a run this short is reported, never judged (too few samples).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

from chaos.soak.fit import FLAT, FLOORS, GROWS, TOO_FEW, least_squares, t975
from chaos.soak.keyspace import pattern_of
from chaos.soak.plan import OPEN_LETTERS, Plan
from chaos.soak.tables import app_models

ROOT = Path(__file__).resolve().parent.parent


def test_a_table_growing_with_the_orders_is_fitted_to_its_growth_per_thousand_orders() -> None:
    orders = [1000.0 * i for i in range(20)]
    rows = [5 + 0.842 * x + (3 if i % 2 else -3) for i, x in enumerate(orders)]
    fit = least_squares(orders, rows)
    assert fit is not None
    assert fit.low < 842 < fit.high and round(fit.slope) == 842
    assert fit.verdict(FLOORS["rows"]) == GROWS


def test_a_sawtooth_around_a_plateau_is_flat() -> None:
    """What the prune makes of a table: up between prunes, down at each, the same on average."""
    orders = [1000.0 * i for i in range(45)]
    rows = [3000 + 1000 * (i % 3 - 1) for i in range(45)]
    fit = least_squares(orders, rows)
    assert fit is not None and fit.low <= 0 <= fit.high
    assert fit.verdict(FLOORS["rows"]) == FLAT


def test_a_slope_under_the_noise_floor_is_flat_however_narrow_its_interval() -> None:
    orders = [1000.0 * i for i in range(30)]
    fit = least_squares(orders, [100 + 0.0005 * x for x in orders])
    assert fit is not None and fit.low > 0
    assert fit.verdict(FLOORS["rows"]) == FLAT


def test_a_fit_of_a_few_samples_gives_no_verdict() -> None:
    fit = least_squares([0.0, 1000.0, 2000.0, 3000.0], [0.0, 900.0, 2100.0, 2900.0])
    assert fit is not None and fit.verdict(FLOORS["rows"]) == TOO_FEW
    assert least_squares([5.0, 5.0, 5.0], [1.0, 2.0, 3.0]) is None


def test_students_t_is_the_table_and_between_its_rows_lies_between_them() -> None:
    assert t975(1) == 12.706 and t975(30) == 2.042
    assert 2.021 < t975(35) < 2.042
    assert 1.960 < t975(1000) < 1.980


def test_a_key_pattern_hides_the_prefix_the_shard_and_what_names_an_instance() -> None:
    assert pattern_of("{shop}:pending", "shop") == "{P}:pending"
    assert pattern_of("{shop}:remind:leased", "shop") == "{P}:remind:leased"
    assert pattern_of("{shop:12}:owners", "shop") == "{P:N}:owners"
    assert pattern_of("{shop}:epoch:0f3a9c2e7b1d", "shop") == "{P}:epoch:*"
    assert pattern_of("celery-task-meta-1", "shop") == "celery-task-meta-1"


def test_the_kills_spare_consumer_0_and_take_the_others_in_turn() -> None:
    kills = Plan(seconds=200).kills()
    assert [(moment, name) for moment, name, _ in kills] == [
        (30, "SIGTERM"), (45, "SIGKILL"), (90, "SIGKILL"), (120, "SIGTERM"), (135, "SIGKILL"), (180, "SIGKILL")]
    assert {slot for _, _, slot in kills} == {1, 2}
    assert [slot for _, name, slot in kills if name == "SIGKILL"] == [1, 2, 1, 2]
    assert Plan(seconds=200, consumers=1).kills() == []


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_tiny_soak_reports_every_table_pattern_and_consumer_and_a_broken_invariant_fails_it(
        tmp_path: Path) -> None:
    database = "postgresql" if connection.vendor == "postgresql" else "mariadb"
    out = tmp_path / "soak"
    finished = subprocess.run(
        [sys.executable, "-m", "chaos", "--soak", "20", "--database", database, "--rate", "20",
         "--sample-every", "5", "--sigkill-every", "8", "--sigterm-every", "12", "--compensation-interval", "5",
         "--prune-interval", "5", "--retention", "5", "--staff-every", "10", "--out", str(out),
         "--break", "closed-twice"],
        cwd=ROOT, capture_output=True, text=True, timeout=360)
    assert finished.returncode == 1, finished.stdout[-3000:] + finished.stderr[-3000:]
    run = json.loads((out / "results.json").read_text())

    failed = [check["name"] for check in run["checks"] if not check["ok"]]
    assert failed == ["no delivery committed twice"], [c for c in run["checks"] if not c["ok"]]
    assert len(run["checks"]) > 15

    tables = {model._meta.db_table for model in app_models()}
    samples = run["samples"]
    assert [sample["phase"] for sample in samples] == ["stream"] * 5 + ["settle"]
    assert all(set(sample["tables"]) == tables | {OPEN_LETTERS} for sample in samples)
    assert {"{P}:pending", "{P}:remind:pending", "{P}:epoch"} <= {pattern for s in samples for pattern in s["keys"]}
    assert all(len(sample["consumers"]) == 3 and sample["consumers"][0]["rss_kb"] > 0 for sample in samples)
    assert samples[-1]["orders"] == run["orders"] > 0
    assert run["kills"] == {"SIGKILL": 2, "SIGTERM": 2}

    series = {(one["group"], one["name"], one["measure"]) for one in run["series"]}
    assert {("table", table, measure) for table in tables for measure in ("rows", "bytes")} <= series
    assert ("table", OPEN_LETTERS, "rows") in series
    patterns = {pattern for sample in samples for pattern in sample["keys"]}
    assert {("redis", pattern, measure) for pattern in patterns for measure in ("keys", "members", "bytes")} <= series
    assert ("process", "consumer 0 (never killed) RSS", "rss_kb") in series
    assert {target["name"].split(" (")[0] for target in run["targets"]} >= {"every app table flat"}
    assert len(run["targets"]) == 3

    report = (out / "results.md").read_text()
    for heading in ("## Invariants", "## Growth per 1,000 orders at steady state",
                    "## Memory and connections over time", "## Targets"):
        assert heading in report
    assert "**FAILED** (1 of" in report and "no delivery committed twice" in report
    assert (out / "logs").is_dir()  # a failed soak keeps its processes' logs

    # docs/benchmarks.md's tables are printed from two runs' results by this command.
    side_by_side = subprocess.run([sys.executable, "-m", "chaos.soak.side_by_side", str(out / "results.json"),
                                   str(out / "results.json")], cwd=ROOT, capture_output=True, text=True, check=True)
    for heading in ("#### Tables", "#### Redis key patterns", "#### Servers and consumer 0", "#### Targets"):
        assert heading in side_by_side.stdout
    assert all(f"`{table}`" in side_by_side.stdout for table in tables)
