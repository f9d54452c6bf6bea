"""Celery entry points: thin wrappers over the compensation scan."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from .compensation import compensate as run_compensation


@shared_task(name="order_timeout.tasks.compensate")
def compensate(rebuild: bool = False) -> dict[str, Any]:
    """Close orders the Redis trigger missed (or, with ``rebuild``, refill Redis); returns counts."""
    return run_compensation(rebuild=rebuild).as_dict()
