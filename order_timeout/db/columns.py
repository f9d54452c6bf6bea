"""Columns a bare ``UPDATE`` would leave stale: the model's ``auto_now`` fields."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import models


def auto_now_values(model: Any, now: datetime) -> dict[str, Any]:
    """The model's ``auto_now`` fields at ``now`` (a date field gets its date), as ``save()`` would
    write them: a shop's ``last_modified``, which its API may sync on, moves with an act too."""
    return {field.name: now.date() if type(field) is models.DateField else now
            for field in model._meta.concrete_fields
            if isinstance(field, models.DateField) and getattr(field, "auto_now", False)}
