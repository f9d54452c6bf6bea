"""The README's Speed section speaks to a shop choosing a queue, and means what it says: each row
compares this app with what a shop would run instead (or with the floor), names the run it came
from, and every figure in it is one docs/benchmarks.md records. The CHANGELOG speaks to users too:
no issue numbers, which mean nothing outside the tracker."""

from __future__ import annotations

import re

from .readme import README, README_PATH, docs_page

BENCHMARKS = docs_page("benchmarks.md")
CHANGELOG = (README_PATH.parent / "CHANGELOG.md").read_text()


def speed_rows() -> list[list[str]]:
    section = README.split("\n## Speed\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("|---")]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows[1:]]


def test_the_speed_table_compares_this_app_with_what_a_shop_would_run_instead_and_the_floor():
    compared = " ".join(row[0] for row in speed_rows())

    for alternative in ("the floor", "Celery ETA", "RabbitMQ", "Django's tasks", "Procrastinate", "polling", "cron"):
        assert alternative in compared


def test_every_row_names_a_run_that_docs_benchmarks_records():
    for row in speed_rows():
        commits = re.findall(r"`([0-9a-f]{7})`", row[-1])
        assert commits, f"no run named in {row[0]!r}"
        assert all(f"`{commit}`" in BENCHMARKS for commit in commits)


def test_every_figure_of_the_speed_table_is_one_docs_benchmarks_records():
    for row in speed_rows():
        for cell in row[1:-1]:
            for figure in re.findall(r"\d[\d,]*(?:\.\d+)?x?", cell):
                assert figure in BENCHMARKS, f"{figure} ({row[0]!r}) is in no run of docs/benchmarks.md"


def test_the_changelog_names_no_issue_numbers():
    assert re.findall(r".{0,30}(?:[Ii]ssues? \d+|#\d+).{0,30}", CHANGELOG) == []
