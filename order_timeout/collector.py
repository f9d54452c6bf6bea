"""Python's full garbage collections kept out of the consumer's batches.

A consumer process allocates most of what it will ever hold while it starts
(Django, the apps, the models, the compiled statements); a full (generation
2) collection then walks all of it, 45 to 65 ms each time in a burst, and
CPython starts one wherever an allocation tips the count: often inside a
batch, whose rows stay locked and whose lease runs on meanwhile. So the
command's consumer (``run_timeout_consumer``) freezes what its start-up
allocated (``gc.freeze``: never walked again), leaves the younger
generations to CPython, and runs the full pass itself between two batches,
as often as CPython would have asked for one at most (every
``threshold2``-th collection of generation 1). Only for a process that does
nothing else: ``stop`` gives the thresholds back.
"""

from __future__ import annotations

import gc

# The third threshold while the consumer keeps full passes to itself: never reached.
NEVER = 1 << 30


class FullCollections:
    """``start`` when the loop starts, ``between_batches`` after each batch, ``stop`` when it ends."""

    def __init__(self) -> None:
        self.kept: tuple[int, int, int] | None = None
        # Full passes run between batches, for the consumer's figures and its tests.
        self.ran = 0

    def start(self) -> None:
        if self.kept is not None:
            return
        gc.collect()  # what start-up left for the collector, not frozen with the rest
        gc.freeze()
        self.kept = gc.get_threshold()
        gc.set_threshold(self.kept[0], self.kept[1], NEVER)

    def between_batches(self) -> None:
        """A full pass now, if generation 1 was collected as often as CPython waits for between two."""
        if self.kept is not None and gc.get_count()[2] >= max(1, self.kept[2]):
            gc.collect(2)
            self.ran += 1

    def stop(self) -> None:
        if self.kept is None:
            return
        gc.set_threshold(*self.kept)
        gc.unfreeze()
        self.kept = None
