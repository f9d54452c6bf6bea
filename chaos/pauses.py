"""A consumer that stops at a chosen point: frozen (SIGSTOP) once per order, or slowed before locking.

A SIGSTOP is the same whoever sends it; sent by the process itself, it lands
exactly where the scenario wants it: right after a claim (before the rows are
locked) or inside the closing transaction. Only processes started with
CHAOS_PAUSE_DIR pause (the consumers of the freeze scenario), and each order
pauses one process once: a marker file, created exclusively, says it did.
The harness sees the stopped process in /proc and sends SIGCONT later.

CHAOS_LOCK_DELAY (seconds) makes every batch wait that long between its
claim and the statement that locks its rows: the window in which the
deletes scenario deletes rows whose members are leased.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.db.backends.signals import connection_created

# The "IN (3, 41, 5)" of a locking statement whose keys are integers.
_INLINE_KEYS = re.compile(r"\bIN \(([0-9]+(?:, ?[0-9]+)*)\)")


def pause_once(order_id: Any, where: str) -> None:
    """SIGSTOP this process, unless some process already paused ``where`` for this order."""
    directory = os.environ.get("CHAOS_PAUSE_DIR")
    if not directory:
        return
    try:
        marker = os.open(Path(directory) / f"{where}-{order_id}", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    os.write(marker, str(os.getpid()).encode())
    os.close(marker)
    os.kill(os.getpid(), signal.SIGSTOP)


def _pause_before_locking(execute: Callable[..., Any], sql: str, params: Any, many: bool,
                          context: dict[str, Any]) -> Any:
    """Before the closing transaction locks its rows: the claim is made, nothing is locked yet."""
    from order_timeout import get_order_model

    from .models import Role

    if "FOR UPDATE" in sql and get_order_model()._meta.db_table in sql:
        time.sleep(float(os.environ.get("CHAOS_LOCK_DELAY", 0)))
        if os.environ.get("CHAOS_PAUSE_DIR"):
            # Integer keys of a batch are written into the statement as digits (db/keys.py, KeysIn);
            # other keys, and a batch of one, come as parameters.
            ids = [value for value in params or () if isinstance(value, int)]
            ids += [int(digits) for found in _INLINE_KEYS.findall(sql) for digits in found.split(",")]
            chosen = Role.objects.filter(order_id__in=ids, behaviour=Role.Behaviour.PAUSE_AFTER_CLAIM)
            for order_id in chosen.values_list("order_id", flat=True):
                pause_once(order_id, "claim")
    return execute(sql, params, many, context)


def _watch(sender: Any, connection: Any, **kwargs: Any) -> None:
    if _pause_before_locking not in connection.execute_wrappers:
        connection.execute_wrappers.append(_pause_before_locking)


def install_if_asked() -> None:
    """Watch every new database connection of this process, if it was started to stop somewhere."""
    if os.environ.get("CHAOS_PAUSE_DIR") or os.environ.get("CHAOS_LOCK_DELAY"):
        connection_created.connect(_watch, dispatch_uid="chaos.pauses")
