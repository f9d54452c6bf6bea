"""Every command the README shows, run as written (on the test project) against the real servers,
and the monitoring commands it hands over to docs/operations.md.

The README is part of the product: a command that fails as printed there
fails a user first. Each test takes its command from README.md itself (or
from the page the README links to for it), so the text and the test cannot
drift apart. Not marked slow: they run on MariaDB and PostgreSQL, and on the
newest versions the project allows.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from order_timeout.models import Order
from testproject.demo import stop

from .backends import as_a_shop_configures_it
from .conftest import wait_for
from .parallel import taken_alone
from .readme import docs_page, readme_command, readme_commands, readme_python_blocks

pytestmark = pytest.mark.django_db(transaction=True)


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
    """``run_timeout_consumer --metrics-port 9464``, with no --metrics-address, as docs/operations.md
    shows it (the README's monitoring line leads there)."""
    arguments = manage_arguments(readme_command(r"run_timeout_consumer --metrics-port", docs_page("operations.md")))
    assert arguments[:2] == ["run_timeout_consumer", "--metrics-port"], arguments
    port = int(arguments[-1])
    make_order(in_seconds=-1)

    with taken_alone(f"port {port}"):  # the documented port: one run's test at a time on this machine
        worker = consumer_process(*arguments[1:])
        wait_for(lambda: 'order_timeout_closes_total{outcome="closed"} 1.0' in scrape(port)
                 or worker.proc.poll() is not None, timeout=120)
        alive = worker.proc.poll() is None
        worker.kill()

    assert alive, worker.proc.stderr.read() if worker.proc.stderr else ""


# -- a new project, as the README builds it (scripts/release-check does the same from the wheel)


class Project:
    """A project made by ``django-admin startproject shop``, with the README's lines pasted in."""

    def __init__(self, root: Path, env: dict[str, str]) -> None:
        self.root = root
        self.env = env

    def run(self, command: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        words = shlex.split(command)
        if words[0] == "python":
            words[0] = sys.executable
        elif words[0] == "celery":
            words[:1] = [sys.executable, "-m", "celery"]
        return subprocess.run(words, cwd=self.root, env=self.env, capture_output=True, text=True,
                              timeout=120, **kwargs)

    def start(self, command: str) -> subprocess.Popen[str]:
        words = shlex.split(command)
        words[:1] = [sys.executable] if words[0] == "python" else [sys.executable, "-m", words[0]]
        return subprocess.Popen(words, cwd=self.root, env=self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)

    def shell(self, code: str) -> subprocess.CompletedProcess[str]:
        return self.run("python manage.py shell --no-imports -c " + shlex.quote(code))


@pytest.fixture
def readme_project(tmp_path: Path, redis_client: Any) -> Project:
    from django.conf import settings
    from django.db import connection

    root = tmp_path / "shop-project"
    root.mkdir()
    subprocess.run([sys.executable, "-m", "django", "startproject", "shop", str(root)], check=True)
    blocks = readme_python_blocks()
    settings_py = root / "shop" / "settings.py"
    settings_py.write_text(
        settings_py.read_text()
        + "\n" + blocks["# shop/settings.py"]
        + "\n" + blocks["# shop/settings.py, below the lines above"]
        # What the README leaves to the reader: where this machine's servers are.
        + "\n# -- the test's own database and Redis\n"
        + f"DATABASES = {{'default': {as_a_shop_configures_it(connection.settings_dict)!r}}}\n"
        + f"CACHES['order_timeout']['LOCATION'] = {settings.CACHES['order_timeout']['LOCATION']!r}\n"
        + f"CELERY_BROKER_URL = {settings.CACHES['order_timeout']['LOCATION']!r}\n")
    (root / "shop" / "celery.py").write_text(blocks["# shop/celery.py"])
    env = {key: value for key, value in os.environ.items()
           if key not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL", "PYTHONPATH")}
    return Project(root, env)


def test_a_new_project_with_the_readmes_settings_migrates_checks_and_closes_an_order(readme_project):
    """``startproject``, the README's settings as written, then each of its commands, in order."""
    commands = readme_commands("Use it in your project")
    assert [c.split()[0] for c in commands] == ["pip", "python", "python", "python", "python"], commands
    migrate, check, consume, status = commands[1:5]

    assert (done := readme_project.run(migrate)).returncode == 0, done.stderr
    checked = readme_project.run(check)
    assert checked.returncode == 0, checked.stderr
    ours = [line for line in checked.stderr.splitlines() if "order_timeout." in line]
    # A Redis that persists nothing (as on a test machine) is the one thing worth a warning here.
    assert all("order_timeout.W007" in line for line in ours), ours

    usage = readme_python_blocks()["# anywhere in the shop"]
    assert (used := readme_project.shell(usage)).returncode == 0, used.stderr

    consumer = readme_project.start(consume)
    try:
        due = readme_project.shell(
            "from datetime import timedelta\nfrom django.utils import timezone\n"
            "from order_timeout.models import Order\n"
            "print(Order.objects.create(expires_at=timezone.now() + timedelta(seconds=0.3)).pk)")
        assert due.returncode == 0, due.stderr
        pk = int(due.stdout.split()[-1])
        wait_for(lambda: Order.objects.filter(pk=pk, status="closed").exists()
                 or consumer.poll() is not None, timeout=60)
        assert Order.objects.get(pk=pk).status == "closed"
        # No Celery, no cron: the consumer ran the compensation scan itself, and the status says so.
        wait_for(lambda: readme_project.run(status).returncode == 0 or consumer.poll() is not None,
                 timeout=60)
        shown = readme_project.run(status)
        assert shown.returncode == 0, shown.stdout + shown.stderr
        assert "scan   started" in shown.stdout and "by consumer on" in shown.stdout
    finally:
        consumer.send_signal(signal.SIGTERM)
        output, _ = consumer.communicate(timeout=30)
    assert consumer.returncode == 0, output
    assert "Timeout consumer stopped: 1 closed" in output


def test_the_status_command_runs_as_written_in_a_new_project(readme_project):
    """docs/operations.md's status command, for cron or a health check, in the README's project."""
    status = readme_command(r"order_timeout_status --max-overdue", docs_page("operations.md"))
    assert readme_project.run("python manage.py migrate").returncode == 0

    checked = readme_project.run(" ".join(status))

    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "pending" in checked.stdout


def test_the_readmes_celery_app_and_beat_entry_run_the_scan(readme_project):
    """``celery -A shop worker --beat`` with the README's celery.py and beat entry (here every
    second rather than every 300 s, so the test need not wait five minutes)."""
    worker_command = readme_commands("Using Celery beat as well")[-1]
    settings_py = readme_project.root / "shop" / "settings.py"
    settings_py.write_text(settings_py.read_text()
                           + "CELERY_BEAT_SCHEDULE = {**beat_schedule(interval=1)}\n"
                           + "ORDER_TIMEOUT['COMPENSATION_GRACE'] = 0\n")
    assert readme_project.run("python manage.py migrate").returncode == 0
    overdue = readme_project.shell(
        "from datetime import timedelta\nfrom django.utils import timezone\n"
        "from order_timeout import unschedule\nfrom order_timeout.models import Order\n"
        "order = Order.objects.create(expires_at=timezone.now() - timedelta(seconds=5))\n"
        "unschedule([order])\nprint(order.pk)")  # only the beat's scan can close it
    pk = int(overdue.stdout.split()[-1])
    schedule_file = readme_project.root / "celerybeat-schedule"

    worker = readme_project.start(f"{worker_command} --pool=solo -s {schedule_file}")
    try:
        wait_for(lambda: Order.objects.filter(pk=pk, status="closed").exists()
                 or worker.poll() is not None, timeout=90)
    finally:
        stop(worker)
    assert Order.objects.get(pk=pk).status == "closed", worker.stdout.read() if worker.stdout else ""
