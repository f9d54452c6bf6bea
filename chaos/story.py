"""What a scenario hands back: its cohorts, what each must come to, the bound, and extra checks."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .bounds import Bound


class Expect(enum.Enum):
    """What every order of a cohort must have come to once the fault healed."""

    # Closed, its order_expired delivered (and committed) exactly once.
    CLOSED = "closed"
    # Closed, or still unpaid with an open dead letter: its receiver refuses the close.
    CLOSED_OR_DEAD = "closed or dead letter"
    # Paid (the payment won) or closed (the deadline won: refund).
    PAID_OR_CLOSED = "paid or closed"
    # Paid, never closed: a payment that was in flight at the deadline held the order.
    PAID = "paid"
    # Unpaid and open at the end, never closed: its payment is still in flight.
    HELD = "unpaid and open (held)"
    # The row is gone (deleted); nothing is owed but at most one delivery.
    DELETED = "deleted"


@dataclass(frozen=True)
class Cohort:
    """Orders counted together (by their ``Role.cohort``), held to one expectation and one bound."""

    name: str
    expect: Expect
    bound: Bound | None


@dataclass(frozen=True)
class KindCohort:
    """Rows of one of the shop's declared timers counted together (by their ``TimerRole.cohort``)."""

    timer: str
    name: str
    # True: acted on by the timer exactly once; False: never (the shop settled it first);
    # None: one or the other (a move raced the deadline), never both.
    acted: bool | None
    # What every row must have come to, in words (the table's "must end").
    expect: str
    bound: Bound | None
    # The bound runs from the later of the deadline and this move of the shop (``ShopMove``):
    # the moment a hold ended.
    heal_move: str | None = None

    @property
    def label(self) -> str:
        return f"{self.timer}: {self.name}"


@dataclass(frozen=True)
class Check:
    """One scenario-specific invariant, already decided."""

    name: str
    ok: bool
    detail: str = ""
    # A lateness bound, not a correctness invariant: --quick reports it, and fails
    # only on the others (CI machines vary; a quick run's few hundred orders say
    # little about a tail).
    timing: bool = False


@dataclass
class Story:
    cohorts: list[Cohort]
    # When the fault ended (Redis answered again, the database restarted); None: the
    # consumers heal it themselves and every bound runs from the deadline.
    heal_at: datetime | None = None
    checks: list[Check] = field(default_factory=list)
    # Figures worth a line in the report (kills, payments won and lost, ...).
    facts: dict[str, Any] = field(default_factory=dict)
    # Orders whose members rightly stay in Redis at the end: held by a payment still
    # in flight, looked at again every HOLD_RECHECK. Redis drains of everything else.
    held: list[int] = field(default_factory=list)
    # The rows of the shop's declared timers, judged as the orders are (``every-kind``).
    kinds: list[KindCohort] = field(default_factory=list)
