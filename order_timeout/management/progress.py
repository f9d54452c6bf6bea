"""The commands' progress bar, ``[####....] done/total``, drawn on a terminal and nowhere else.

The compensation scan, a re-date and a backfill walk their tables a chunk at a
time and call ``progress(done, total)`` after each. On a terminal the bar is
redrawn in place; into a pipe or a log file nothing is drawn, so what a cron
job mails is the summary alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.core.management.base import OutputWrapper

from ..scans.compensation import Progress

WIDTH = 30


class ProgressBar:
    """One line, redrawn after a carriage return until ``end()`` ends it."""

    def __init__(self, out: OutputWrapper, width: int = WIDTH) -> None:
        self.out = out
        self.width = width
        self.drawn = False

    def draw(self, done: int, total: int) -> None:
        # A total counted before the walk may fall behind rows added meanwhile: never past full.
        filled = min(self.width, self.width * done // total) if total else self.width
        self.out.write(f"\r[{'#' * filled}{'.' * (self.width - filled)}] {done}/{total}", ending="")
        self.out.flush()
        self.drawn = True

    def end(self) -> None:
        """End the bar's line, so what is written next (the summary, an error) starts its own."""
        if self.drawn:
            self.out.write("")
            self.drawn = False


@contextmanager
def terminal_progress(out: OutputWrapper, *, wanted: bool = True) -> Iterator[Progress | None]:
    """A ``progress`` callback drawing on ``out`` when it is a terminal (and ``wanted``: not for
    ``--json``, which a machine reads), else None; the bar's line ends on the way out, error or not."""
    if not (wanted and out.isatty()):
        yield None
        return
    bar = ProgressBar(out)
    try:
        yield bar.draw
    finally:
        bar.end()
