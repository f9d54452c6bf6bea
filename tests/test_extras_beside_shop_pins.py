"""The extras install beside what a shop pins already: pip resolves them, installing nothing.

Reported on issue 25: a shop with Celery on ``kombu==5.6.*`` and ``redis==7.4.*``
could not add the ``celery`` extra, which asked for ``celery[redis]``: Celery's
Redis extra is kombu's, and kombu 5.6's caps redis-py below 6.5. pip then
either gave up or went back to a Celery older than the shop's kombu. The app
talks to Redis through redis-py and django-redis, its own dependencies, and
needs no broker's client from Celery.

These tests ask the package index (PyPI), and nothing else on the network.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

PROJECT = Path(__file__).resolve().parents[1]
# What a shop on Celery 5.6 pins (Celery 5.6 is the first to take kombu 5.6).
SHOP_PINS = ["kombu==5.6.*", "redis==7.4.*"]


def resolve(tmp_path: Path, *requirements: str) -> dict[str, Version]:
    """What pip would install for ``requirements`` into an empty environment, name -> version."""
    report = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
         "--report", str(report), *requirements],
        capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    installs: list[dict[str, Any]] = json.loads(report.read_text())["install"]
    return {item["metadata"]["name"].lower(): Version(item["metadata"]["version"]) for item in installs}


@pytest.fixture
def project_copy(tmp_path: Path) -> Path:
    """The project's metadata (pyproject.toml and what it names), copied: building it writes an
    egg-info beside it, which must not land in the working tree."""
    copy = tmp_path / "django-order-timeout"
    copy.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(PROJECT / name, copy / name)
    return copy


def test_the_celery_extra_resolves_beside_a_shops_kombu_and_redis_pins(project_copy, tmp_path):
    picked = resolve(tmp_path, f"{project_copy}[celery]", *SHOP_PINS)

    assert picked["django-order-timeout"] == Version(declared()["version"])
    assert (picked["kombu"].major, picked["kombu"].minor) == (5, 6)
    assert (picked["redis"].major, picked["redis"].minor) == (7, 4)
    # The shop's Celery, not one years older that happens to leave redis-py unbounded.
    assert picked["celery"] >= Version("5.6"), picked["celery"]


def declared() -> dict[str, Any]:
    """The ``[project]`` table of pyproject.toml."""
    project: dict[str, Any] = tomllib.loads((PROJECT / "pyproject.toml").read_text())["project"]
    return project


def declared_extras() -> dict[str, list[Requirement]]:
    return {name: [Requirement(line) for line in lines]
            for name, lines in declared()["optional-dependencies"].items()}


@pytest.mark.parametrize("extra", sorted(declared_extras()))
def test_an_extra_sets_only_a_floor_so_a_shop_may_pin_above_it(extra):
    """A cap or an exact pin in an extra would fight the shop's own pins; a floor is what the
    app's code needs."""
    for requirement in declared_extras()[extra]:
        operators = {spec.operator for spec in requirement.specifier}
        assert operators <= {">="}, f"{extra}: {requirement}"


def test_the_celery_extra_asks_for_no_broker_of_celerys():
    """Celery's broker extras (``celery[redis]``) bring kombu's caps on the broker's client; the
    app's own Redis client is a dependency of the app, not of the extra."""
    (celery,) = declared_extras()["celery"]

    assert celery.name == "celery" and not celery.extras, str(celery)
