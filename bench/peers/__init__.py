"""The queues a Django shop would pick instead of this app, as benchmark rows (issue 21).

Each module here names its ``System`` subclasses in ``SYSTEMS`` (a tuple: a
peer at its documented settings, and at a tuned value of the knob that decides
its latency, are two rows); they are found by module, so a peer is added by adding its file. Their packages are
in the ``bench`` dependency group and imported only when the row runs. They
run in the full benchmark only (``full_only``): ``--quick`` (CI) leaves them
out unless ``--systems`` names them.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

# The peers' workloads (``System.limits``): they publish a job in 0.3 to 5 ms and close 70 to 200
# orders a second here, so the full run's 60,000-order stream and 100,000-order burst would take
# each of them most of an hour to publish and to drain. Rates (closes/s, CPU per close) and
# lateness read the same at these sizes; each peer's row says its sizes.
PEER_LIMITS: dict[str, float] = {"steady_seconds": 10, "burst": 10_000, "crash": 2_000, "idle": 20_000,
                                 "celery_idle": 2_000}


def peer_systems() -> list[Any]:
    """Every peer module's ``SYSTEMS``, in module-name order."""
    found: list[Any] = []
    for module in sorted(info.name for info in pkgutil.iter_modules(__path__)):
        found += getattr(importlib.import_module(f"{__name__}.{module}"), "SYSTEMS", ())
    return found
