"""How each kind of timer reads to people: its name in log lines, its outcomes' words, its metrics.

The engine's kinds (timers/kind.py) say what they do; what a log line, a report or a metric calls
it is here, in one place per kind: the app's three, and a shop's timer by its name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Wording:
    # Its name in every log line and report: "close", "reminders", "notices", a timer's name.
    label: str
    # What the lifecycle is doing, in a log line ("closing"); "acting on <label>" if not said.
    doing: str = ""
    # The report's outcomes in its own words (its log line, ``stats.closed``): "acted" -> "closed".
    outcomes: Mapping[str, str] = field(default_factory=dict)
    # How a give-up reads: "... dead-lettered without another try", "next=dead-letter", "3 dead letter(s)".
    give_up_verb: str = "dead-lettered"
    give_up_next: str = "dead-letter"
    give_up_record: str = "dead letter(s)"
    # Which family of metrics counts its outcomes ("closes", "reminders", or "timers", by name), and
    # the outcome labels of that family where they differ from reporting.metrics.outcome_counts's.
    metric_family: str = "timers"
    metric_labels: Mapping[str, str] = field(default_factory=dict)
    # Its batch's log line starts with its label; the line's fields go in ``record.<log_extra>``.
    log_extra: str = "timer"

    def __post_init__(self) -> None:
        if not self.doing:
            object.__setattr__(self, "doing", f"acting on {self.label}")


# The outcomes every family of metrics names alike (the rest each family names its own way).
_SHARED_METRIC_LABELS = {"not_due": "rescheduled", "busy": "busy", "failed": "failed", "dropped": "dropped",
                         "abandoned": "abandoned"}

CLOSES = Wording(
    label="close", doing="closing", log_extra="batch",
    outcomes={"acted": "closed", "settled": "skipped_paid", "given_up": "dead_lettered"},
    # order_timeout_closes_total{outcome} (unchanged since 0.1).
    metric_family="closes",
    metric_labels={**_SHARED_METRIC_LABELS, "acted": "closed", "settled": "settled", "held": "held",
                   "given_up": "dead_lettered"},
)

REMINDERS = Wording(
    label="reminders", doing="sending reminders", log_extra="reminders",
    outcomes={"acted": "sent", "settled": "done", "passed": "held", "given_up": "given_up"},
    give_up_verb="given up", give_up_next="give-up", give_up_record="failed reminder record(s)",
    # order_timeout_reminders_total{outcome} (unchanged since 0.2).
    metric_family="reminders",
    metric_labels={**_SHARED_METRIC_LABELS, "acted": "sent", "settled": "done", "passed": "held",
                   "given_up": "given_up"},
)

NOTICES = Wording(
    label="notices", doing="delivering notices", log_extra="notices",
    outcomes={"acted": "delivered", "settled": "done", "given_up": "dead_lettered"},
)
