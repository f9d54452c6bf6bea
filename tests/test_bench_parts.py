"""The parts of a close (bench/parts.py): per claimed member, so the held row's claim, lock and read
are spread over what it claims, not over the fewer orders it closes; rows run in alternated rounds,
each part their median. Behaviour only: no timing is asserted."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from bench import parts
from bench.parts import alternated


def test_rows_run_in_turn_round_after_round_and_each_figure_is_its_median_over_the_kept_rounds() -> None:
    calls: list[str] = []
    figures = {"a": iter([100.0, 1.0, 5.0, 3.0]), "b": iter([100.0, 20.0, 10.0, 30.0])}

    def run(name: str) -> Callable[[], dict[str, float]]:
        def measured() -> dict[str, float]:
            calls.append(name)
            value = next(figures[name])
            return {"part": value, "total": 2 * value}

        return measured

    medians = alternated({"a": run("a"), "b": run("b")}, rounds=3)

    assert calls == ["a", "b"] * 4
    # The first round (100 each) warms up and is not kept.
    assert medians == {"a": {"part": 3.0, "total": 6.0, "rounds": 3}, "b": {"part": 20.0, "total": 40.0, "rounds": 3}}


@pytest.mark.django_db(transaction=True)
def test_the_held_rows_parts_are_per_claimed_member_and_its_total_also_per_closed_order() -> None:
    measured = parts.ours("ours_held", 40)

    assert (measured["claimed"], measured["closed"]) == (40, 36)
    # The same time, over what was claimed and over what was closed.
    assert measured["total"] * 40 == pytest.approx(measured["total_per_closed"] * 36, rel=1e-3)
    assert sum(measured[part] for part in parts.PROMISES) == pytest.approx(measured["total"], rel=1e-2)


@pytest.mark.django_db(transaction=True)
def test_the_parts_are_measured_for_the_rows_asked_and_the_floor_alone() -> None:
    measured = parts.measure(30, ["ours", "celery_eta"], rounds=1)

    assert set(measured) == {"floor", "ours"}
    assert measured["ours"]["claimed"] == measured["ours"]["closed"] == 30
    assert measured["ours"]["rounds"] == 1


def test_a_two_trip_batchs_queries_are_parted_by_their_first_statement_past_the_begin() -> None:
    from bench.parts import _statement_part

    assert _statement_part("START TRANSACTION; SELECT id FROM o WHERE id IN (1) FOR UPDATE SKIP LOCKED; "
                           "SELECT id FROM o WHERE id IN (1)") == "locking SELECT (statement)"
    assert _statement_part('BEGIN; SELECT "id" FROM "o" FOR UPDATE SKIP LOCKED') == "locking SELECT (statement)"
    assert _statement_part("UPDATE o SET status = 'closed' WHERE id IN (1); COMMIT") == "UPDATE (statement)"
    assert _statement_part("COMMIT") == "transaction (BEGIN, COMMIT)"
