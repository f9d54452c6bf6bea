"""The README's first step: the demo runs to the end and exits 0, with only what its venv installs."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.conf import settings

from .conftest import PROJECT_ROOT

pytestmark = pytest.mark.slow

# The demo's dependency group has no Celery: run it as if Celery were not installed.
WITHOUT_CELERY = (
    "import sys, runpy; sys.modules['celery'] = None; "
    "runpy.run_module('testproject.demo', run_name='__main__', alter_sys=True)"
)


def test_the_demo_closes_every_due_order_and_cleans_up_without_celery(redis_client):
    """On a shared Redis (the test one) it removes its own keys and leaves the others."""
    env = {**os.environ, "REDIS_URL": settings.CACHES["order_timeout"]["LOCATION"]}
    for name in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL"):
        env.pop(name, None)
    redis_client.set("someone-else", "1")

    demo = subprocess.run([sys.executable, "-c", WITHOUT_CELERY], cwd=PROJECT_ROOT, env=env,
                          capture_output=True, text=True, timeout=120)

    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert " 0 still unpaid" in demo.stdout, demo.stdout
    assert [key.decode() for key in redis_client.keys("*")] == ["someone-else"]
