"""The metrics' outcome labels are public (dashboards and alerts match them): each family keeps
the ones it has had since its release, whatever the code that names them."""

from __future__ import annotations

from order_timeout.reporting.wording import CLOSES, REMINDERS


def test_the_closes_outcome_labels_are_those_of_0_1():
    assert dict(CLOSES.metric_labels) == {
        "acted": "closed", "settled": "settled", "not_due": "rescheduled", "busy": "busy", "held": "held",
        "failed": "failed", "given_up": "dead_lettered", "dropped": "dropped", "abandoned": "abandoned"}


def test_the_reminders_outcome_labels_are_those_of_0_2():
    assert dict(REMINDERS.metric_labels) == {
        "acted": "sent", "settled": "done", "passed": "held", "not_due": "rescheduled", "busy": "busy",
        "failed": "failed", "given_up": "given_up", "dropped": "dropped", "abandoned": "abandoned"}
