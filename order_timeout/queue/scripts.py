"""The queue's Lua scripts: one file each in ``lua/``, loaded once per process, registered once per client."""

from __future__ import annotations

import functools
from importlib import resources

# Every script the queue runs (lua/<name>.lua).
SCRIPT_NAMES = ("schedule", "claim", "forget", "reschedule", "retry", "renew", "move_out", "positions",
                "renew_lock", "release_lock", "quarantine", "take", "heartbeat", "epoch", "job_turn", "job_done")


# A script's line that stands for a shared part of several scripts (lua/lib/<name>.lua).
INCLUDE = "--!include "


@functools.cache
def load_script_source(name: str) -> str:
    """A script's text, read once per process (every create runs the schedule script), with each
    ``--!include <part>`` line replaced by lua/lib/<part>.lua."""
    lua = resources.files("order_timeout.queue").joinpath("lua")
    lines = lua.joinpath(f"{name}.lua").read_text("utf-8").splitlines(keepends=True)
    return "".join(lua.joinpath("lib", f"{line.removeprefix(INCLUDE).strip()}.lua").read_text("utf-8")
                   if line.startswith(INCLUDE) else line for line in lines)


