"""What the app keeps in the database, and what the prune took away: for the status command, the
metrics and the admin page alike.

Sizes are the database's own estimates (``db.sizes``), so asking costs no table walk; the
prune's figures are what it recorded in Redis (``Housekeeping.prune_record``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from django.db import router

from ..conf import settings
from ..db.sizes import table_sizes
from ..exceptions import QueueUnavailable
from ..models import DeadLetter, Deadline, Notice, Pause, QueueEpoch, RefusedWrite, Reminder
from ..queue import TimeoutQueue
from ..timers.members import datetime_of_score

# The app's own tables, by the name the prune counts each under, and the setting of its retention
# (None: not pruned: a deadline goes with its row's act, an epoch is one row a queue).
TABLES: dict[str, tuple[Any, str | None]] = {
    "notices": (Notice, "NOTICE_RETENTION"),
    "reminders": (Reminder, "REMINDER_RETENTION"),
    "dead_letters": (DeadLetter, "DEAD_LETTER_RETENTION"),
    "refused_writes": (RefusedWrite, "DEAD_LETTER_RETENTION"),
    "pauses": (Pause, "DEAD_LETTER_RETENTION"),
    "deadlines": (Deadline, None),
    "queue_epochs": (QueueEpoch, None),
}


@dataclass(frozen=True)
class TableStorage:
    table: str
    # Estimated rows and bytes (data and indexes); None where the database cannot say.
    rows: int | None
    bytes: int | None
    # Seconds its rows are kept once done with (None: for ever, or not pruned at all: ``pruned``).
    retention_seconds: float | None
    pruned: bool
    # Rows the prune deleted since Redis last lost its figures, and in its last run.
    deleted_total: int = 0
    deleted_last: int = 0


@dataclass(frozen=True)
class Storage:
    tables: dict[str, TableStorage] = field(default_factory=dict)
    # When the last prune ended (None: none recorded, or Redis could not be read).
    last_prune_at: datetime | None = None

    def as_dict(self) -> dict[str, Any]:
        figures = asdict(self)
        figures["last_prune_at"] = None if self.last_prune_at is None else self.last_prune_at.isoformat()
        return figures


def measure_storage(queue: TimeoutQueue | None = None) -> Storage:
    """Each app table's size and retention, and the prune's figures (none when Redis is down)."""
    sizes: dict[str, Any] = {}
    for name, (model, _setting) in TABLES.items():
        using = router.db_for_write(model)
        sizes[name] = table_sizes(using, [model])[model._meta.db_table]
    try:
        record = (queue or TimeoutQueue.from_settings()).housekeeping.prune_record()
    except QueueUnavailable:
        record = None
    tables = {
        name: TableStorage(
            table=model._meta.db_table, rows=sizes[name].rows, bytes=sizes[name].bytes,
            retention_seconds=None if setting is None else getattr(settings, setting), pruned=setting is not None,
            deleted_total=record.totals.get(name, 0) if record else 0,
            deleted_last=record.last.get(name, 0) if record else 0)
        for name, (model, setting) in TABLES.items()}
    at = None if record is None or record.at_ms is None else datetime_of_score(record.at_ms)
    return Storage(tables=tables, last_prune_at=at)
