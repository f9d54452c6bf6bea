"""Which lane a consumer claims next: round the lanes, a yielding kind's behind a backlog for a
second at most.

Seen in the benchmark's notices row (issue 26): the notices' lane had every other claim during a
burst of closes, so the burst closed at 0.30x the plain row's rate while each consumer delivered
16 webhooks between two batches of 500 closes. The notices now yield to a backlog (a lane whose
last claim came back full): the burst goes first, and a notice waits a second at most behind it.
Seen in the fault run ``notices`` when they yielded to any due lane: a killed consumer's notices,
taken over one a claim while orders fell due all the time, came a second apart (latest 5.72 s
after its close, against a 5 s bound). With a trickle they take turns.
"""

from __future__ import annotations

from order_timeout.queue import Claim
from order_timeout.queue.lanes import UNKNOWN, YIELD_SECONDS, ShardRota

DUE = 1_000


class Ticks:
    """A clock the test moves (seconds)."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def rota(lanes: int, yielding: set[int] = frozenset(), clock: Ticks | None = None,
         gathering: dict[int, int] | None = None) -> ShardRota:
    return ShardRota(lanes, start=0, yielding=yielding, clock=clock or Ticks(), gathering=gathering or {})


def due(rota: ShardRota, *lanes: int) -> None:
    """Only ``lanes`` have something due; the others are empty."""
    rota.refreshed({lane: (DUE if lane in lanes else None) for lane in range(rota.count)})


def backlog(rota: ShardRota, lane: int) -> None:
    """``lane``'s last claim came back full: more is due there at once."""
    rota.claimed(lane, Claim(members=["1"]), full=True)


def claim(rota: ShardRota, full: bool = False) -> int:
    """Claim the next lane due; it comes back full or not, and stays due."""
    lane = rota.next_due(DUE)
    assert lane is not None
    rota.claimed(lane, Claim(members=["1"]), full=full)
    return lane


def test_lanes_take_turns_when_none_yields():
    lanes = rota(3)
    due(lanes, 0, 1, 2)

    assert [lanes.next_due(DUE) for _ in range(6)] == [0, 1, 2, 0, 1, 2]


def test_a_yielding_lane_waits_while_another_lane_has_a_backlog():
    lanes = rota(2, yielding={1})
    due(lanes, 0, 1)
    backlog(lanes, 0)

    assert [claim(lanes, full=True) for _ in range(5)] == [0, 0, 0, 0, 0]


def test_a_yielding_lane_takes_turns_with_a_trickle():
    """A steady stream, or a dead consumer's members taken over one a claim: no backlog."""
    lanes = rota(2, yielding={1})
    due(lanes, 0, 1)

    assert [claim(lanes) for _ in range(4)] == [0, 1, 0, 1]


def test_a_yielding_lane_is_claimed_once_it_waited_long_enough_even_behind_a_burst():
    clock = Ticks()
    lanes = rota(2, yielding={1}, clock=clock)
    due(lanes, 0, 1)
    backlog(lanes, 0)
    assert claim(lanes, full=True) == 0

    clock.now += YIELD_SECONDS / 2
    assert claim(lanes, full=True) == 0
    clock.now += YIELD_SECONDS / 2
    assert claim(lanes, full=True) == 1
    # Then it waits again, a full YIELD_SECONDS from the next time it is passed over.
    assert claim(lanes, full=True) == 0
    clock.now += YIELD_SECONDS / 2
    assert claim(lanes, full=True) == 0
    clock.now += YIELD_SECONDS / 2
    assert claim(lanes, full=True) == 1


def test_a_yielding_lane_that_was_idle_still_waits_behind_a_burst():
    clock = Ticks()
    lanes = rota(2, yielding={1}, clock=clock)
    due(lanes, 0)
    clock.now += 60  # nothing to deliver for a minute
    assert claim(lanes, full=True) == 0

    due(lanes, 0, 1)  # a burst's first notices

    assert claim(lanes, full=True) == 0


def test_a_yielding_lane_goes_as_soon_as_the_burst_ends():
    lanes = rota(2, yielding={1})
    due(lanes, 0, 1)
    backlog(lanes, 0)
    assert claim(lanes) == 0  # the burst's last claim: not full

    assert claim(lanes) == 1


def test_a_yielding_lane_is_claimed_at_once_when_no_other_lane_is_due():
    lanes = rota(3, yielding={2})
    due(lanes, 2)

    assert lanes.next_due(DUE) == 2
    assert lanes.next_due(DUE) == 2


def test_lanes_not_known_yet_are_asked_in_turn():
    lanes = rota(3, yielding={0})

    assert lanes._next == [UNKNOWN] * 3
    assert [lanes.next_due(DUE) for _ in range(3)] == [0, 1, 2]


def test_a_wake_up_that_comes_while_a_claim_is_answered_is_not_written_over():
    """The listener's thread wakes a lane between the claim's reply (empty) and the consumer
    noting it: the lane stays to be asked again, not "empty" until MAX_WAIT."""
    lanes = rota(2)
    due(lanes, 0)
    asked = lanes.wakes()
    assert lanes.next_due(DUE) == 0

    lanes.woke(0)
    lanes.claimed(0, Claim(members=[], next_score=None), since=asked)

    assert lanes.next_due(DUE) == 0


def test_a_wake_up_that_comes_while_every_lane_is_refreshed_is_not_written_over():
    lanes = rota(2)
    asked = lanes.wakes()

    lanes.woke(1)
    lanes.refreshed({0: None, 1: None}, since=asked)

    assert lanes.next_due(DUE) == 1 and lanes.earliest() == UNKNOWN


def test_a_claim_with_no_wake_up_since_it_was_asked_notes_its_answer():
    lanes = rota(1)
    due(lanes, 0)
    asked = lanes.wakes()
    lanes.next_due(DUE)

    lanes.claimed(0, Claim(members=[], next_score=5_000), since=asked)

    assert lanes.next_due(DUE) is None and lanes.earliest() == 5_000


def test_a_gathering_lane_lets_its_due_members_gather_between_claims():
    """The reminders gather (``Kind.gathers``): after a claim that did not come back full, their
    lane is due again only when its gathering time has passed, and the closes' lanes go on.

    Seen in the benchmark's steady load with one reminder per order on PostgreSQL: each consumer
    took turns between a close batch and a reminder batch of about five members (5 ms each), so
    a close waited behind a reminder batch every time and the closes' p99 was 2.6x the plain
    row's (19.6 against 7.5 ms)."""
    lanes = rota(2, gathering={1: 50})
    due(lanes, 0, 1)
    assert lanes.next_due(DUE) == 0
    lanes.claimed(0, Claim(members=["1"]), at=DUE)
    assert lanes.next_due(DUE) == 1
    lanes.claimed(1, Claim(members=["1"]), at=DUE)

    assert [lanes.next_due(DUE + 49) for _ in range(2)] == [0, 0]
    assert lanes.next_due(DUE + 50) in (0, 1) and lanes.has_due(DUE + 50)
    gathering = rota(1, gathering={0: 50})
    due(gathering, 0)
    gathering.next_due(DUE)
    gathering.claimed(0, Claim(members=["1"]), at=DUE)
    assert gathering.next_due(DUE + 49) is None and gathering.earliest() == DUE + 50
    assert gathering.next_due(DUE + 50) == 0


def test_a_gathering_lane_with_a_backlog_is_claimed_again_at_once():
    lanes = rota(1, gathering={0: 50})
    due(lanes, 0)
    lanes.next_due(DUE)

    lanes.claimed(0, Claim(members=["1"] * 3), full=True, at=DUE)

    assert lanes.next_due(DUE) == 0


def test_a_wake_up_ends_a_gathering_lanes_wait():
    lanes = rota(1, gathering={0: 50})
    due(lanes, 0)
    lanes.next_due(DUE)
    lanes.claimed(0, Claim(members=["1"]), at=DUE)

    lanes.woke(0)

    assert lanes.next_due(DUE) == 0
