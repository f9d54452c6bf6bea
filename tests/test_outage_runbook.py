"""docs/operations.md's runbook "Your payment provider is down": each command it shows, run as written.

The commands are read from the page itself (every ``python manage.py`` line of the section), so a
command the runbook changes or adds without a test here fails first: a runbook is read in an
outage, when a command that does not run as printed costs the most.
"""

from __future__ import annotations

import io
import re
import shlex
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from order_timeout.models import Pause

from .helpers import expiries, state
from .readme import docs_page

pytestmark = pytest.mark.django_db(transaction=True)

RUNBOOK = "## Your payment provider is down\n"
# Each command the runbook shows, by its name and options: what the tests below run.
SHOWN = {
    ("order_timeout_pause", "--timer", "--reason"),
    ("order_timeout_status", "--max-paused"),
    ("order_timeout_resume", "--give-back"),
    ("order_timeout_resume",),
}


def runbook_commands() -> list[list[str]]:
    """The runbook's ``python manage.py`` lines (indented in its numbered steps), as arguments."""
    section = docs_page("operations.md").split(RUNBOOK, 1)[1].split("\n## ", 1)[0]
    lines = [line.strip() for line in section.splitlines() if re.match(r" {4,}python manage\.py ", line)]
    commands = [shlex.split(line) for line in lines]
    assert all(command[:2] == ["python", "manage.py"] for command in commands), commands
    return [command[2:] for command in commands]


def shown(name: str, *options: str) -> list[str]:
    """The one runbook command named ``name`` with exactly these options, as written."""
    found = [command for command in runbook_commands()
             if (command[0], *(word for word in command[1:] if word.startswith("--"))) == (name, *options)]
    assert len(found) == 1, f"{name} {' '.join(options)}: {found}"
    return found[0]


def run(command: list[str]) -> str:
    out = io.StringIO()
    call_command(*command, stdout=out)
    return out.getvalue()


def test_every_command_of_the_runbook_is_one_these_tests_run():
    assert {(command[0], *(word for word in command[1:] if word.startswith("--")))
            for command in runbook_commands()} == SHOWN


def test_the_runbooks_pause_alert_and_give_back_run_as_written(make_order):
    paused = run(shown("order_timeout_pause", "--timer", "--reason"))
    pause = Pause.objects.get(resumed_at__isnull=True)
    assert paused.startswith("Paused close at ") and pause.reason == "PSP outage: 3-D Secure failing"

    # A fresh pause is not forgotten: the alert passes, and the pause is printed first.
    status = run(shown("order_timeout_status", "--max-paused"))
    assert status.startswith("PAUSED close since ")
    # One older than --max-paused is: its own exit status.
    Pause.objects.filter(pk=pause.pk).update(paused_at=timezone.now() - timedelta(hours=2))
    with pytest.raises(CommandError) as forgotten:
        run(shown("order_timeout_status", "--max-paused"))
    assert forgotten.value.returncode == 3

    inside = make_order(in_seconds=-60)       # fell due during the (two-hour) pause
    before = make_order(in_seconds=-3 * 3600)  # due before it: nothing given
    deadlines = {order.pk: type(order).objects.get(pk=order.pk).expires_at for order in (inside, before)}
    resumed = run(shown("order_timeout_resume", "--give-back"))

    pause.refresh_from_db()
    assert pause.resumed_at is not None and "gave" in resumed
    given = timedelta(seconds=pause.given_back_seconds)
    assert type(inside).objects.get(pk=inside.pk).expires_at == deadlines[inside.pk] + given
    assert type(before).objects.get(pk=before.pk).expires_at == deadlines[before.pk]


def test_the_runbooks_resume_without_give_back_closes_what_fell_due_at_once(make_order, consumer):
    run(shown("order_timeout_pause", "--timer", "--reason"))
    due = make_order(in_seconds=-5)
    consumer().run(once=True)
    assert state(due) == "unpaid"

    resumed = run(shown("order_timeout_resume"))
    consumer().run(once=True)

    assert resumed.startswith("Resumed close") and "gave" not in resumed
    assert (state(due), expiries(due)) == ("closed", 1)
