"""An optional trace of which process locked which orders when (``scripts/chaos --trace``).

Only for finding out why an order was late: every consumer started with
CHAOS_TRACE_DIR appends one line per locking statement on the order table
(time, pid, the ids) to a file of its own. Nothing is counted from it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.db.backends.signals import connection_created


def _trace_locks(execute: Callable[..., Any], sql: str, params: Any, many: bool,
                 context: dict[str, Any]) -> Any:
    from order_timeout import get_order_model

    result = execute(sql, params, many, context)
    if "FOR UPDATE" in sql and params and get_order_model()._meta.db_table in sql:
        ids = " ".join(str(value) for value in params if isinstance(value, int))
        path = Path(os.environ["CHAOS_TRACE_DIR"]) / f"trace-{os.getpid()}.log"
        with path.open("a") as out:
            out.write(f"{time.time():.3f} {os.getpid()} locked {ids}\n")
    return result


def _watch(sender: Any, connection: Any, **kwargs: Any) -> None:
    if _trace_locks not in connection.execute_wrappers:
        connection.execute_wrappers.append(_trace_locks)


def install_if_asked() -> None:
    if os.environ.get("CHAOS_TRACE_DIR"):
        connection_created.connect(_watch, dispatch_uid="chaos.tracing")
