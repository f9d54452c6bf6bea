"""Every command the README shows, run as written (on the test project) against the real servers.

The README is part of the product: a command that fails as printed there
fails a user first. Each test takes its command from README.md itself, so
the text and the test cannot drift apart.
"""

from __future__ import annotations

import re
import shlex
import urllib.request
from pathlib import Path

import pytest

from .conftest import PROJECT_ROOT, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

README = (PROJECT_ROOT / "README.md").read_text()


def readme_command(pattern: str) -> list[str]:
    """The one indented command line of the README that matches ``pattern``, as arguments."""
    found = [line.strip() for line in README.splitlines()
             if line.startswith("    ") and re.search(pattern, line)]
    assert len(found) == 1, f"README commands matching {pattern!r}: {found}"
    return shlex.split(found[0].split("#")[0])


def manage_arguments(command: list[str]) -> list[str]:
    """``python manage.py x --y`` -> ``["x", "--y"]``."""
    assert command[:2] == ["python", "manage.py"], command
    return command[2:]


def scrape(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
            return response.read().decode()
    except OSError:
        return ""


def test_the_metrics_command_serves_on_its_default_address(consumer_process, make_order):
    """``run_timeout_consumer --metrics-port 9464``, with no --metrics-address, as the README shows it."""
    words = re.search(r"`(run_timeout_consumer --metrics-port \d+)`", README)
    assert words, "the README no longer shows the metrics command"
    arguments = words.group(1).split()
    port = int(arguments[-1])
    make_order(in_seconds=-1)

    worker = consumer_process(*arguments[1:])
    wait_for(lambda: 'order_timeout_closes_total{outcome="closed"} 1.0' in scrape(port)
             or worker.proc.poll() is not None, timeout=120)
    alive = worker.proc.poll() is None
    worker.kill()

    assert alive, worker.proc.stderr.read() if worker.proc.stderr else ""
