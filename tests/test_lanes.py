"""Which lane a consumer claims next: round the lanes, a yielding kind's behind the others for a
second at most.

Seen in the benchmark's notices row (issue 26): the notices' lane had every other claim during a
burst of closes, so the burst closed at 0.30x the plain row's rate while each consumer delivered
16 webhooks between two batches of 500 closes. The notices now yield: the closes due go first,
and a notice waits a second at most behind them.
"""

from __future__ import annotations

from order_timeout.queue.lanes import UNKNOWN, YIELD_SECONDS, ShardRota

DUE = 1_000


class Ticks:
    """A clock the test moves (seconds)."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def rota(lanes: int, yielding: set[int] = frozenset(), clock: Ticks | None = None) -> ShardRota:
    return ShardRota(lanes, start=0, yielding=yielding, clock=clock or Ticks())


def due(rota: ShardRota, *lanes: int) -> None:
    """Only ``lanes`` have something due; the others are empty."""
    rota.refreshed({lane: (DUE if lane in lanes else None) for lane in range(rota.count)})


def test_lanes_take_turns_when_none_yields():
    lanes = rota(3)
    due(lanes, 0, 1, 2)

    assert [lanes.next_due(DUE) for _ in range(6)] == [0, 1, 2, 0, 1, 2]


def test_a_yielding_lane_waits_while_another_lane_is_due():
    clock = Ticks()
    lanes = rota(2, yielding={1}, clock=clock)
    due(lanes, 0, 1)

    assert [lanes.next_due(DUE) for _ in range(5)] == [0, 0, 0, 0, 0]


def test_a_yielding_lane_is_claimed_once_it_waited_long_enough_even_behind_a_burst():
    clock = Ticks()
    lanes = rota(2, yielding={1}, clock=clock)
    due(lanes, 0, 1)
    assert lanes.next_due(DUE) == 0

    clock.now += YIELD_SECONDS / 2
    assert lanes.next_due(DUE) == 0
    clock.now += YIELD_SECONDS / 2
    assert lanes.next_due(DUE) == 1
    # Then it waits again, a full YIELD_SECONDS from the next time it is passed over.
    assert lanes.next_due(DUE) == 0
    clock.now += YIELD_SECONDS / 2
    assert lanes.next_due(DUE) == 0
    clock.now += YIELD_SECONDS / 2
    assert lanes.next_due(DUE) == 1


def test_a_yielding_lane_that_was_idle_still_waits_behind_a_burst():
    clock = Ticks()
    lanes = rota(2, yielding={1}, clock=clock)
    due(lanes, 0)
    clock.now += 60  # nothing to deliver for a minute
    assert lanes.next_due(DUE) == 0

    due(lanes, 0, 1)  # a burst's first notices

    assert lanes.next_due(DUE) == 0


def test_a_yielding_lane_is_claimed_at_once_when_no_other_lane_is_due():
    lanes = rota(3, yielding={2})
    due(lanes, 2)

    assert lanes.next_due(DUE) == 2
    assert lanes.next_due(DUE) == 2


def test_a_lane_not_known_yet_is_asked_and_a_yielding_one_after_the_others():
    lanes = rota(3, yielding={0})

    assert lanes._next == [UNKNOWN] * 3
    assert [lanes.next_due(DUE) for _ in range(3)] == [1, 2, 1]
