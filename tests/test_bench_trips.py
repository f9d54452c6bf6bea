"""The round trips per batch of a row's shape (bench/trips.py), counted on the wire. Not a number:
the product's batches change; that each batch is counted, the same way each time, and reported."""

from __future__ import annotations

from typing import Any

import pytest

from bench.side_by_side import markdown as side_by_side
from bench.trips import lines, probe


def trips_of(probed: dict[str, Any]) -> list[tuple[int, int]]:
    return [(batch["database"], batch["redis"]) for phase in probed["phases"] for batch in phase["batches"]]


@pytest.mark.django_db(transaction=True)
def test_each_plain_batch_costs_some_round_trips_to_each_server_and_as_many_every_time() -> None:
    first, second = probe("ours", batches=3, batch_size=200), probe("ours", batches=3, batch_size=200)

    counted = trips_of(first)
    assert len(counted) == 3
    assert all(isinstance(count, int) and count > 0 for pair in counted for count in pair)
    assert [batch["members"] for batch in first["phases"][0]["batches"]] == [200, 200, 200]
    assert trips_of(second) == counted
    assert second["phases"][0]["last_ack"] == first["phases"][0]["last_ack"]
    assert "error" not in first and "error" not in second


PROBED = {"ours": {"batch_size": 500, "phases": [{
    "phase": "closes", "claimed": 2000, "empty_claims": {"claims": 0, "database": 0, "redis": 0},
    "batches": [{"kind": "close", "members": 500, "database": 5, "redis": 1}] * 3,
    "last_ack": {"database": 0, "redis": 1}}]}}


def test_the_table_says_each_rows_trips_per_batch_database_then_redis() -> None:
    assert "| ours: close | 500 | 5 / 1 (each of 3) | 0 / 1 |" in lines(PROBED)


def test_both_databases_counts_stand_side_by_side() -> None:
    run = {"systems": {}, "machine": {"database": "d"}, "quick": True, "trips": PROBED}
    runs = [(db, run) for db in ("mariadb", "postgresql")]

    assert "| ours: close | 5 / 1 (each of 3) | 0 / 1 | 5 / 1 (each of 3) | 0 / 1 |" in side_by_side(runs)
