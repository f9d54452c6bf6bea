"""Reads that decide what to act on go to the primary: a replica's lag would show rows as they were."""

from __future__ import annotations

from typing import Any

from django.db import router


def on_primary(model: Any) -> Any:
    """``model``'s default manager on the database its writes go to (never a replica a router
    names for reads: the scan would not see a dead letter written a moment ago)."""
    return model._default_manager.db_manager(router.db_for_write(model))
