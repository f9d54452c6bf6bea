"""The prune: what the app wrote and no longer needs goes after an age of its own; what still
waits for a consumer or for staff never goes.

Seen before it existed: a steady run kept 842 reminder records and 695 delivered notices per
1,000 orders for good (about 0.7 kB an order), and nothing deleted them.
"""

from __future__ import annotations

import io
import threading
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from order_timeout.models import DeadLetter, Notice, Pause, Reminder
from order_timeout.queue import TimeoutQueue
from order_timeout.scans.pruning import prune
from order_timeout.scans.turns import run_prune
from order_timeout.tasks import compensate as compensate_task

from .conftest import finish, wait_for
from .test_command_progress import Terminal, frames

pytestmark = pytest.mark.django_db(transaction=True)

DAY = 86400


@pytest.fixture
def retention(settings: Any) -> None:
    """A day for every kind of row, so "old" and "recent" are clear of any clock's skew."""
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "NOTICE_RETENTION": DAY, "REMINDER_RETENTION": DAY,
                              "DEAD_LETTER_RETENTION": DAY}


def ago(seconds: float) -> Any:
    return timezone.now() - timedelta(seconds=seconds)


def notice(state: str, *, due_ago: float, delivered_ago: float | None = None) -> Notice:
    return Notice.objects.create(handler="order-expired-email", key=f"k{Notice.objects.count()}", state=state,
                                 due_at=ago(due_ago), created_at=ago(due_ago),
                                 delivered_at=None if delivered_ago is None else ago(delivered_ago))


def reminder(deadline_ago: float, order_id: int = 1, outcome: str = Reminder.Outcome.SENT) -> Reminder:
    return Reminder.objects.create(order_model="order_timeout.Order", order_id=str(order_id), lead_ms=60_000,
                                   deadline=ago(deadline_ago), outcome=outcome, at=ago(deadline_ago + 60))


def dead_letter(resolved_ago: float | None, order_id: int = 1) -> DeadLetter:
    return DeadLetter.objects.create(
        order_model="order_timeout.Order", order_id=str(order_id), attempts=4, error_type="RuntimeError",
        first_failed_at=ago(40 * DAY), last_failed_at=ago(40 * DAY),
        resolved_at=None if resolved_ago is None else ago(resolved_ago),
        resolution="" if resolved_ago is None else DeadLetter.Resolution.REQUEUED)


def test_delivered_and_dropped_notices_go_after_their_retention_and_pending_ones_never(retention):
    old_delivered = notice(Notice.State.DELIVERED, due_ago=2 * DAY, delivered_ago=2 * DAY)
    delivered_late = notice(Notice.State.DELIVERED, due_ago=2 * DAY, delivered_ago=DAY / 2)  # hours of retries
    recent = notice(Notice.State.DELIVERED, due_ago=60, delivered_ago=50)
    old_dropped = notice(Notice.State.DROPPED, due_ago=2 * DAY)
    old_pending = notice(Notice.State.PENDING, due_ago=30 * DAY)  # a dead letter's: staff decide

    result = prune()

    assert result.deleted["notices"] == 2
    assert set(Notice.objects.values_list("pk", flat=True)) == {delivered_late.pk, recent.pk, old_pending.pk}
    assert not Notice.objects.filter(pk__in=[old_delivered.pk, old_dropped.pk])


def test_reminder_records_go_once_their_deadline_is_older_than_the_retention(retention):
    old = [reminder(2 * DAY, order_id=n) for n in range(3)]
    failed = reminder(2 * DAY, order_id=9, outcome=Reminder.Outcome.FAILED)
    recent = reminder(DAY / 2)
    ahead = reminder(-600)  # its deadline still ahead: the record keeps it from being sent twice

    result = prune()

    assert result.deleted["reminders"] == 4
    assert set(Reminder.objects.values_list("pk", flat=True)) == {recent.pk, ahead.pk}
    assert not Reminder.objects.filter(pk__in=[failed.pk, *(r.pk for r in old)])


def test_resolved_dead_letters_go_after_their_retention_and_open_ones_never(retention):
    old = dead_letter(resolved_ago=2 * DAY)
    recent = dead_letter(resolved_ago=60, order_id=2)
    still_open = dead_letter(resolved_ago=None, order_id=3)

    result = prune()

    assert result.deleted["dead_letters"] == 1
    assert set(DeadLetter.objects.values_list("pk", flat=True)) == {recent.pk, still_open.pk}
    assert not DeadLetter.objects.filter(pk=old.pk)


def test_ended_pauses_go_after_the_dead_letter_retention_and_an_open_one_never(retention):
    ended = Pause.objects.create(timer="close", reason="PSP outage", paused_at=ago(3 * DAY), resumed_at=ago(2 * DAY))
    recent = Pause.objects.create(timer="close", reason="PSP outage", paused_at=ago(120), resumed_at=ago(60))
    still_open = Pause.objects.create(timer="close", open_for="close", reason="PSP outage", paused_at=ago(3 * DAY))

    result = prune()

    assert result.deleted["pauses"] == 1
    assert set(Pause.objects.values_list("pk", flat=True)) == {recent.pk, still_open.pk}
    assert not Pause.objects.filter(pk=ended.pk)


def test_a_retention_of_none_keeps_that_kind_of_row_for_ever(retention, settings):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "REMINDER_RETENTION": None}
    kept = reminder(400 * DAY)
    gone = dead_letter(resolved_ago=400 * DAY)

    result = prune()

    assert result.deleted == {"notices": 0, "reminders": 0, "dead_letters": 1, "refused_writes": 0, "pauses": 0}
    assert Reminder.objects.filter(pk=kept.pk).exists() and not DeadLetter.objects.filter(pk=gone.pk).exists()


def test_a_dry_run_counts_what_would_go_and_deletes_nothing(retention):
    reminder(2 * DAY)
    dead_letter(resolved_ago=2 * DAY)

    result = prune(dry_run=True)

    assert result.deleted == {"notices": 0, "reminders": 1, "dead_letters": 1, "refused_writes": 0, "pauses": 0}
    assert (Reminder.objects.count(), DeadLetter.objects.count()) == (1, 1)


def test_the_prune_deletes_by_key_in_chunks_of_prune_chunk(retention, settings):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "PRUNE_CHUNK": 2}
    for n in range(5):
        reminder(2 * DAY, order_id=n)

    with CaptureQueriesContext(connection) as queries:
        result = prune()

    commits = [query for query in queries.captured_queries if query["sql"].upper().startswith("COMMIT")]
    deletes = [query["sql"] for query in queries.captured_queries if query["sql"].startswith("DELETE")]
    assert result.deleted["reminders"] == 5
    assert len(commits) == 3  # a short transaction a chunk
    # By primary key: no range of an index is locked, where the consumers insert new records.
    assert deletes and all(" = " in sql or " IN (" in sql for sql in deletes)
    assert not any("deadline" in sql for sql in deletes)


def test_the_prune_never_waits_on_a_consumer_inserting_a_record_right_after_the_old_ones(retention):
    """On MariaDB a range DELETE locks the gap up to the next record: an uncommitted INSERT there
    (a consumer's batch recording its reminders) would keep the prune waiting, and the prune in turn
    every insert behind it. The prune reads its keys without a lock and deletes only those."""
    for n in range(3):
        reminder(2 * DAY, order_id=n)
    inserted, release = threading.Event(), threading.Event()

    def a_consumer_batch_in_progress() -> None:
        with transaction.atomic():
            reminder(DAY / 2, order_id=99)  # the next key along the deadline index
            inserted.set()
            release.wait(30)
        connection.close()

    batch = threading.Thread(target=a_consumer_batch_in_progress)
    batch.start()
    try:
        inserted.wait(10)
        done: list[Any] = []
        pruning = threading.Thread(target=lambda: (done.append(prune()), connection.close()))
        pruning.start()
        wait_for(lambda: bool(done), timeout=20)
    finally:
        release.set()
        finish(batch)
    finish(pruning)
    assert done[0].deleted["reminders"] == 3


def test_the_beat_task_prunes_once_per_prune_interval(retention, settings, redis_client):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "PRUNE_INTERVAL": 3600}
    reminder(2 * DAY)

    first = compensate_task()
    reminder(2 * DAY, order_id=2)
    second = compensate_task()

    assert first["prune"]["deleted"]["reminders"] == 1
    assert second["prune"] is None
    assert Reminder.objects.count() == 1
    # An hour later: the last complete prune started more than PRUNE_INTERVAL ago.
    redis_client.hdel(TimeoutQueue.from_settings().global_keys.housekeeping_runs, "prune:complete_started")
    assert compensate_task()["prune"]["deleted"]["reminders"] == 1


def test_a_prune_cut_short_by_its_budget_leaves_the_next_turn_due_at_once(retention, settings):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "PRUNE_CHUNK": 1}
    for n in range(3):
        reminder(2 * DAY, order_id=n)

    cut_short = run_prune("beat", budget=0)
    then = run_prune("consumer")

    assert cut_short is not None and not cut_short.complete and cut_short.deleted["reminders"] == 1
    assert then is not None and then.complete and then.deleted["reminders"] == 2


def test_prune_interval_none_leaves_pruning_to_the_command(retention, settings):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "PRUNE_INTERVAL": None}
    reminder(2 * DAY)

    assert compensate_task()["prune"] is None
    assert Reminder.objects.count() == 1


def test_what_the_prune_deleted_is_kept_for_the_metrics_and_the_admin(retention):
    reminder(2 * DAY)
    prune()
    reminder(2 * DAY, order_id=2)
    dead_letter(resolved_ago=2 * DAY)
    prune()

    record = TimeoutQueue.from_settings().housekeeping.prune_record()

    assert record.totals == {"notices": 0, "reminders": 2, "dead_letters": 1, "refused_writes": 0, "pauses": 0}
    assert record.last == {"notices": 0, "reminders": 1, "dead_letters": 1, "refused_writes": 0, "pauses": 0}
    assert record.at_ms is not None


def test_the_prune_command_says_what_it_deleted_and_draws_its_progress_on_a_terminal(retention):
    for n in range(3):
        reminder(2 * DAY, order_id=n)
    dead_letter(resolved_ago=2 * DAY)

    dry = io.StringIO()
    call_command("order_timeout_prune", "--dry-run", stdout=dry)
    terminal = Terminal()
    call_command("order_timeout_prune", stdout=terminal)

    assert ("Would delete 0 notices, 3 reminder records, 1 resolved dead letter, 0 handled refused writes "
            "and 0 ended pauses"
            in dry.getvalue())
    assert ("Deleted 0 notices, 3 reminder records, 1 resolved dead letter, 0 handled refused writes "
            "and 0 ended pauses"
            in terminal.getvalue())
    assert frames(terminal.getvalue())[-1].endswith(" 4/4")
    assert (Reminder.objects.count(), DeadLetter.objects.count()) == (0, 0)


def test_members_quarantined_longer_ago_than_the_dead_letter_retention_go_too(retention, redis_client):
    """A member that names no row waits in its shard's quarantine for a person, as a dead letter
    does: it goes as long after it was moved there as a resolved dead letter."""
    queue = TimeoutQueue.from_settings()
    quarantine = queue.shard_for("x").keys.quarantine
    now_ms = int(timezone.now().timestamp() * 1000)
    redis_client.zadd(quarantine, {b"\xff-not-text": now_ms - 2 * DAY * 1000, b"abc": now_ms - 60_000})
    remind_quarantine = queue.of_kind("remind").shard_for("y").keys.quarantine
    redis_client.zadd(remind_quarantine, {b"old:1:x": now_ms - 2 * DAY * 1000})

    result = prune()

    assert result.quarantine_trimmed == 2
    assert redis_client.zrange(quarantine, 0, -1) == [b"abc"]
    assert redis_client.zcard(remind_quarantine) == 0
