"""The queue's Lua scripts: one file each in ``lua/``, loaded once per process, registered once per client."""

from __future__ import annotations

import functools
from importlib import resources

# Every script the queue runs (lua/<name>.lua).
SCRIPT_NAMES = ("schedule", "claim", "forget", "reschedule", "retry", "renew", "move_out", "positions",
                "renew_lock", "release_lock", "quarantine", "take", "heartbeat", "epoch")


@functools.cache
def load_script_source(name: str) -> str:
    """A script's text, read once per process (every create runs the schedule script)."""
    return resources.files("order_timeout.queue").joinpath("lua", f"{name}.lua").read_text("utf-8")


