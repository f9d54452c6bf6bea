"""How many members a consumer's claims take: fewer after a batch given up for time, back up once
batches finish well inside BATCH_TIME_LIMIT.

Seen when tried (slow but healthy receivers, 20 ms an order, 200 a batch, BATCH_TIME_LIMIT 2 s,
two consumers): every batch was given up after 2 s and taken over whole again; 600 orders due at
once were still 47 short of closed 39 s later, where the receivers' own time is 6 s. A consumer
now claims what it showed it can finish: half of what the given-up batch got done.
"""

from __future__ import annotations

import logging

import pytest

from order_timeout.timers.sizing import BatchSizes

LIMIT = 2.0


def sizes(most: int = 200, kinds: tuple[str, ...] = ("close",)) -> BatchSizes:
    return BatchSizes(most=[most] * len(kinds), kinds=list(kinds), time_limit=LIMIT)


@pytest.mark.parametrize("done, claims_then", [
    (96, 48),
    # Half, not all of what it got done: the next batch ends within about half the limit.
    (190, 95),
    # A receiver hung on its first order, or one slow batch receiver: nothing to measure by.
    (0, 100),
], ids=["half-done", "nearly-all-done", "nothing-done"])
def test_a_batch_given_up_for_time_makes_its_kind_claim_half_of_what_it_got_done_or_half_as_many(
        done, claims_then):
    claims = sizes()

    claims.finished(0, claimed=200, seconds=2.0, given_up=True, done=done)

    assert claims.limit(0) == claims_then


def test_the_claims_never_shrink_below_one():
    claims = sizes()

    for _ in range(20):
        claims.finished(0, claimed=claims.limit(0), seconds=2.0, given_up=True, done=1)

    assert claims.limit(0) == 1


def test_full_batches_well_inside_the_limit_grow_the_claims_back_to_the_kinds_most():
    claims = sizes()
    claims.finished(0, claimed=200, seconds=2.0, given_up=True, done=20)
    grown = []

    for _ in range(6):
        claims.finished(0, claimed=claims.limit(0), seconds=LIMIT / 5, given_up=False, done=claims.limit(0))
        grown.append(claims.limit(0))

    assert grown == [20, 40, 80, 160, 200, 200]


def test_a_batch_that_was_not_full_or_took_a_good_part_of_the_limit_does_not_grow_the_claims():
    claims = sizes()
    claims.finished(0, claimed=200, seconds=2.0, given_up=True, done=100)

    claims.finished(0, claimed=12, seconds=0.01, given_up=False, done=12)
    claims.finished(0, claimed=50, seconds=LIMIT / 2, given_up=False, done=50)

    assert claims.limit(0) == 50


def test_every_lane_of_a_kind_shares_its_claims_and_the_other_kinds_keep_theirs():
    claims = BatchSizes(most=[200, 200, 100], kinds=["close", "close", "notices"], time_limit=LIMIT)

    claims.finished(1, claimed=200, seconds=2.0, given_up=True, done=60)

    assert [claims.limit(lane) for lane in range(3)] == [30, 30, 100]


def test_shrinking_says_so_once_in_one_line_and_growing_back_to_the_most_says_so_too(caplog):
    claims = sizes()
    caplog.set_level(logging.INFO, logger="order_timeout")

    claims.finished(0, claimed=200, seconds=2.0, given_up=True, done=150)
    for _ in range(3):
        claims.finished(0, claimed=claims.limit(0), seconds=0.1, given_up=False, done=claims.limit(0))

    lines = [(record.levelname, record.getMessage()) for record in caplog.records]
    assert lines == [
        ("WARNING", "close: a batch of 200 was given up for time with 150 done: claiming at most 75 "
                    "from now on, more again once batches finish well inside BATCH_TIME_LIMIT (2s)."),
        ("INFO", "close: batches finish well inside BATCH_TIME_LIMIT again: claiming up to 200."),
    ]
