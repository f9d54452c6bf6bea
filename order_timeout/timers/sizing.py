"""How many members a consumer claims of each kind: its most, fewer after a batch given up for time.

``BATCH_TIME_LIMIT`` gives up a batch still running that long after its claim,
and the next claim takes it over whole. A batch of slow but healthy receivers
(an ERP that answers in 150 ms on Black Friday) is given up every time: the
same number of members, the same receivers, the same overrun, for ever. So a
batch given up for time makes this consumer claim half of what that batch got
done (its receivers' own pace, measured by the ``progress`` each act reports),
or half as many when it got nothing done (a hung receiver, one slow batch
receiver); every lane of that kind follows. A full batch that finishes within a
quarter of the limit doubles the claims again, up to the kind's most: a
batch of twice its size would still end within half the limit. A hung
receiver is given up as before; the smaller batches only keep what is healthy
from overrunning with it. Each consumer learns for itself: nothing is shared,
nothing outlives the process.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

logger = logging.getLogger("order_timeout")

# A full batch that took at most this share of BATCH_TIME_LIMIT lets the claims double.
WELL_INSIDE = 0.25


class BatchSizes:
    """``limit(lane)``: how many members the next claim of ``lane`` takes; ``finished`` teaches it.
    The consumer's own thread asks and teaches: no lock."""

    def __init__(self, most: Sequence[int], kinds: Sequence[str], time_limit: float) -> None:
        # Per lane: its kind's name (the lanes of a kind share a size) and that kind's most.
        self._kind_of_lane = list(kinds)
        self._most = dict(zip(kinds, most, strict=True))
        self._limit = dict(self._most)
        self.time_limit = time_limit

    def limit(self, lane: int) -> int:
        return self._limit[self._kind_of_lane[lane]]

    def finished(self, lane: int, *, claimed: int, seconds: float, given_up: bool, done: int) -> None:
        """A batch of ``claimed`` members of ``lane`` ended ``seconds`` after its claim; ``given_up``
        for time, with ``done`` of them acted on (and rolled back) by then."""
        kind = self._kind_of_lane[lane]
        before = self._limit[kind]
        if given_up:
            after = max(1, min(before // 2, done // 2) if done else before // 2)
        elif claimed >= before and seconds <= WELL_INSIDE * self.time_limit:
            after = min(self._most[kind], 2 * before)
        else:
            return
        self._limit[kind] = after
        if given_up and after < before:
            logger.warning("%s: a batch of %d was given up for time with %d done: claiming at most %d from "
                           "now on, more again once batches finish well inside BATCH_TIME_LIMIT (%gs).",
                           kind, claimed, done, after, self.time_limit)
        elif after == self._most[kind] and before < after:
            logger.info("%s: batches finish well inside BATCH_TIME_LIMIT again: claiming up to %d.", kind, after)
