"""The keyset walk under the compensation scan and the drift count: every row once, in deadline
order, and a start on the ``(status, expires_at)`` index for every chunk after the first."""

from __future__ import annotations

import random
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlparse
from django.db import connection
from django.test.utils import CaptureQueriesContext
from sqlparse.sql import Comparison
from sqlparse.tokens import Comparison as ComparisonOperator

from order_timeout.db.walk import rows_by_deadline
from order_timeout.reporting.health import count_drift
from order_timeout.scans.compensation import compensate

from .conftest import both_models
from .helpers import lose_redis_data

pytestmark = pytest.mark.django_db

# How many orders share each deadline, from a deadline shared by nine to one of its own: any
# chunk size below nine splits a shared deadline between two chunks somewhere.
SHARED = (9, 1, 4, 1, 1, 6, 2, 3, 1, 5)


def unpaid_with_deadline(model: Any) -> Any:
    """The rows the drift count walks (the scan walks the overdue part of them)."""
    return model._base_manager.filter(model.unpaid_q(), expires_at__isnull=False)


def add_orders(model: Any, deadlines: list[datetime]) -> None:
    """Insert in an order unrelated to the deadlines, so the primary key tells the walk nothing."""
    shuffled = list(deadlines)
    random.Random(7).shuffle(shuffled)
    model._base_manager.bulk_create([model(expires_at=deadline) for deadline in shuffled])


def shared_deadlines(start: datetime) -> list[datetime]:
    return [start + timedelta(seconds=second) for second, count in enumerate(SHARED) for _ in range(count)]


def in_walk_order(model: Any) -> list[tuple[Any, datetime]]:
    """What the walk must yield: every row, by deadline, then by primary key."""
    return sorted(unpaid_with_deadline(model).values_list("pk", "expires_at"), key=lambda row: (row[1], row[0]))


@pytest.fixture
def start() -> datetime:
    return datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)


@both_models
@pytest.mark.parametrize("size", [1, 2, 3, 4, 7])
def test_walk_yields_every_row_once_in_deadline_order_when_chunks_split_a_shared_deadline(
        order_model, start, size):
    add_orders(order_model, shared_deadlines(start))

    chunks = list(rows_by_deadline(unpaid_with_deadline(order_model), size))

    assert [row for chunk in chunks for row in chunk] == in_walk_order(order_model)
    assert all(len(chunk) == size for chunk in chunks[:-1]) and 0 < len(chunks[-1]) <= size
    # The case this test is about: a deadline that ends one chunk begins the next.
    assert any(before[-1][1] == after[0][1] for before, after in zip(chunks, chunks[1:], strict=False))


@both_models
def test_orders_added_behind_the_walk_or_closed_by_it_do_not_shift_it(order_model, start):
    add_orders(order_model, shared_deadlines(start))
    expected = in_walk_order(order_model)
    walk = rows_by_deadline(unpaid_with_deadline(order_model), 4)

    first = next(walk)
    # The scan closes what it walked (the rows leave the walk's filter), and new orders arrive:
    # two with deadlines behind the walk, one at the deadline it stopped at (a higher key: after
    # the rows it has not reached yet), one ahead of everything.
    order_model._base_manager.filter(pk__in=[pk for pk, _ in first]).update(
        **{order_model.TIMEOUT_STATUS_FIELD: order_model.TIMEOUT_CLOSED_STATUS})
    add_orders(order_model, [start - timedelta(minutes=1), start - timedelta(seconds=1)])
    tied = order_model._base_manager.create(expires_at=first[-1][1])
    ahead = order_model._base_manager.create(expires_at=start + timedelta(days=1))
    rest = [row for chunk in walk for row in chunk]

    assert first == expected[:4]
    peers = max(i for i, (_, deadline) in enumerate(expected) if deadline == tied.expires_at) + 1
    assert rest == [*expected[4:peers], (tied.pk, tied.expires_at), *expected[peers:],
                    (ahead.pk, ahead.expires_at)]


def lower_bounds_of_every_row(sql: str) -> list[Comparison]:
    """The ``expires_at >= ...`` comparisons in no branch of an OR: bounds every row meets, which
    a planner can start an index scan from."""
    bounds = []
    for token in sqlparse.parse(sql)[0].flatten():
        comparison = token.parent
        if token.ttype is not ComparisonOperator or token.value != ">=" or not isinstance(comparison, Comparison):
            continue
        column = re.sub(r'[`"]', "", comparison.left.value).rsplit(".", 1)[-1]
        if column == "expires_at" and not in_a_branch_of_an_or(comparison):
            bounds.append(comparison)
    return bounds


def in_a_branch_of_an_or(token: Any) -> bool:
    group = token.parent
    while group is not None:
        if any(child.is_keyword and child.normalized == "OR" for child in group.tokens):
            return True
        group = group.parent
    return False


@both_models
def test_every_chunk_after_the_first_bounds_expires_at_from_below_at_the_last_deadline_seen(
        order_model, start):
    add_orders(order_model, shared_deadlines(start))

    with CaptureQueriesContext(connection) as captured:
        chunks = list(rows_by_deadline(unpaid_with_deadline(order_model), 4))

    queries = [query["sql"] for query in captured.captured_queries]
    assert len(queries) == len(chunks) + 1  # the last one finds nothing: the walk is over
    assert lower_bounds_of_every_row(queries[0]) == []
    for chunk, later in zip(chunks, queries[1:], strict=True):
        bounds = lower_bounds_of_every_row(later)
        assert len(bounds) == 1, later
        # The literal is the previous chunk's last deadline (in UTC, as both backends write it).
        assert chunk[-1][1].astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S") in bounds[0].right.value, later


postgresql_only = pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="PostgreSQL's plans; MariaDB seeks from the OR by itself (its SQL is checked above)")


def later_chunks_sql(model: Any, deadlines: list[datetime], size: int) -> list[str]:
    """The walk's queries over these deadlines, with statistics for the planner and no table scan
    (a table this small could be read whole instead: that would prove nothing about the index)."""
    add_orders(model, deadlines)
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {model._meta.db_table}")
        cursor.execute("SET LOCAL enable_seqscan = off")
    with CaptureQueriesContext(connection) as captured:
        for _ in rows_by_deadline(unpaid_with_deadline(model), size):
            pass
    return [query["sql"] for query in captured.captured_queries]


def explain(sql: str, *options: str) -> Any:
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN ({', '.join(['FORMAT JSON', *options])}) {sql}")
        return cursor.fetchone()[0][0]["Plan"]


def scans_of(plan: dict[str, Any], table: str) -> list[dict[str, Any]]:
    found = [plan] if plan.get("Relation Name") == table else []
    for child in plan.get("Plans", []):
        found += scans_of(child, table)
    return found


@postgresql_only
@both_models
def test_postgresql_starts_the_deadline_index_at_a_later_chunks_bound(order_model, start):
    queries = later_chunks_sql(order_model, [start + timedelta(milliseconds=i // 3) for i in range(3000)], 100)

    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN {queries[20]}")
        plan = "\n".join(row[0] for row in cursor.fetchall())

    assert re.search(r"Index Cond: .*\bexpires_at >= ", plan), plan


@postgresql_only
@both_models
def test_postgresql_expects_the_rows_left_after_a_chunk_near_the_end(order_model, start):
    """Had it taken the rest of the predicate for a second bound, it would expect a fraction of
    them there, and read and sort them all rather than the next chunk (bench/scan.py)."""
    queries = later_chunks_sql(order_model, [start + timedelta(milliseconds=i // 3) for i in range(3000)], 100)
    near_the_end = queries[25]  # 500 rows left

    scan, = scans_of(explain(near_the_end, "ANALYZE"), order_model._meta.db_table)

    assert scan["Actual Rows"] >= 100
    assert scan["Plan Rows"] >= 0.5 * (3000 - 25 * 100), scan


@pytest.mark.django_db(transaction=True)
@both_models
def test_the_scan_closes_every_overdue_order_when_chunks_split_a_shared_deadline(make_order, order_model):
    orders = [make_order(in_seconds=-600) for _ in range(7)] + [make_order(in_seconds=-900 + i) for i in range(3)]

    result = compensate(chunk_size=3)

    assert (result.examined, result.closed) == (10, 10)
    assert not order_model._base_manager.filter(order_model.unpaid_q(), pk__in=[o.pk for o in orders]).exists()


@pytest.mark.django_db(transaction=True)
@both_models
def test_drift_counts_each_lost_order_once_when_chunks_split_a_shared_deadline(make_order, order_model,
                                                                               queue, settings):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "COMPENSATION_CHUNK": 3}
    for _ in range(7):
        make_order(in_seconds=600)
    for i in range(3):
        make_order(in_seconds=900 + i)
    lose_redis_data(queue)

    assert count_drift(order_model, queue) == 10
